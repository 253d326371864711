"""What the internal channel's frames hold: msgpack, with every value that is not plain data named by its type.

Members send each other the catalogs' own objects (pydantic requests, proposals, table states, parts, errors).
Unlike pickle, decoding a frame can only build values: plain msgpack data, a few standard types (tuple, set,
UUID, datetime, Decimal, big integers), and instances of the types registered to cross (`coordinator.crossable`:
`WIRE_TYPES`, filled at import by the modules that define them), restored from their state the way pickle would
restore them but without calling anything a frame names. A type's name is only looked up in that registry: a
frame naming anything else (`os:system`, a builtin, a function, a module of ours that is not registered, a
`__main__`) is refused before any of it is used, and decoding never imports a module. The one exception is a
proposal's clean-up, a `functools.partial` of a function registered with `crossable` (or of a process-local
object's method named in CROSSABLE_METHODS): it is rebuilt only from that short list. A pydantic model crosses as
its state (fields, fields set, extras, private attributes) and is rebuilt from it as pickle would, never
validated again: the table's owner decides on exactly what the member the client reached parsed and checked.

A member sends only registered types too (an error of an unregistered class crosses as the nearest registered
class it derives from), so what one member sends the other can build.

Process-local objects a proposal refers to (the file IO, the store) travel by name and are replaced by the
receiver's own.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import functools
import struct
import types
import uuid
from typing import Any, Callable

import msgpack
import pydantic
from pydantic_core import PydanticUndefined

from storage import files as _files, records as _records
from storage.libraries import require

from .. import commit as _commit, decision as _decision, errors as _errors, idempotency as _idempotency
from ..crossable import CROSSABLE, CROSSABLE_METHODS, WIRE_TYPES, crossing, wire_name

# The commit machinery's own types: what every format's proposals, parts and answers are made of. (Each format
# registers its own in its proposals module.)
crossing(_commit, _decision, _errors, _idempotency, _files, _records)

FRAME_HEADER = struct.Struct(">I")  # a frame is its payload's length, then the payload

# A pydantic model crosses as its state, read and set directly in these slots of BaseModel, as its __getstate__ and
# __setstate__ do (`_model_parts`, `_restore_model`): private to pydantic, which is bounded to the releases that keep
# them (api/dependencies.py), and checked here at import.
MODEL_STATE = ("__dict__", "__pydantic_extra__", "__pydantic_fields_set__", "__pydantic_private__")


def model_state_missing(slots: tuple[str, ...], state: dict[str, Any]) -> list[str]:
    """The parts of a model's state that BaseModel (its `slots`, and what `__getstate__` gave: `state`) no longer
    keeps as this module reads them."""
    return [f"BaseModel.{name}" for name in MODEL_STATE if name not in slots or name not in state]


class _Probe(pydantic.BaseModel):
    field: int = 0


require("pydantic", "coordinator/cluster/wire.py (a model's state, read and set directly)",
        model_state_missing(pydantic.BaseModel.__slots__, _Probe().__getstate__()))

# msgpack extension type codes. A value with no parts (a UUID, a date) is one extension value. A value made of
# other values (a tuple, an object's state) is an array headed by an extension value, its head, that says what to
# build from the rest: so a whole frame is packed and unpacked in one pass of msgpack's (packing each such value as
# a frame of its own and unpacking it again was most of what a forwarded commit cost the two members).
(_TUPLE, _SET, _FROZENSET, _UUID, _DATETIME, _DATE, _DECIMAL, _BIGINT, _ENUM, _OBJECT, _ERROR, _LOCAL, _NAMEDTUPLE,
 _MAPPINGPROXY, _PARTIAL) = range(1, 16)


class WireError(ValueError):
    """A frame holds something this side will not build (a type outside the project, or an unknown encoding)."""


def _own_class(name: str) -> type:
    """The registered type `module:qualname`, or WireError: nothing else is ever looked up, nor imported."""
    found = WIRE_TYPES.get(name)
    if found is None:
        raise WireError(f"refusing to build {name!r}: not a type that crosses the channel (is every member running "
                        f"the same coordinator version?)")
    return found


def _crossing_class(cls: type) -> type | None:
    """The class values of `cls` cross as: itself if registered; for an error, the nearest registered class it
    derives from; else None."""
    for candidate in cls.__mro__ if issubclass(cls, BaseException) else (cls,):
        if WIRE_TYPES.get(wire_name(candidate)) is candidate:
            return candidate
    return None


class _Head:
    """A decoded head: builds its value from the array it heads (`parts[0]` is the head itself)."""

    __slots__ = ("build",)

    def __init__(self, build: Callable[[list], Any]):
        self.build = build


class Codec:
    """Encodes and decodes channel messages; the process-local objects in `local` cross by name."""

    def __init__(self, local: dict[str, Any]):
        self._by_name = dict(local)
        self._by_id = {id(obj): name for name, obj in local.items()}
        self._local_classes = {type(obj) for obj in local.values()}
        self._encoders: dict[type, Callable[[Any], Any]] = {}
        self._leaves: dict[int, Callable[[bytes], Any]] = {
            _LOCAL: self._local, _UUID: lambda data: uuid.UUID(bytes=data),
            _DATETIME: lambda data: datetime.datetime.fromisoformat(data.decode()),
            _DATE: lambda data: datetime.date.fromisoformat(data.decode()),
            _DECIMAL: lambda data: decimal.Decimal(data.decode()), _BIGINT: lambda data: int(data.decode())}
        # Heads this side has accepted, by (code, data): each type is judged once, not in every frame.
        self._heads: dict[tuple[int, bytes], _Head] = {}
        self._packer = msgpack.Packer(default=self._default, strict_types=True, datetime=False)
        self._unheaded = 0   # heads decoded in the current frame but not yet at the start of an array

    # -- encoding ------------------------------------------------------------------------------------------------

    def dumps(self, message: Any) -> bytes:
        try:
            return self._packer.pack(message)
        except BaseException:
            self._packer.reset()
            raise

    def frame(self, message: Any) -> bytes:
        payload = self.dumps(message)
        return FRAME_HEADER.pack(len(payload)) + payload

    def _default(self, obj: Any) -> Any:
        cls = type(obj)
        encode = self._encoders.get(cls)
        if encode is None:
            encode = self._encoders[cls] = self._encoder(cls)
        return encode(obj)

    def _encoder(self, cls: type) -> Callable[[Any], Any]:
        """How values of `cls` are encoded, decided once per class (an isinstance chain, and a failed attribute
        lookup through pydantic's __getattr__, for every value was most of the encoding's cost)."""
        if cls in self._local_classes:
            by_id, other = self._by_id, self._own_encoder(cls)

            def local(obj: Any) -> Any:
                name = by_id.get(id(obj))
                return msgpack.ExtType(_LOCAL, name.encode()) if name is not None else other(obj)
            return local
        if cls is functools.partial:
            head = msgpack.ExtType(_PARTIAL, b"")
            return lambda obj: [head, self._function(obj.func), list(obj.args), obj.keywords]
        if cls is tuple or cls is set or cls is frozenset:
            head = msgpack.ExtType(_TUPLE if cls is tuple else _SET if cls is set else _FROZENSET, b"")
            return lambda obj: [head, *obj]
        if issubclass(cls, uuid.UUID):  # asyncpg hands out its own subclass
            return lambda obj: msgpack.ExtType(_UUID, obj.bytes)
        if cls is datetime.datetime:
            return lambda obj: msgpack.ExtType(_DATETIME, obj.isoformat().encode())
        if cls is datetime.date:
            return lambda obj: msgpack.ExtType(_DATE, obj.isoformat().encode())
        if cls is types.MappingProxyType:  # a frozen dict (Delta's catalog entry)
            head = msgpack.ExtType(_MAPPINGPROXY, b"")
            return lambda obj: [head, dict(obj)]
        if cls is decimal.Decimal:
            return lambda obj: msgpack.ExtType(_DECIMAL, str(obj).encode())
        if cls is int:  # beyond msgpack's 64 bits
            return lambda obj: msgpack.ExtType(_BIGINT, str(obj).encode())
        return self._own_encoder(cls)

    def _own_encoder(self, cls: type) -> Callable[[Any], Any]:
        crosses_as = _crossing_class(cls)
        if crosses_as is None:
            def refuse(obj: Any) -> Any:
                raise TypeError(f"{wire_name(cls)} cannot cross the cluster channel: only plain data and the types "
                                f"registered with coordinator.crossable.crossing do")
            return refuse
        name = wire_name(crosses_as)

        def head(code: int) -> msgpack.ExtType:
            return msgpack.ExtType(code, name.encode())
        if issubclass(cls, enum.Enum):
            enum_head = head(_ENUM)
            return lambda obj: [enum_head, obj.value]
        if crosses_as is not cls:  # an error of a class that does not cross, as the one it derives from
            error_head = head(_ERROR)
            return lambda obj: [error_head, list(obj.args), dict(vars(obj))]
        if issubclass(cls, BaseException):
            error_head = head(_ERROR)
            return lambda obj: [error_head, list(obj.args), dict(vars(obj))]
        if issubclass(cls, tuple):  # a NamedTuple: rebuilt from its fields
            tuple_head = head(_NAMEDTUPLE)
            return lambda obj: [tuple_head, *obj]
        object_head = head(_OBJECT)
        if hasattr(cls, "_to_wire"):  # a class that chooses its own form (and rebuilds from it)
            return lambda obj: [object_head, obj._to_wire()]
        if issubclass(cls, pydantic.BaseModel):
            return lambda obj: _model_parts(object_head, obj)
        return lambda obj: [object_head, obj.__getstate__()]

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
        self._unheaded = 0
        try:
            value = msgpack.unpackb(payload, ext_hook=self._ext, list_hook=self._array, strict_map_key=False,
                                    timestamp=0, use_list=True)
        except WireError:
            raise
        except (ValueError, TypeError, AttributeError) as exc:  # msgpack's errors are ValueErrors too
            raise WireError(f"malformed frame: {exc}") from None
        if self._unheaded:
            raise WireError("malformed frame: a type's head out of place (not the first item of an array)")
        return value

    def _ext(self, code: int, data: bytes) -> Any:
        leaf = self._leaves.get(code)
        if leaf is not None:
            return leaf(data)
        head = self._heads.get((code, data))
        if head is None:
            head = self._heads[(code, data)] = _Head(self._builder(code, data))
        self._unheaded += 1
        return head

    def _array(self, items: list) -> Any:
        if items and type(items[0]) is _Head:
            self._unheaded -= 1
            return items[0].build(items)
        return items

    def _builder(self, code: int, data: bytes) -> Callable[[list], Any]:
        """How the array a head `(code, data)` starts is built; WireError for anything this side will not build."""
        if code in (_TUPLE, _SET, _FROZENSET, _MAPPINGPROXY, _PARTIAL) and data:
            raise WireError(f"malformed frame: extension type {code} names nothing, this one names {data!r}")
        if code == _TUPLE:
            return lambda items: tuple(items[1:])
        if code == _SET:
            return lambda items: set(items[1:])
        if code == _FROZENSET:
            return lambda items: frozenset(items[1:])
        if code == _MAPPINGPROXY:
            return lambda items: types.MappingProxyType(*items[1:])
        if code == _PARTIAL:
            return self._partial
        if code not in (_ENUM, _ERROR, _NAMEDTUPLE, _OBJECT):
            raise WireError(f"unknown extension type {code} in a frame")
        name = data.decode()
        if code == _OBJECT:
            return _restorer(name)
        cls = _own_class(name)
        if code == _ENUM:
            if not issubclass(cls, enum.Enum):
                raise WireError(f"{name!r} is not an enum")
            return lambda items: cls(*items[1:])
        if code == _ERROR:
            if not issubclass(cls, Exception):
                raise WireError(f"{name!r} is not an error")
            return functools.partial(_error, cls)
        if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
            raise WireError(f"{name!r} is not a named tuple")
        return lambda items: cls(*items[1:])

    def _local(self, data: bytes) -> Any:
        name = data.decode()
        if name not in self._by_name:
            raise WireError(f"unknown process-local object {name!r}")
        return self._by_name[name]

    def _partial(self, items: list) -> functools.partial:
        _, ref, args, keywords = items
        return functools.partial(self._callable(ref), *args, **keywords)


def _from_wire(from_wire: Callable[[Any], Any], items: list) -> Any:
    _, state = items
    return from_wire(state)


def _error(cls: type, items: list) -> Exception:
    _, args, attrs = items
    exc = cls.__new__(cls)
    exc.args = tuple(args)
    vars(exc).update(attrs)
    return exc


def _model_parts(head: msgpack.ExtType, model: pydantic.BaseModel) -> list:
    """A pydantic model's state (what its __getstate__ gives) after its head: its fields set as a list."""
    private = model.__pydantic_private__
    if private:
        private = {k: v for k, v in private.items() if v is not PydanticUndefined}
    return [head, model.__dict__, model.__pydantic_extra__, list(model.__pydantic_fields_set__), private]


