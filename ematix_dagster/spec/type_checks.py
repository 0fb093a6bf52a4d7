"""Types, from the dataclass annotations: no rule compares or formats a value of the wrong type."""

from __future__ import annotations

import datetime as _dt
import functools
import types
from dataclasses import fields, is_dataclass
from typing import Any, Mapping, Union, get_args, get_origin, get_type_hints

from ematix_dagster.spec.rules import _TOML_KEYS, JAVA_INT_MAX, JAVA_LONG_MAX, MAX_DURATION_MS, _child, _fail

# Upper bounds of integer keys besides the *_ms durations, with the reason the message gives.
_INT_BOUNDS: dict[str, tuple[int, str]] = {
    "max_files_per_trigger": (JAVA_INT_MAX, "Spark reads maxFilesPerTrigger as a Java int"),
    "rows_per_second": (JAVA_INT_MAX, "the rate source multiplies it by elapsed seconds in 64 bits"),
    "max_offsets_per_trigger": (JAVA_LONG_MAX, "Spark reads maxOffsetsPerTrigger as a Java long"),
    "max_groups_per_window": (JAVA_INT_MAX, "a window's groups are held in the driver's memory"),
    "max_distinct_values_per_group": (JAVA_INT_MAX, "the distinct values are held in the driver's memory"),
    "count": (JAVA_LONG_MAX, "emit_trigger's count divides a group's row count, a 64-bit integer"),
    "max_buffered_rows": (JAVA_LONG_MAX, "the state store counts pending rows in a 64-bit integer"),
}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _toml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, Mapping) or is_dataclass(value):
        return "a table"
    if isinstance(value, (_dt.date, _dt.time)):
        return "a date/time"
    return f"a {type(value).__name__}"


def _int_bound(name: str) -> tuple[int, str] | None:
    if name.endswith("_ms"):
        return MAX_DURATION_MS, "1000 years: durations become 64-bit microseconds added to event times"
    return _INT_BOUNDS.get(name)


def _check_types(obj: Any, key: str = "") -> None:
    """Every field of ``obj`` (recursively) against its annotation, so that no rule compares or
    formats a value of the wrong type, and ``"false"`` is never taken for a true boolean."""
    cls: type = type(obj)
    hints = _hints(cls)
    for f in fields(obj):
        value = getattr(obj, f.name)
        _check_type(_child(key, f.name, value), _TOML_KEYS.get(f.name, f.name), value, hints[f.name])


def _check_type(key: str, name: str, value: Any, hint: Any) -> None:
    if get_origin(hint) in (Union, types.UnionType):  # X | None, or a spec's shape: one of its tables
        if value is None and type(None) in get_args(hint):
            return
        choices = [a for a in get_args(hint) if a is not type(None)]
        hint = next((a for a in choices if isinstance(value, a)), choices[0])
    if value is None:
        _fail(key, "is mandatory", f"set {name}")
    if get_origin(hint) is tuple:
        if not isinstance(value, tuple):
            example = f'["{value}"]' if isinstance(value, str) else "[...]"
            _fail(key, f"{value!r} is {_toml_type(value)}, not a list", f"write a list, e.g. {name} = {example}")
        for i, item in enumerate(value):
            _check_type(f"{key}[{i}]", name, item, get_args(hint)[0])
    elif isinstance(hint, type) and is_dataclass(hint):
        if not isinstance(value, hint):
            _fail(key, f"is {_toml_type(value)}, not a {hint.__name__}", f"write the [{key}] table")
        _check_types(value, key)
    elif hint is bool:
        if not isinstance(value, bool):
            _fail(key, f"{value!r} is {_toml_type(value)}, not a boolean",
                  f"write {name} = true or {name} = false, without quotes")
    elif hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            _fail(key, f"{value!r} is {_toml_type(value)}, not an integer", "write a whole number without quotes")
        bound = _int_bound(name)
        if bound is not None and value > bound[0]:
            _fail(key, f"{value} is larger than {bound[0]:_} ({bound[1]})", f"use at most {bound[0]:_}")
    elif hint is str:
        if not isinstance(value, str):
            scalar = isinstance(value, (int, float))
            _fail(key, f"{value!r} is {_toml_type(value)}, not a string",
                  f'write it in quotes, e.g. "{value}"' if scalar else "write a string in quotes")
    else:  # a field whose annotation has no rule here: a programming error, not a config error
        raise TypeError(f"{key}: no type rule for {hint!r}")
