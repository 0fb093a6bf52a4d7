"""Every doctest in the project's packages runs and passes (``ematix_dagster``, ``state_store``).

A module is imported to be tested, so the list is every module that imports without optional
extras; the Dagster code location's definitions are loaded by their own tests.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import ematix_dagster
import state_store


def _doctest_modules() -> list[str]:
    names = ["ematix_dagster", "state_store"]
    for package in (ematix_dagster, state_store):
        names += [m.name for m in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")]
    return sorted(names)


@pytest.mark.parametrize("module", _doctest_modules())
def test_doctests(module: str) -> None:
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{module}: {result.failed} doctest failure(s)"


def test_doctests_exist() -> None:
    total = sum(doctest.testmod(importlib.import_module(m)).attempted for m in _doctest_modules())
    assert total >= 40
