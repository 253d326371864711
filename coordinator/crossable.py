"""What may cross between cluster members: the values' types, and the clean-ups a proposal may carry.

A frame (coordinator/cluster/wire.py) builds only plain data and instances of the types registered here; decoding
looks a type's name up in `WIRE_TYPES` and never imports a module or calls anything a frame names. The modules that
define what members send each other (requests, proposals, table states, records, errors) register their own data
types with `crossing(module)` at import: the commit machinery in wire.py, each format in its proposals module.
A module run as a program (`__main__`) never registers.

A proposal sometimes holds what to do once its commit is durable (delete a dropped table's files, a Lance writer's
published staging manifest), as a `functools.partial`. Such a partial crosses by name, and a receiving member
rebuilds it only from this list: functions registered with `crossable`, or the methods in CROSSABLE_METHODS of its
own process-local objects (its file IO).
"""

from __future__ import annotations

import dataclasses
import enum
import types
from typing import Any, Callable

import pydantic

CROSSABLE: dict[str, Callable[..., Any]] = {}
CROSSABLE_METHODS = frozenset({"delete"})   # FileIO.delete(uri, within=...)
WIRE_TYPES: dict[str, type] = {}            # "module:qualname" -> the class a frame may build by that name


def crossable(fn):
    """Let partials of `fn` (a module-level function of the project) cross between members, by name."""
    CROSSABLE[f"{fn.__module__}:{fn.__qualname__}"] = fn
    return fn


def wire_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def crossing(*modules: types.ModuleType) -> None:
    """Let values of the data types each module defines cross between members: its classes (nested ones too) that
    are pydantic models, dataclasses, enums, exceptions or named tuples, or that have a wire form of their own
    (`_to_wire`/`_from_wire`). Other classes (services, actors, anything holding a resource) never cross."""
    for module in modules:
        name = module.__name__
        if name == "__main__" or name.endswith(".__main__"):
            raise ValueError(f"{name}: a module run as a program cannot register types that cross the channel")
        pending = [c for c in vars(module).values() if isinstance(c, type) and c.__module__ == name]
        while pending:
            cls = pending.pop()
            if _is_data(cls):
                WIRE_TYPES[wire_name(cls)] = cls
            pending += [c for c in vars(cls).values() if isinstance(c, type) and c.__module__ == name
                        and c.__qualname__.startswith(cls.__qualname__ + ".")]


def _is_data(cls: type) -> bool:
    return (issubclass(cls, (pydantic.BaseModel, enum.Enum, BaseException)) or dataclasses.is_dataclass(cls)
            or (issubclass(cls, tuple) and hasattr(cls, "_fields")) or hasattr(cls, "_from_wire"))
