"""TOML <-> dataclasses: unknown keys and other engines' spellings are refused, dumps omit defaults."""

from __future__ import annotations

import os
import tomllib
from dataclasses import MISSING as _MISSING
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Mapping

import tomli_w

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec.backfill import Backfill, BackfillSource
from ematix_dagster.spec.emit import EmitRelease
from ematix_dagster.spec.model import PipelineSpec, StateStoreConfig
from ematix_dagster.spec.rows import RowTransform
from ematix_dagster.spec.rules import _fail
from ematix_dagster.spec.run import Run
from ematix_dagster.spec.sinks import DeadLetter, Target
from ematix_dagster.spec.sources import Source
from ematix_dagster.spec.window import Aggregation, Window

# Other engines' spellings of our keys: refused with the canonical key, so copied configs get a precise hint.
_FOREIGN_SPELLINGS = {
    "kind": "agg",
    "input_column": "column",
    "output_name": "as",
    "width_ms": "duration_ms",
}

_TOP_KEYS = {"pipeline_name", "metrics_port", "sources", "transform", "target", "dead_letter", "state_store", "run",
             "emit", "backfill"}


def _take(table: Mapping[str, Any], key: str, cls: type, renames: Mapping[str, str] | None = None) -> Any:
    """Build ``cls`` from a TOML table, refusing unknown keys and other engines' spellings."""
    if not isinstance(table, Mapping):
        _fail(key, f"must be a table, got {type(table).__name__}", f"write [{key}]")
    renames = dict(renames or {})
    known = {renames.get(f.name, f.name): f.name for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for k, v in table.items():
        if k not in known:
            canonical = _FOREIGN_SPELLINGS.get(k)
            if canonical and canonical in known:
                _fail(f"{key}.{k}", f"{k} = {v!r} is not this engine's spelling", f"use {canonical!r} instead of {k!r}")
            _fail(f"{key}.{k}", "unknown key", f"known keys: {', '.join(sorted(known))}")
        kwargs[known[k]] = v
    required = [f.name for f in fields(cls) if f.default is _MISSING and f.default_factory is _MISSING]
    for name in required:
        if name not in kwargs:
            _fail(f"{key}.{renames.get(name, name)}", "is required", f"add {renames.get(name, name)} = ...")
    return cls(**kwargs)



def _window(wdoc: Any) -> Window:
    """``[transform.window]`` with its aggregations."""
    if not isinstance(wdoc, Mapping):
        _fail("transform.window", "must be a table", "write [transform.window]")
    wdoc = dict(wdoc)
    aggs_doc = wdoc.pop("aggregations", None)
    if aggs_doc is not None and not isinstance(aggs_doc, list):
        _fail("transform.window.aggregations", "must be an array of tables",
              "write [[transform.window.aggregations]] (double brackets)")
    if not aggs_doc:
        _fail("transform.window.aggregations", "at least one aggregation is required",
              'add [[transform.window.aggregations]] with agg = "count", as = "n"')
    aggs = tuple(_take(a, f"transform.window.aggregations[{i}]", Aggregation, {"as_": "as"})
                 for i, a in enumerate(aggs_doc))
    wdoc.setdefault("max_groups_per_window", None)  # required unless the window state is Spark's (validate)
    wdoc["aggregations"] = aggs
    return _take(wdoc, "transform.window", Window)


def _rows(transform: Mapping[str, Any]) -> RowTransform:
    """A row pipeline's ``[transform]`` keys besides ``sql``; a window's keys are named as such, since
    a pipeline without ``[transform.window]`` has none."""
    known = ["sql", *(f.name for f in fields(RowTransform))]
    window_keys = {f.name for f in fields(Window)}
    for k in transform:
        if k in window_keys and k not in known:
            _fail(f"transform.{k}", f"{k} is a [transform.window] key, and this pipeline has no [transform.window] "
                  "(a row pipeline)", f"remove it, or add [transform.window] and move {k} there to aggregate")
        if k not in known:
            _fail(f"transform.{k}", "unknown key",
                  f"known keys of [transform] without [transform.window] (a row pipeline): {', '.join(sorted(known))}")
    return _take({k: v for k, v in transform.items() if k != "sql"}, "transform", RowTransform)


def _backfill(bdoc: Any) -> Backfill:
    """``[backfill]`` with its ``[[backfill.sources]]``."""
    backfill = _take(bdoc, "backfill", Backfill)
    if not isinstance(backfill.sources, tuple) or not all(isinstance(s, Mapping) for s in backfill.sources):
        _fail("backfill.sources", "must be an array of tables", "write [[backfill.sources]] with name and path")
    return replace(backfill, sources=tuple(_take(s, f"backfill.sources[{i}]", BackfillSource)
                                           for i, s in enumerate(backfill.sources)))


def _windowed_transform_keys(transform: Mapping[str, Any]) -> None:
    """``[transform]`` of a windowed pipeline holds only ``sql`` and ``window``: the watermark keys
    belong in the window, and ``max_buffered_rows`` to row pipelines."""
    for k in transform:
        if k in ("sql", "window"):
            continue
        if k == "max_buffered_rows":
            _fail(f"transform.{k}", "applies to row pipelines only (those without [transform.window]), "
                  "where WATERMARK_TS() holds rows back", "remove it")
        if k in {f.name for f in fields(RowTransform)}:
            _fail(f"transform.{k}", f"{k} of a windowed pipeline belongs in [transform.window]",
                  f"move {k} to [transform.window]")
        _fail(f"transform.{k}", "unknown key",
              "known keys of [transform] with [transform.window]: sql, window")


def spec_from_dict(doc: Mapping[str, Any]) -> PipelineSpec:
    """Build and validate a spec from parsed TOML."""
    for k in doc:
        if k not in _TOP_KEYS:
            _fail(k, "unknown top-level key", f"known keys: {', '.join(sorted(_TOP_KEYS))}")
    for k in ("pipeline_name", "sources", "target", "run"):
        if k not in doc:
            _fail(k, "is required", f"add {k}")
    if "transform" not in doc:
        _fail("transform", "is required", "add [transform.window] (a windowed pipeline) or [transform] sql "
              "(a row pipeline, docs/contract/row-pipelines.md)")
    transform = doc["transform"]
    if not isinstance(transform, Mapping):
        _fail("transform", "must be a table", "write [transform]")
    shape: Window | RowTransform
    if "window" in transform:
        _windowed_transform_keys(transform)
        shape = _window(transform["window"])
    else:
        shape = _rows(transform)
    if not isinstance(doc["sources"], list):
        _fail("sources", "must be an array of tables", "write [[sources]]")
    sources = tuple(_take(s, f"sources[{i}]", Source) for i, s in enumerate(doc["sources"]))
    spec = PipelineSpec(
        pipeline_name=doc["pipeline_name"],
        metrics_port=doc.get("metrics_port"),
        sources=sources,
        transform_sql=transform.get("sql"),
        shape=shape,
        target=_take(doc["target"], "target", Target),
        dead_letter=_take(doc["dead_letter"], "dead_letter", DeadLetter) if "dead_letter" in doc else None,
        state_store=(_take(doc["state_store"], "state_store", StateStoreConfig) if "state_store" in doc
                     else StateStoreConfig()),
        run=_take(doc["run"], "run", Run),
        backfill=_backfill(doc["backfill"]) if "backfill" in doc else None,
        emit=_take(doc["emit"], "emit", EmitRelease) if "emit" in doc else None,
    )
    return spec.validate()


def load_pipeline_str(text: str) -> PipelineSpec:
    """Parse TOML text into a validated spec."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PipelineConfigError("toml", f"not valid TOML: {exc}", "fix the syntax at the position shown") from None
    return spec_from_dict(doc)


def load_pipeline(path: str | os.PathLike[str]) -> PipelineSpec:
    """Load a pipeline TOML file."""
    p = Path(path)
    if not p.is_file():
        raise PipelineConfigError("path", f"{str(p)!r} does not exist", "pass the path of a pipeline TOML file")
    return load_pipeline_str(p.read_text())


def _table(obj: Any, renames: Mapping[str, str] | None = None, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Dataclass -> TOML table with defaults omitted, so dumps stay short and stable."""
    renames = renames or {}
    out: dict[str, Any] = {}
    for f in fields(obj):
        if f.name in skip:
            continue
        v = getattr(obj, f.name)
        default = f.default if f.default is not _MISSING else _MISSING
        if v is None or (default is not _MISSING and v == default):
            continue
        out[renames.get(f.name, f.name)] = list(v) if isinstance(v, tuple) else v
    return out


def _window_table(w: Window) -> dict[str, Any]:
    window = _table(w, skip=("aggregations", "emit_trigger"))
    if w.emit_trigger.fires_early:
        window["emit_trigger"] = w.emit_trigger.to_toml()
    window["group_by"] = list(w.group_by)
    if w.max_groups_per_window is not None:
        window["max_groups_per_window"] = w.max_groups_per_window
    window["aggregations"] = [_table(a, {"as_": "as"}) for a in w.aggregations]
    return window


def spec_to_dict(spec: PipelineSpec) -> dict[str, Any]:
    doc: dict[str, Any] = {"pipeline_name": spec.pipeline_name}
    if spec.metrics_port is not None:
        doc["metrics_port"] = spec.metrics_port
    doc["sources"] = [_table(s) for s in spec.sources]
    transform: dict[str, Any] = {}
    if spec.transform_sql is not None:
        transform["sql"] = spec.transform_sql
    if spec.window_spec is None:
        transform |= _table(spec.shape)
    else:
        transform["window"] = _window_table(spec.window_spec)
    doc["transform"] = transform
    doc["target"] = _table(spec.target)
    if spec.dead_letter is not None:
        doc["dead_letter"] = _table(spec.dead_letter)
    if spec.state_store != StateStoreConfig():
        doc["state_store"] = _table(spec.state_store) | {"kind": spec.state_store.kind}
    doc["run"] = _table(spec.run)
    if spec.backfill is not None:
        doc["backfill"] = _table(spec.backfill, skip=("sources",))
        if spec.backfill.sources:
            doc["backfill"]["sources"] = [_table(s) for s in spec.backfill.sources]
    if spec.emit is not None:
        doc["emit"] = _table(spec.emit)
    return doc


def dump_pipeline(spec: PipelineSpec) -> str:
    """Serialise a spec to TOML; ``load_pipeline_str(dump_pipeline(s)) == s``."""
    return tomli_w.dumps(spec_to_dict(spec))


def with_overrides(spec: PipelineSpec, **changes: Any) -> PipelineSpec:
    """A validated copy of ``spec`` with top-level fields replaced (used by Dagster resources)."""
    return replace(spec, **changes).validate()
