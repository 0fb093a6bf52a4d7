"""The scheduling lists of conftest.py name modules that exist: a renamed module would silently lose its place."""

from pathlib import Path

from tests.conftest import LONGEST_FIRST, SHARED_GROUPS

ROOT = Path(__file__).resolve().parent.parent


def test_every_scheduled_module_exists() -> None:
    modules = [m for m in (*LONGEST_FIRST, *SHARED_GROUPS) if m not in SHARED_GROUPS.values()]
    assert modules and [m for m in modules if not (ROOT / m).is_file()] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    assert not set(LONGEST_FIRST) & set(SHARED_GROUPS), "a module of a group is scheduled by its group's name"
