"""A pipeline's ``AssetSpec`` and its sources' upstream ``AssetSpec``s, built by a translator users
subclass (dagster-sling's ``DagsterSlingTranslator`` and dagster-dbt's ``DagsterDbtTranslator`` seam)."""

from typing import Any, Mapping, Optional, Sequence

import dagster as dg

from ematix_dagster.dagster.lineage import default_source_key, source_uri, target_metadata
from ematix_dagster.dagster.pipeline import (
    NAME_METADATA_KEY,
    PIPELINE_TAG,
    TOML_METADATA_KEY,
    EmatixPipeline,
    toml_metadata,
)
from ematix_dagster.spec import Source


class EmatixTranslator:
    """Maps a pipeline to its ``AssetSpec``; subclass and override a ``get_*`` method to customise.

    Every method receives the pipeline, so keys, groups, owners, kinds and tags can differ per
    pipeline (``pipeline.name``, ``pipeline.spec``). ``get_source_*`` do the same for the upstream
    assets of its sources (:mod:`ematix_dagster.dagster.lineage`). Mirrors dagster-sling's
    ``DagsterSlingTranslator`` and dagster-dbt's ``DagsterDbtTranslator``.
    """

    def get_asset_key(self, pipeline: EmatixPipeline) -> dg.AssetKey:
        return pipeline.key

    def get_description(self, pipeline: EmatixPipeline) -> str:
        spec = pipeline.spec
        if spec.window_spec is None:  # a row pipeline writes what its SQL selects
            what = f"rows of `{spec.transform_sql}`"
        else:
            w = spec.window_spec
            what = w.shape + (f" per {', '.join(w.group_by)}" if w.group_by else "")
        sources = ", ".join(s.name for s in spec.sources)
        target = spec.target.table or spec.target.path or spec.target.kind
        head = pipeline.description.strip()
        line = (f"Streaming pipeline `{spec.pipeline_name}`: {what} over {sources} into {spec.target.kind} "
                f"`{target}` (trigger {spec.run.trigger}).")
        return f"{head}\n\n{line}" if head else line

    def get_owners(self, pipeline: EmatixPipeline) -> Sequence[str]:
        return []

    def get_tags(self, pipeline: EmatixPipeline) -> Mapping[str, str]:
        spec = pipeline.spec
        window = "none" if spec.window_spec is None else spec.window_spec.kind  # none: a row pipeline
        return {PIPELINE_TAG: spec.pipeline_name, "ematix/trigger": spec.run.trigger,
                "ematix/window": window, "ematix/target": spec.target.kind}

    def get_kinds(self, pipeline: EmatixPipeline) -> set[str]:
        kinds = {"spark"}
        if pipeline.spec.target.kind in ("postgres", "parquet"):
            kinds.add(pipeline.spec.target.kind)
        return kinds

    def get_code_version(self, pipeline: EmatixPipeline) -> str:
        return pipeline.code_version

    def get_group_name(self, pipeline: EmatixPipeline) -> Optional[str]:
        return "ematix"

    def get_metadata(self, pipeline: EmatixPipeline) -> Mapping[str, Any]:
        spec = pipeline.spec
        meta: dict[str, Any] = {
            NAME_METADATA_KEY: spec.pipeline_name,
            TOML_METADATA_KEY: toml_metadata(spec),
            "ematix/trigger": spec.run.trigger,
            "ematix/checkpoint": spec.run.checkpoint_location,
        }
        if pipeline.source_path is not None:
            meta["ematix/toml_path"] = dg.MetadataValue.path(str(pipeline.source_path))
        return {**meta, **target_metadata(spec.target)}

    def get_source_asset_key(self, pipeline: EmatixPipeline, source: Source) -> Optional[dg.AssetKey]:
        """The upstream asset of one source (None: it has none, like a ``rate`` source). Pipelines
        whose sources get the same key share that upstream asset."""
        return default_source_key(source)

    def get_source_asset_spec(self, pipeline: EmatixPipeline, source: Source) -> Optional[dg.AssetSpec]:
        key = self.get_source_asset_key(pipeline, source)
        if key is None:
            return None
        what = {"files": f"{source.format} files under `{source.path}`", "kafka": f"Kafka topic `{source.topic}`",
                "redis_stream": f"Redis stream(s) `{', '.join(source.streams)}`"}[source.kind]
        uri = source_uri(source)
        return dg.AssetSpec(key=key, description=f"Input of streaming pipelines: {what}.",
                            kinds={source.format or "files"} if source.kind == "files" else
                            {"redis" if source.kind == "redis_stream" else "kafka"},
                            group_name=self.get_group_name(pipeline),
                            metadata={"dagster/uri": uri} if uri is not None else {})

    def get_asset_spec(self, pipeline: EmatixPipeline) -> dg.AssetSpec:
        return dg.AssetSpec(
            key=self.get_asset_key(pipeline), description=self.get_description(pipeline),
            owners=list(self.get_owners(pipeline)), tags=dict(self.get_tags(pipeline)),
            kinds=self.get_kinds(pipeline), code_version=self.get_code_version(pipeline),
            group_name=self.get_group_name(pipeline), metadata=dict(self.get_metadata(pipeline)),
        )


__all__ = ["EmatixTranslator"]
