"""Layering: ``state_store`` is the bottom layer and imports nothing else of this project.

The check is static (``ast``): every ``import`` / ``from ... import`` anywhere in every module
under ``state_store/`` counts, including those inside functions, ``if TYPE_CHECKING:`` blocks and
``try`` blocks, so an import that only runs on some path cannot slip through.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BOTTOM = "state_store"


def _project_packages() -> set[str]:
    """The project's own top-level names: the packages ``pyproject.toml`` installs, and any
    package or module beside them in the repository root."""
    names = {"ematix_dagster", "state_store", "pipelines", "tests", "benchmarks", "scripts"}
    for child in ROOT.iterdir():
        if child.name.startswith((".", "_")):
            continue
        if child.is_dir() and (child / "__init__.py").exists():
            names.add(child.name)
        elif child.suffix == ".py":
            names.add(child.stem)
    return names


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))  # importlib.import_module("...")
    return found


def test_state_store_modules_are_found():
    modules = sorted((ROOT / BOTTOM).rglob("*.py"))
    names = {p.name for p in modules}
    assert {"__init__.py", "base.py", "codec.py", "postgres.py", "sqlite.py", "memory.py"} <= names


def test_state_store_imports_nothing_above_it():
    project = _project_packages() - {BOTTOM}
    offending = []
    for path in sorted((ROOT / BOTTOM).rglob("*.py")):
        for line, name in _imports(path):
            if name.split(".")[0] in project:
                offending.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    assert not offending, "state_store must not import the layers above it:\n" + "\n".join(offending)


def test_relative_imports_resolve_inside_state_store(tmp_path):
    """The resolver itself: ``from ..x import y`` in ``state_store/a/b.py`` is ``state_store.x``, and
    an import inside a function counts."""
    (tmp_path / BOTTOM / "a").mkdir(parents=True)
    mod = tmp_path / BOTTOM / "a" / "b.py"
    mod.write_text("def f():\n    from ..x import y\n    import ematix_dagster.errors\nfrom . import c\n")
    assert sorted(n for _, n in _imports(mod, tmp_path)) == ["ematix_dagster.errors", "state_store.a", "state_store.x"]


def test_the_dagster_layer_re_exports_the_store_errors():
    import ematix_dagster.errors as upper
    import state_store.errors as lower

    for name in ("EmatixError", "ConfigError", "StoreConfigError", "StoreUnavailable", "StoreAccessDenied",
                 "StorePermissionError", "LeaseHeld", "StateVersionError", "CorruptState"):
        assert getattr(upper, name) is getattr(lower, name), name
    assert issubclass(upper.PipelineConfigError, lower.ConfigError)
    assert not lower.StoreUnavailable.terminal and lower.StoreConfigError.terminal


def test_a_bad_store_setting_is_a_config_error_without_the_password():
    from state_store.errors import ConfigError, StoreConfigError
    from state_store.postgres import PostgresStateStore

    with pytest.raises(StoreConfigError, match=r"^state_store\.schema: must be a non-empty schema name$"):
        PostgresStateStore("postgresql://u@h/db", "")
    store = PostgresStateStore("postgresql://u:s3cret@h:5/db?bad_option=1 =", "ematix")
    assert "s3cret" not in store.description
    with pytest.raises(ConfigError) as info:
        store.open()
    assert str(info.value) == ("state_store.url: is not a valid PostgreSQL connection URL (fix: use "
                               "postgresql://user@host:port/database with the password in the environment)")
    assert info.value.__cause__ is None and info.value.__context__ is None
