"""Which post-SQL rows of a windowed pipeline carry ``_source_row`` (``[dead_letter] include_source_row``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ematix_dagster.spark.plans.safe_sql import SourceRow
from ematix_dagster.spark.plans.window_plan import VIEW, source_row
from ematix_dagster.spec import load_pipeline_str
from tests.spec.toml_samples import FULL_TOML


@pytest.mark.parametrize(("choice", "expected"), [
    ("sql_error", SourceRow(VIEW)), ("all", SourceRow(VIEW, every_row=True)), ("none", None)])
def test_the_choice_decides_the_guard_s_column(choice, expected):
    spec = load_pipeline_str(FULL_TOML)
    assert spec.dead_letter is not None
    assert source_row(replace(spec, dead_letter=replace(spec.dead_letter, include_source_row=choice))) == expected
    assert source_row(replace(spec, dead_letter=None)) is None, "no dead letters: nothing to carry it"
