"""Generated bad pipeline files: every key of the reference TOML with its type or range perturbed.

Whatever a perturbation does, loading the file either gives a valid spec or refuses it with a
``ConfigError`` naming a key (the CLI's exit 2); never another exception. The perturbations come from
their own small tables here (other types, boundary numbers, odd strings), not from the spec's rules.
"""

from __future__ import annotations

import tomllib
from typing import Any

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ematix_dagster.errors import ConfigError
from ematix_dagster.spec import load_pipeline_str
from tests.spec.toml_samples import FULL_TOML, ROW_TOML


def leaves(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every scalar in a TOML document (a table's key, an array's index)."""
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in leaves(v, (*path, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in leaves(v, (*path, i))]
    return [path]


def replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    """``doc`` with the scalar at ``path`` replaced by ``value`` (None: the key removed)."""
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        out = dict(doc)
        if rest:
            out[head] = replaced(doc[head], rest, value)
        elif value is None:
            del out[head]
        else:
            out[head] = value
        return out
    out_list = list(doc)
    out_list[head] = replaced(doc[head], rest, value) if rest else value
    return [v for v in out_list if v is not None]


# values of other types and at the edges of ranges, chosen without reading the spec's rules
ODD_VALUES = st.one_of(
    st.none(),  # the key left out
    st.sampled_from([0, -1, 1, 2 ** 31, 2 ** 63 - 1, -(2 ** 63), 10 ** 30]),
    st.sampled_from([0.0, -0.5, 1e300, float("inf"), float("nan")]),
    st.booleans(),
    st.sampled_from(["", " ", "x" * 300, "${UNSET_VARIABLE_FOR_TESTS}", "a;b", "\u00e9\u00e8", "-1", "true",
                     "file:///nowhere", "s3://bucket/x", "SELECT 1"]),
    st.text(max_size=12),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.sampled_from(["a", "kind", "as"]), st.integers(0, 2), max_size=2),
)

BASES = [tomllib.loads(FULL_TOML), tomllib.loads(ROW_TOML)]


@st.composite
def perturbed(draw: st.DrawFn) -> str:
    base = draw(st.sampled_from(BASES))
    path = draw(st.sampled_from(leaves(base)))
    return tomli_w.dumps(replaced(base, path, draw(ODD_VALUES)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(perturbed())
def test_a_perturbed_file_loads_or_is_refused_naming_a_key(text: str) -> None:
    try:
        load_pipeline_str(text)
    except ConfigError as exc:
        assert exc.key, f"a refusal names no key: {exc}"