def _restore_model(cls: type, items: list) -> pydantic.BaseModel:
    """The model as its __setstate__ rebuilds it from __getstate__'s state: the same attributes, no validation."""
    _, fields, extra, fields_set, private = items
    model = cls.__new__(cls)
    object.__setattr__(model, "__pydantic_fields_set__", set(fields_set))
    object.__setattr__(model, "__pydantic_extra__", extra)
    object.__setattr__(model, "__pydantic_private__", private)
    object.__setattr__(model, "__dict__", fields)
    return model


@functools.lru_cache(maxsize=1024)
def _restorer(name: str) -> Callable[[list], Any]:
    """How an instance of our class `name` is rebuilt from the array its head starts, decided once per class."""
    cls = _own_class(name)
    if issubclass(cls, (BaseException, enum.Enum, tuple)):
        raise WireError(f"{name!r} cannot be rebuilt from a state")
    from_wire = getattr(cls, "_from_wire", None)
    if from_wire is not None:
        return functools.partial(_from_wire, from_wire)
    if issubclass(cls, pydantic.BaseModel):
        return functools.partial(_restore_model, cls)
    return functools.partial(_restore, cls, hasattr(cls, "__setstate__"))


def _restore(cls: type, setstate: bool, items: list) -> Any:
    """Pickle's default rebuild (object.__reduce_ex__ protocol 2) for one of our classes: a bare instance, then
    its own __setstate__ if it has one (slotted dataclasses), else its attributes. (Pydantic models: `_restore_model`.) (A class with
    its own wire form, `_to_wire`, rebuilds itself from it instead: `_from_wire`.)"""
    _, state = items
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
