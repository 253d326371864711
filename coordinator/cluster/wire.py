"""What the internal channel's frames hold: msgpack, with every value that is not plain data named by its type.

Members send each other the catalogs' own objects (pydantic requests, proposals, table states, parts, errors).
Unlike pickle, decoding a frame can only build values: plain msgpack data, a few standard types (tuple, set,
UUID, datetime, Decimal, big integers), and instances of the project's own classes, restored from their state
the way pickle would restore them but without calling anything a frame names. A type is accepted only if it is
a class defined in one of the project's packages (`OWN_PACKAGES`); a frame naming anything else (`os:system`,
a builtin, a function) is refused before any of it is used. The one exception is a proposal's clean-up, a
`functools.partial` of a function registered with `crossable` (or of a process-local object's method named in
CROSSABLE_METHODS): it is rebuilt only from that short list.

Process-local objects a proposal refers to (the file IO, the store) travel by name and are replaced by the
receiver's own.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import functools
import importlib
import struct
import types
import uuid
from typing import Any, Callable

import msgpack

from ..crossable import CROSSABLE, CROSSABLE_METHODS

FRAME_HEADER = struct.Struct(">I")  # a frame is its payload's length, then the payload

OWN_PACKAGES = ("coordinator.", "storage.")

# msgpack extension type codes
(_TUPLE, _SET, _FROZENSET, _UUID, _DATETIME, _DATE, _DECIMAL, _BIGINT, _ENUM, _OBJECT, _ERROR, _LOCAL, _NAMEDTUPLE,
 _MAPPINGPROXY, _PARTIAL) = range(1, 16)

# The only code a frame may name: a clean-up a proposal carries to the table's owner (see ..crossable).


class WireError(ValueError):
    """A frame holds something this side will not build (a type outside the project, or an unknown encoding)."""


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


@functools.lru_cache(maxsize=1024)
def _own_class(name: str) -> type:
    """The project's class `module:qualname`, or WireError: nothing outside OWN_PACKAGES is ever looked up."""
    module_name, _, qualname = name.partition(":")
    if not module_name.startswith(OWN_PACKAGES) or not qualname:
        raise WireError(f"refusing to build {name!r}: only the coordinator's own types cross the channel")
    try:
        found: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        raise WireError(f"unknown type {name!r}: is every member running the same coordinator version?") from None
    if not isinstance(found, type):
        raise WireError(f"refusing to build {name!r}: it is not a class")
    return found


