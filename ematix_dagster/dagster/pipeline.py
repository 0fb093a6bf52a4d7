"""One pipeline as the Dagster integration sees it: its spec, description, asset key and names.

Every factory of this package (asset, checks, sensors, jobs) accepts a *pipeline-like* value: a
TOML path, a :class:`~ematix_dagster.spec.PipelineSpec`, a ``@streaming_pipeline`` object, an
:class:`EmatixPipeline`, or the ``AssetsDefinition`` made by ``streaming_pipeline_asset`` (whose
metadata carries the pipeline's TOML, with ``${ENV}`` placeholders, never their values).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Union

import dagster as dg

from ematix_dagster.facade import StreamingPipeline
from ematix_dagster.spec import PipelineSpec, dump_pipeline, load_pipeline, load_pipeline_str

#: Run tags the integration writes and reads.
PIPELINE_TAG = "ematix/pipeline"  # every run of a pipeline (the tag concurrency limit keys on it)
CODE_VERSION_TAG = "ematix/code_version"  # the spec hash the run started with
FAILURE_TAG = "ematix/failure"  # terminal | transient | lease_held, on a failed run
ERROR_TAG = "ematix/error"  # the error class of a failed run
LAUNCHED_BY_TAG = "ematix/launched_by"
TERMINATED_BY_TAG = "ematix/terminated_by"  # set by the migration job before it terminates a run

#: Asset metadata keys.
TOML_METADATA_KEY = "ematix/pipeline_toml"
NAME_METADATA_KEY = "ematix/pipeline_name"

PipelineLike = Union["EmatixPipeline", PipelineSpec, StreamingPipeline, str, Path, dg.AssetsDefinition]


def spec_code_version(spec: PipelineSpec) -> str:
    """A hash of the pipeline's TOML: environment values are excluded (placeholders stay ``${NAME}``)."""
    return hashlib.sha256(dump_pipeline(spec).encode()).hexdigest()[:16]


def python_name(pipeline_name: str) -> str:
    """``user-clicks`` -> ``user_clicks`` (Dagster names allow ``[A-Za-z0-9_]``)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", pipeline_name)


def default_asset_key(spec: PipelineSpec) -> dg.AssetKey:
    """The target table (``schema.table`` -> ``["schema", "table"]``); ``["ematix", name]`` otherwise."""
    if spec.target.kind == "postgres" and spec.target.table:
        return dg.AssetKey(spec.target.table.split("."))
    return dg.AssetKey(["ematix", spec.pipeline_name])


@dataclass(frozen=True)
class EmatixPipeline:
    """A pipeline spec plus what Dagster shows about it."""

    spec: PipelineSpec
    description: str = ""
    source_path: Path | None = None
    asset_key: dg.AssetKey | None = field(default=None)

    @property
    def name(self) -> str:
        return self.spec.pipeline_name

    @property
    def key(self) -> dg.AssetKey:
        return self.asset_key or default_asset_key(self.spec)

    @property
    def python_name(self) -> str:
        return python_name(self.name)

    @property
    def job_name(self) -> str:
        return f"{self.python_name}_job"

    @property
    def code_version(self) -> str:
        return spec_code_version(self.spec)

    @property
    def long_running(self) -> bool:
        return self.spec.run.trigger == "processing_time"

    def check_key(self, check_name: str) -> dg.AssetCheckKey:
        return dg.AssetCheckKey(self.key, check_name)

    @classmethod
    def load(cls, value: PipelineLike, description: str | None = None) -> "EmatixPipeline":
        """Accepts every pipeline-like value (see the module docstring)."""
        if isinstance(value, EmatixPipeline):
            return value
        if isinstance(value, StreamingPipeline):
            return cls(value.spec, description if description is not None else value.description)
        if isinstance(value, PipelineSpec):
            return cls(value, description or "")
        if isinstance(value, dg.AssetsDefinition):
            return cls.from_asset(value)
        path = Path(value)
        spec = load_pipeline(path)
        if description is None:
            description = _toml_description(path)
        return cls(spec, description, source_path=path)

    @classmethod
    def from_asset(cls, asset: dg.AssetsDefinition) -> "EmatixPipeline":
        key = asset.key
        if key in _REGISTRY:
            return _REGISTRY[key]
        spec_meta: Mapping[str, Any] = asset.specs_by_key[key].metadata
        toml = spec_meta.get(TOML_METADATA_KEY)
        if toml is None:
            raise ValueError(f"asset {key.to_user_string()} was not made by streaming_pipeline_asset")
        text = _strip_code_fence(str(metadata_value(toml)))
        return cls(load_pipeline_str(text), asset.descriptions_by_key.get(key) or "", asset_key=key)


def metadata_value(entry: Any) -> Any:
    """A metadata entry's plain value: stored metadata comes back as ``MetadataValue``s, metadata
    built in code may hold plain values."""
    return entry.value if isinstance(entry, dg.MetadataValue) else entry


def _toml_description(path: Path) -> str:
    """The leading ``#`` comment block of a TOML file, as the asset's description."""
    lines = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            break
        lines.append(stripped.lstrip("#").strip())
    return " ".join(lines).strip()


def _strip_code_fence(text: str) -> str:
    lines = text.strip().splitlines()
    if lines and lines[0].startswith("```"):
        lines = lines[1:]
    if lines and lines[-1].startswith("```"):
        lines = lines[:-1]
    return "\n".join(lines)


_REGISTRY: dict[dg.AssetKey, EmatixPipeline] = {}


def register(pipeline: EmatixPipeline) -> None:
    """Remember the pipeline behind an asset key (``from_asset`` then needs no metadata round trip)."""
    _REGISTRY[pipeline.key] = pipeline


def toml_metadata(spec: PipelineSpec) -> dg.MetadataValue:
    """The pipeline's TOML for the UI; literal passwords in URLs are masked (use ``${ENV}`` for them)."""
    from ematix_dagster.targets import redact_url

    return dg.MetadataValue.md(f"```toml\n{redact_url(dump_pipeline(spec))}```")


__all__ = ["CODE_VERSION_TAG", "ERROR_TAG", "EmatixPipeline", "FAILURE_TAG", "LAUNCHED_BY_TAG", "PIPELINE_TAG",
           "PipelineLike", "TERMINATED_BY_TAG", "default_asset_key", "python_name", "spec_code_version"]
