"""The doctests of ``ematix_dagster.streaming`` (every module) and ``ematix_dagster.spec.window`` run and pass."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import ematix_dagster.streaming


def _doctest_modules() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(ematix_dagster.streaming.__path__, "ematix_dagster.streaming.")]
    return ["ematix_dagster.streaming", *sorted(names), "ematix_dagster.spec.window"]


@pytest.mark.parametrize("module", _doctest_modules())
def test_doctests(module: str) -> None:
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{module}: {result.failed} doctest failure(s)"


def test_doctests_exist() -> None:
    total = sum(doctest.testmod(importlib.import_module(m)).attempted for m in _doctest_modules())
    assert total >= 10