class Codec:
    """Encodes and decodes channel messages; the process-local objects in `local` cross by name."""

    def __init__(self, local: dict[str, Any]):
        self._by_name = dict(local)
        self._by_id = {id(obj): name for name, obj in local.items()}
        self._local_classes = {type(obj) for obj in local.values()}
        self._encoders: dict[type, Callable[[Any], msgpack.ExtType]] = {}
        loads = self.loads
        self._decoders: dict[int, Callable[[bytes], Any]] = {
            _LOCAL: self._local, _TUPLE: lambda data: tuple(loads(data)), _SET: lambda data: set(loads(data)),
            _FROZENSET: lambda data: frozenset(loads(data)), _UUID: lambda data: uuid.UUID(bytes=data),
            _DATETIME: lambda data: datetime.datetime.fromisoformat(data.decode()),
            _DATE: lambda data: datetime.date.fromisoformat(data.decode()), _PARTIAL: self._partial,
            _MAPPINGPROXY: lambda data: types.MappingProxyType(loads(data)),
            _DECIMAL: lambda data: decimal.Decimal(data.decode()), _BIGINT: lambda data: int(data.decode()),
            _ENUM: self._enum, _ERROR: self._error, _NAMEDTUPLE: self._namedtuple, _OBJECT: self._object}
        # One packer per nesting level of extension values (a packer cannot be re-entered from its `default`);
        # making a new one for each value was most of the encoding's cost.
        self._packers: list[msgpack.Packer] = []
        self._depth = 0

    # -- encoding ------------------------------------------------------------------------------------------------

    def dumps(self, message: Any) -> bytes:
        depth = self._depth
        if depth == len(self._packers):
            self._packers.append(msgpack.Packer(default=self._default, strict_types=True, datetime=False))
        self._depth = depth + 1
        try:
            return self._packers[depth].pack(message)
        except BaseException:
            self._packers[depth].reset()
            raise
        finally:
            self._depth = depth

    def frame(self, message: Any) -> bytes:
        payload = self.dumps(message)
        return FRAME_HEADER.pack(len(payload)) + payload

    def _default(self, obj: Any) -> msgpack.ExtType:
        cls = type(obj)
        encode = self._encoders.get(cls)
        if encode is None:
            encode = self._encoders[cls] = self._encoder(cls)
        return encode(obj)

    def _encoder(self, cls: type) -> Callable[[Any], msgpack.ExtType]:
        """How values of `cls` are encoded, decided once per class (an isinstance chain, and a failed attribute
        lookup through pydantic's __getattr__, for every value was most of the encoding's cost)."""
        dumps = self.dumps
        if cls in self._local_classes:
            by_id, other = self._by_id, self._own_encoder(cls)

            def local(obj: Any) -> msgpack.ExtType:
                name = by_id.get(id(obj))
                return msgpack.ExtType(_LOCAL, name.encode()) if name is not None else other(obj)
            return local
        if cls is functools.partial:
            return lambda obj: msgpack.ExtType(_PARTIAL, dumps([self._function(obj.func), list(obj.args),
                                                                obj.keywords]))
        if cls is tuple:
            return lambda obj: msgpack.ExtType(_TUPLE, dumps(list(obj)))
        if cls is set or cls is frozenset:
            code = _SET if cls is set else _FROZENSET
            return lambda obj: msgpack.ExtType(code, dumps(list(obj)))
        if issubclass(cls, uuid.UUID):  # asyncpg hands out its own subclass
            return lambda obj: msgpack.ExtType(_UUID, obj.bytes)
        if cls is datetime.datetime:
            return lambda obj: msgpack.ExtType(_DATETIME, obj.isoformat().encode())
        if cls is datetime.date:
            return lambda obj: msgpack.ExtType(_DATE, obj.isoformat().encode())
        if cls is types.MappingProxyType:  # a frozen dict (Delta's catalog entry)
            return lambda obj: msgpack.ExtType(_MAPPINGPROXY, dumps(dict(obj)))
        if cls is decimal.Decimal:
            return lambda obj: msgpack.ExtType(_DECIMAL, str(obj).encode())
        if cls is int:  # beyond msgpack's 64 bits
            return lambda obj: msgpack.ExtType(_BIGINT, str(obj).encode())
        return self._own_encoder(cls)

    def _own_encoder(self, cls: type) -> Callable[[Any], msgpack.ExtType]:
        dumps, name = self.dumps, _name(cls)
        if not cls.__module__.startswith(OWN_PACKAGES):
            def refuse(obj: Any) -> msgpack.ExtType:
                raise TypeError(f"{name} cannot cross the cluster channel: only plain data and the coordinator's "
                                f"own types do")
            return refuse
        if issubclass(cls, enum.Enum):
            return lambda obj: msgpack.ExtType(_ENUM, dumps([name, obj.value]))
        if issubclass(cls, BaseException):
            return lambda obj: msgpack.ExtType(_ERROR, dumps([name, list(obj.args), dict(vars(obj))]))
        if issubclass(cls, tuple):  # a NamedTuple: rebuilt from its fields
            return lambda obj: msgpack.ExtType(_NAMEDTUPLE, dumps([name, list(obj)]))
        if hasattr(cls, "_to_wire"):  # a class that chooses its own form (and rebuilds from it)
            return lambda obj: msgpack.ExtType(_OBJECT, dumps([name, obj._to_wire()]))
        return lambda obj: msgpack.ExtType(_OBJECT, dumps([name, obj.__getstate__()]))

    def _function(self, fn: Any) -> list:
        owner = getattr(fn, "__self__", None)
        if owner is not None and id(owner) in self._by_id and fn.__name__ in CROSSABLE_METHODS:
            return ["method", self._by_id[id(owner)], fn.__name__]
        name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}"
        if CROSSABLE.get(name) is fn:
            return ["function", name]
        raise TypeError(f"{name} cannot cross the cluster channel: register it with coordinator.crossable")

    def _callable(self, ref: list) -> Any:
        if ref[0] == "method" and ref[2] in CROSSABLE_METHODS and ref[1] in self._by_name:
            return getattr(self._by_name[ref[1]], ref[2])
        if ref[0] == "function" and ref[1] in CROSSABLE:
            return CROSSABLE[ref[1]]
        raise WireError(f"refusing to call {ref!r}: not one of the clean-ups that may cross the channel")

    # -- decoding ------------------------------------------------------------------------------------------------

    def loads(self, payload: bytes) -> Any:
        try:
            return msgpack.unpackb(payload, ext_hook=self._ext, strict_map_key=False, timestamp=0, use_list=True)
        except WireError:
            raise
        except (ValueError, TypeError, AttributeError) as exc:  # msgpack's errors are ValueErrors too
            raise WireError(f"malformed frame: {exc}") from None

    def _ext(self, code: int, data: bytes) -> Any:
        decode = self._decoders.get(code)
        if decode is None:
            raise WireError(f"unknown extension type {code} in a frame")
        return decode(data)

    def _local(self, data: bytes) -> Any:
        name = data.decode()
        if name not in self._by_name:
            raise WireError(f"unknown process-local object {name!r}")
        return self._by_name[name]

    def _partial(self, data: bytes) -> functools.partial:
        ref, args, keywords = self.loads(data)
        return functools.partial(self._callable(ref), *args, **keywords)

    def _enum(self, data: bytes) -> enum.Enum:
        name, value = self.loads(data)
        cls = _own_class(name)
        if not issubclass(cls, enum.Enum):
            raise WireError(f"{name!r} is not an enum")
        return cls(value)

    def _error(self, data: bytes) -> Exception:
        name, args, attrs = self.loads(data)
        cls = _own_class(name)
        if not issubclass(cls, Exception):
            raise WireError(f"{name!r} is not an error")
        exc = cls.__new__(cls)
        exc.args = tuple(args)
        vars(exc).update(attrs)
        return exc

    def _namedtuple(self, data: bytes) -> tuple:
        name, fields = self.loads(data)
        cls = _own_class(name)
        if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
            raise WireError(f"{name!r} is not a named tuple")
        return cls(*fields)

    def _object(self, data: bytes) -> Any:
        name, state = self.loads(data)
        return _restorer(name)(state)


