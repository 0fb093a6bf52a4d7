"""State sizing of a spec's window (docs/contract/failure-modes.md#caps-fail-loud): the upper bound ``estimate_state``
gives."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ematix_dagster.spark.batch.window_call import WindowCall
from ematix_dagster.spec import Aggregation, PipelineSpec, load_pipeline_str
from ematix_dagster.streaming.state_size import estimate_state
from tests.spec.toml_samples import MINIMAL_TOML

# ---------------------------------------------------------------------------------------------
# State sizing (docs/contract/failure-modes.md#caps-fail-loud)


class _Expected:
    def __init__(self, spec: PipelineSpec) -> None:
        self.spec = spec

    def state_bytes(self) -> int:
        return estimate_state(self.spec.window).total_bytes


def _window(**changes: Any) -> _Expected:
    base = load_pipeline_str(MINIMAL_TOML)
    return _Expected(replace(base, shape=replace(base.window, **changes)).validate())


def test_state_upper_bound_tumbling_is_one_window() -> None:
    spec = _window(duration_ms=60_000, max_groups_per_window=1_000)
    assert spec.state_bytes() > 0
    bigger = _window(duration_ms=60_000, max_groups_per_window=2_000)
    assert bigger.state_bytes() == 2 * spec.state_bytes()
    # Window width alone does not change a tumbling bound.
    assert _window(duration_ms=3_600_000, max_groups_per_window=1_000).state_bytes() \
        == spec.state_bytes()


@pytest.mark.parametrize(("hop_ms", "active"), [(60_000, 1), (30_000, 2), (15_000, 4), (7_000, 9), (1_000, 60)])
def test_state_upper_bound_grows_with_hopping_overlap(hop_ms: int, active: int) -> None:
    one = _window(duration_ms=60_000).state_bytes()
    hopping = _window(kind="hopping", duration_ms=60_000, hop_ms=hop_ms).state_bytes()
    assert hopping == active * one  # ceil(duration / hop) windows hold each row


@pytest.mark.parametrize(
    ("kind", "hop_ms", "allowed", "active"),
    [("tumbling", None, 60_000, 2), ("tumbling", None, 120_000, 3), ("tumbling", None, 1, 2),
     ("hopping", 30_000, 120_000, 6), ("hopping", 20_000, 30_000, 5)],
)
def test_state_upper_bound_grows_with_reopen_retention(kind: str, hop_ms: int | None, allowed: int,
                                                       active: int) -> None:
    one = _window(duration_ms=60_000).state_bytes()
    drop = _window(kind=kind, duration_ms=60_000, hop_ms=hop_ms).state_bytes()
    reopen = _window(kind=kind, duration_ms=60_000, hop_ms=hop_ms, late_data="reopen",
                     allowed_lateness_ms=allowed).state_bytes()
    assert reopen == active * one  # ceil((duration + allowed_lateness) / hop)
    assert reopen > drop


def test_state_upper_bound_counts_windows_held_open_by_lateness() -> None:
    one = _window(duration_ms=60_000).state_bytes()
    # lateness_ms = 10 min keeps the last ~11 one-minute windows open before the watermark passes them.
    assert _window(duration_ms=60_000, lateness_ms=600_000).state_bytes() == 11 * one


def test_state_upper_bound_reflects_aggregation_state() -> None:
    count = _window(aggregations=(Aggregation("count", "n"),)).state_bytes()
    hll14 = _window(aggregations=(Aggregation("count_distinct", "d", column="x"),)).state_bytes()
    hll16 = _window(aggregations=(Aggregation("count_distinct", "d", column="x"),),
                    hll_precision=16).state_bytes()
    exact = _window(aggregations=(Aggregation("count_distinct", "d", column="x", mode="exact",
                                              max_distinct_values_per_group=10_000),)).state_bytes()
    assert count < hll14 < hll16
    assert hll14 >= 10 * (1 << 14)  # ~16 KB per group at p=14, 10 groups
    # an exact set is counted empty, its values as a rate: the spec cannot know how full sets get
    assert count < exact < hll14
    assert estimate_state(replace(load_pipeline_str(MINIMAL_TOML).window, max_groups_per_window=100_000,
                                  aggregations=(Aggregation("count_distinct", "d", column="x", mode="exact",
                                                            max_distinct_values_per_group=100_000),))
                          ).total_bytes < (1 << 30)  # two caps multiplied would claim hundreds of GiB


def test_the_start_warning_names_an_upper_bound_and_what_makes_it() -> None:
    """The warning a large cap gives at start says it is a bound reached only at the cap, not an expectation
    (a demo holding a few groups read as one about to take gigabytes)."""
    window = replace(load_pipeline_str(MINIMAL_TOML).window, max_groups_per_window=50_000_000,
                     aggregations=(Aggregation("count", "n"),))
    spec = replace(load_pipeline_str(MINIMAL_TOML), shape=window)
    estimate = estimate_state(window)
    (warning,) = WindowCall.start_warnings(spec)
    mib = f"{estimate.total_bytes / (1 << 20):,.0f}"
    assert warning == (f"window state may take at most {mib} MiB, an upper bound reached only when every one of "
                       f"{estimate.open_windows} open windows holds max_groups_per_window = 50,000,000 groups of "
                       f"{estimate.bytes_per_group} bytes; lower max_groups_per_window or hll_precision if that is "
                       "more than this machine has")
    assert WindowCall.start_warnings(load_pipeline_str(MINIMAL_TOML)) == []  # a small cap warns of nothing
