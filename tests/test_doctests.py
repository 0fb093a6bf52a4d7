"""Every doctest in the project's packages runs and passes (``ematix_dagster``, ``state_store``).

A module is imported to be tested, so the list is every module that imports without optional
extras; the Dagster code location's definitions are loaded by their own tests. ``ematix_dagster.airflow``
(the ``airflow`` extra) is left out: importing Airflow configures the process's logging and creates
``$AIRFLOW_HOME``, so only tests/airflow, which points ``AIRFLOW_HOME`` at a directory of its own,
imports it.
"""

from __future__ import annotations

import doctest
import importlib
import os
import pkgutil

import pytest

import ematix_dagster
import state_store

OPTIONAL = "ematix_dagster.airflow"  # the airflow extra's package


def _modules(path: list[str], prefix: str) -> list[str]:
    """The modules under ``path``, without importing a package to walk it (``pkgutil.walk_packages``
    would import the optional one)."""
    found = []
    for info in pkgutil.iter_modules(path, prefix):
        if info.name == OPTIONAL:
            continue
        found.append(info.name)
        if info.ispkg:
            found += _modules([os.path.join(path[0], info.name.rsplit(".", 1)[-1])], f"{info.name}.")
    return found


def _doctest_modules() -> list[str]:
    names = ["ematix_dagster", "state_store"]
    for package in (ematix_dagster, state_store):
        names += _modules(list(package.__path__), f"{package.__name__}.")
    return sorted(names)


@pytest.mark.parametrize("module", _doctest_modules())
def test_doctests(module: str) -> None:
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{module}: {result.failed} doctest failure(s)"


def test_doctests_exist() -> None:
    total = sum(doctest.testmod(importlib.import_module(m)).attempted for m in _doctest_modules())
    assert total >= 40