@functools.lru_cache(maxsize=1024)
def _restorer(name: str) -> Callable[[Any], Any]:
    """How an instance of our class `name` is rebuilt from its state (`_restore`), decided once per class."""
    cls = _own_class(name)
    if issubclass(cls, (BaseException, enum.Enum, tuple)):
        raise WireError(f"{name!r} cannot be rebuilt from a state")
    from_wire = getattr(cls, "_from_wire", None)
    if from_wire is not None:
        return from_wire
    return functools.partial(_restore, cls, hasattr(cls, "__setstate__"))


def _restore(cls: type, setstate: bool, state: Any) -> Any:
    """Pickle's default rebuild (object.__reduce_ex__ protocol 2) for one of our classes: a bare instance, then
    its own __setstate__ if it has one (pydantic models, slotted dataclasses), else its attributes. (A class with
    its own wire form, `_to_wire`, rebuilds itself from it instead: `_from_wire`.)"""
    obj = cls.__new__(cls)
    if setstate:
        obj.__setstate__(state)
        return obj
    if isinstance(state, tuple) and len(state) == 2:  # (__dict__, slots), as object.__getstate__ gives them
        state, slots = state
        for key, value in (slots or {}).items():
            object.__setattr__(obj, key, value)
    if state:
        vars(obj).update(state)
    return obj
