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
from typing import Any

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
        local = self._by_id.get(id(obj))
        if local is not None:
            return msgpack.ExtType(_LOCAL, local.encode())
        cls = type(obj)
        if cls is functools.partial:
            return msgpack.ExtType(_PARTIAL, self.dumps([self._function(obj.func), list(obj.args), obj.keywords]))
        if cls is tuple:
            return msgpack.ExtType(_TUPLE, self.dumps(list(obj)))
        if cls is set or cls is frozenset:
            return msgpack.ExtType(_SET if cls is set else _FROZENSET, self.dumps(list(obj)))
        if isinstance(obj, uuid.UUID):  # asyncpg hands out its own subclass
            return msgpack.ExtType(_UUID, obj.bytes)
        if cls is datetime.datetime:
            return msgpack.ExtType(_DATETIME, obj.isoformat().encode())
        if cls is datetime.date:
            return msgpack.ExtType(_DATE, obj.isoformat().encode())
        if cls is types.MappingProxyType:  # a frozen dict (Delta's catalog entry)
            return msgpack.ExtType(_MAPPINGPROXY, self.dumps(dict(obj)))
        if cls is decimal.Decimal:
            return msgpack.ExtType(_DECIMAL, str(obj).encode())
        if cls is int:  # beyond msgpack's 64 bits
            return msgpack.ExtType(_BIGINT, str(obj).encode())
        if not cls.__module__.startswith(OWN_PACKAGES):
            raise TypeError(f"{_name(cls)} cannot cross the cluster channel: only plain data and the "
                            f"coordinator's own types do")
        if isinstance(obj, enum.Enum):
            return msgpack.ExtType(_ENUM, self.dumps([_name(cls), obj.value]))
        if isinstance(obj, BaseException):
            return msgpack.ExtType(_ERROR, self.dumps([_name(cls), list(obj.args), dict(vars(obj))]))
        if isinstance(obj, tuple):  # a NamedTuple: rebuilt from its fields
            return msgpack.ExtType(_NAMEDTUPLE, self.dumps([_name(cls), list(obj)]))
        to_wire = getattr(obj, "_to_wire", None)  # a class that chooses its own form (and rebuilds from it)
        return msgpack.ExtType(_OBJECT, self.dumps([_name(cls), obj.__getstate__() if to_wire is None else to_wire()]))

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
        if code == _LOCAL:
            name = data.decode()
            if name not in self._by_name:
                raise WireError(f"unknown process-local object {name!r}")
            return self._by_name[name]
        if code == _TUPLE:
            return tuple(self.loads(data))
        if code == _SET:
            return set(self.loads(data))
        if code == _FROZENSET:
            return frozenset(self.loads(data))
        if code == _UUID:
            return uuid.UUID(bytes=data)
        if code == _DATETIME:
            return datetime.datetime.fromisoformat(data.decode())
        if code == _DATE:
            return datetime.date.fromisoformat(data.decode())
        if code == _PARTIAL:
            ref, args, keywords = self.loads(data)
            return functools.partial(self._callable(ref), *args, **keywords)
        if code == _MAPPINGPROXY:
            return types.MappingProxyType(self.loads(data))
        if code == _DECIMAL:
            return decimal.Decimal(data.decode())
        if code == _BIGINT:
            return int(data.decode())
        if code == _ENUM:
            name, value = self.loads(data)
            cls = _own_class(name)
            if not issubclass(cls, enum.Enum):
                raise WireError(f"{name!r} is not an enum")
            return cls(value)
        if code == _ERROR:
            name, args, attrs = self.loads(data)
            cls = _own_class(name)
            if not issubclass(cls, Exception):
                raise WireError(f"{name!r} is not an error")
            exc = cls.__new__(cls)
            exc.args = tuple(args)
            vars(exc).update(attrs)
            return exc
        if code == _NAMEDTUPLE:
            name, fields = self.loads(data)
            cls = _own_class(name)
            if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
                raise WireError(f"{name!r} is not a named tuple")
            return cls(*fields)
        if code == _OBJECT:
            name, state = self.loads(data)
            cls = _own_class(name)
            if issubclass(cls, (BaseException, enum.Enum, tuple)):
                raise WireError(f"{name!r} cannot be rebuilt from a state")
            return _restore(cls, state)
        raise WireError(f"unknown extension type {code} in a frame")


def _restore(cls: type, state: Any) -> Any:
    """Pickle's default rebuild (object.__reduce_ex__ protocol 2) for one of our classes: a bare instance, then
    its own __setstate__ if it has one (pydantic models, slotted dataclasses), else its attributes. A class with
    its own wire form (`_to_wire`) rebuilds itself from it (`_from_wire`)."""
    from_wire = getattr(cls, "_from_wire", None)
    if from_wire is not None:
        return from_wire(state)
    obj = cls.__new__(cls)
    if hasattr(obj, "__setstate__"):
        obj.__setstate__(state)
        return obj
    if isinstance(state, tuple) and len(state) == 2:  # (__dict__, slots), as object.__getstate__ gives them
        state, slots = state
        for key, value in (slots or {}).items():
            object.__setattr__(obj, key, value)
    if state:
        vars(obj).update(state)
    return obj
