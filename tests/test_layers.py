"""Layering: ``state_store`` is the bottom layer and imports nothing else of this project; ``sql``
(reading the SQL at load time) imports only sqlglot, the standard library, the errors and the column
names; ``spec`` imports only the layers below it; ``streaming`` (pure driver logic) imports no Spark;
and no two modules of the project import each other, however indirectly.

The checks are static (``ast``): every ``import`` / ``from ... import`` anywhere in a module
counts, including those inside functions and ``try`` blocks, so an import that only runs on some
path cannot slip through. ``if TYPE_CHECKING:`` blocks count too, for the layers and for the import
cycles (two modules that need each other's types are one module's worth of design, split); they
are left out only where the question is what runs (Spark in ``streaming``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
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
            found.append((node.lineno, _from_module(node, package)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))  # importlib.import_module("...")
    return found


def _from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute module of ``from <module> import ...``, a relative one resolved against ``package``."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else []))


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """The lines of every ``if TYPE_CHECKING:`` block (imports that never run)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


#: The packages ``pyproject.toml`` installs: the modules whose imports of each other are checked.
INSTALLED = ("ematix_dagster", "state_store", "pipelines")


def _project_modules(root: Path = ROOT) -> dict[str, Path]:
    return {_module_name(p, root): p for package in INSTALLED if (root / package).is_dir()
            for p in sorted((root / package).rglob("*.py"))}


def _import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project's modules it imports (anywhere, ``if TYPE_CHECKING:`` blocks included).

    ``import a.b`` and ``from a import b`` (``b`` a module) both name ``a.b``; ``from a.b import f``
    names ``a.b``. The packages a module's parents are (their ``__init__``) are not edges of their
    own: Python runs them first whatever is imported, and counting them would make every package
    that imports its own submodules a cycle.
    """
    modules = _project_modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        named: list[str] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                named += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _from_module(node, package)
                named += [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for name in named:
            parts = name.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()  # ``import a.b.f``-like names: the module that holds them
            if parts and ".".join(parts) != module:
                graph[module].add(".".join(parts))
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's algorithm):
    each a set of modules that import each other, directly or not; sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _cycle_path(graph: dict[str, set[str]], component: list[str]) -> str:
    """One loop through ``component``, as ``a -> b -> a``, for a message."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    pending = [start]
    while pending:
        node = pending.pop(0)
        for other in sorted(graph[node] & members):
            if other == start:
                return " -> ".join(paths[node] + [start])
            if other not in paths:
                paths[other] = paths[node] + [other]
                pending.append(other)
    return ", ".join(component)



def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_import_graph_is_found():
    graph = _import_graph()
    assert {"ematix_dagster.spark.sources.readers", "ematix_dagster.spark.input.input_files", "ematix_dagster.spark.failures.read_errors",
            "state_store.names", "pipelines.definitions"} <= set(graph)
    assert "ematix_dagster.spark.failures.read_errors" in graph["ematix_dagster.spark.failures.classify"]
    assert "state_store.names" in graph["state_store.migrations"]


def test_the_cycle_finder_counts_imports_inside_functions_and_type_checking(tmp_path):
    pkg = tmp_path / "state_store"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from state_store import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("import state_store.a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from state_store.a import x\n")
    (pkg / "e.py").write_text("from state_store.d import y\n")
    (pkg / "f.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from state_store.g import x\n")
    (pkg / "g.py").write_text("from state_store.f import y\n")
    graph = _import_graph(tmp_path)
    assert graph["state_store.a"] == {"state_store.b"} and graph["state_store.d"] == {"state_store.a"}
    assert _cycles(graph) == [["state_store.a", "state_store.b", "state_store.c"], ["state_store.f", "state_store.g"]]
    assert _cycle_path(graph, _cycles(graph)[0]) == "state_store.a -> state_store.b -> state_store.c -> state_store.a"


def test_no_import_cycle_at_all():
    graph = _import_graph()
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(_cycle_path(graph, c) for c in cycles)


def test_streaming_imports_no_spark():
    """``streaming`` is the driver's pure logic: it runs (and is tested) without pyspark or py4j.
    The aggregators' Spark halves take the pyspark side as an argument; their ``Column`` type hints
    sit under ``if TYPE_CHECKING:`` and do not count."""
    offending = []
    for path in sorted((ROOT / "ematix_dagster" / "streaming").rglob("*.py")):
        skipped = _type_checking_lines(ast.parse(path.read_text(encoding="utf-8")))
        for line, name in _imports(path):
            if line not in skipped and name.split(".")[0] in ("pyspark", "py4j"):
                offending.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    assert not offending, "streaming must not import Spark:\n" + "\n".join(offending)


def test_input_files_reads_and_the_batch_step_retries():
    """``spark/input/input_files.py`` returns frames and left-out files to the batch step, which owns the
    retries: it imports neither the batch step nor what a batch produces (``streaming``)."""
    path = ROOT / "ematix_dagster" / "spark" / "input" / "input_files.py"
    above = ("ematix_dagster.streaming", "ematix_dagster.spark.batch.batch_step", "ematix_dagster.spark.runner")
    offending = [f"line {line}: imports {name}" for line, name in _imports(path) if _in(name, above)]
    assert not offending, "input_files must not drive the batch:\n" + "\n".join(offending)


def test_classifying_a_failure_loads_no_spark():
    """The CLI and the Dagster asset module import ``spark.failures.classify`` when they load; that must not
    start importing pyspark (``read_errors`` reads Spark's texts only)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import ematix_dagster.spark.failures.classify; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j')))")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def _spec_imports_above_it() -> list[str]:
    allowed = ("ematix_dagster.spec", "ematix_dagster.sql", "ematix_dagster.columns", "ematix_dagster.errors",
               "state_store.errors")
    project = _project_packages()
    offending = []
    for path in sorted((ROOT / "ematix_dagster" / "spec").rglob("*.py")):
        for line, name in _imports(path):
            if name.split(".")[0] in project and not _in(name, allowed):
                offending.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    return offending


def test_spec_imports_nothing_above_it():
    """``spec`` (the pipeline's description) is below every layer that uses it: it imports only
    itself, the engine's column names (``columns``) and the errors: no ``spark``, ``streaming``,
    ``dagster``, ``targets``, stores."""
    offending = _spec_imports_above_it()
    assert not offending, "spec must not import the layers above it:\n" + "\n".join(offending)


def test_sql_imports_only_sqlglot_and_the_bottom():
    """``sql`` reads the pipeline's SQL while the spec loads (``spec`` calls it), so it sits below
    ``spec``: it imports only itself, the errors and the column names of the project, and only
    sqlglot and the standard library outside it: no ``spec``, ``spark`` (no pyspark), ``streaming``."""
    allowed = ("ematix_dagster.sql", "ematix_dagster.columns", "ematix_dagster.errors")
    project = _project_packages()
    offending = []
    for path in sorted((ROOT / "ematix_dagster" / "sql").rglob("*.py")):
        for line, name in _imports(path):
            top = name.split(".")[0]
            outside = top not in project and top not in sys.stdlib_module_names and top not in ("sqlglot", "__future__")
            if outside or (top in project and not _in(name, allowed)):
                offending.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    assert (ROOT / "ematix_dagster" / "sql" / "release_plan.py").exists()
    assert not offending, "sql must import only sqlglot, the standard library, errors and columns:\n" + \
        "\n".join(offending)


def test_the_spec_registries_are_explicit_and_need_no_streaming():
    """``spec`` lists the window kinds and aggregations it accepts (``spec.window``): a spec loaded
    in a fresh interpreter validates against the full lists without importing ``streaming``. The
    engine's registries are built from lists of their own, and name exactly what the spec accepts."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from ematix_dagster.spec.window import "
            "AGGREGATIONS, WINDOW_KINDS; print(sorted(WINDOW_KINDS), len(AGGREGATIONS), "
            "[m for m in sys.modules if m.startswith('ematix_dagster.streaming')])")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, check=True)
    from ematix_dagster.spec.window import AGGREGATIONS, ALL_WINDOW_KINDS, WINDOW_KINDS
    from ematix_dagster.streaming.aggregators import AGGREGATORS
    from ematix_dagster.streaming.kinds import KINDS, KINDS_BY_NAME

    assert out.stdout.strip() == f"{sorted(WINDOW_KINDS)} {len(AGGREGATIONS)} []", out.stdout + out.stderr
    assert WINDOW_KINDS == {spec.name: spec for spec in ALL_WINDOW_KINDS}
    assert tuple(AGGREGATORS) == AGGREGATIONS
    assert KINDS_BY_NAME == {spec.name: kind for kind in KINDS for spec in kind.specs}
    assert all(WINDOW_KINDS[spec.name] is spec for kind in KINDS for spec in kind.specs)
    assert set(KINDS_BY_NAME) == set(WINDOW_KINDS)


def test_state_store_modules_are_found():
    modules = sorted((ROOT / BOTTOM).rglob("*.py"))
    names = {p.name for p in modules}
    assert {"__init__.py", "contract.py", "codec.py", "postgres_store.py", "sqlite.py", "memory.py"} <= names


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
                 "StorePermissionError", "LeaseHeld", "LeaseLost", "StateVersionError", "CorruptState"):
        assert getattr(upper, name) is getattr(lower, name), name
    assert issubclass(upper.PipelineConfigError, lower.ConfigError)
    assert not lower.StoreUnavailable.terminal and lower.StoreConfigError.terminal


def test_a_bad_store_setting_is_a_config_error_without_the_password():
    from state_store.errors import ConfigError, StoreConfigError
    from state_store.postgres_store import PostgresStateStore

    with pytest.raises(StoreConfigError, match=r"^state_store\.schema: must be a non-empty schema name$"):
        PostgresStateStore("postgresql://u@h/db", "")
    store = PostgresStateStore("postgresql://u:s3cret@h:5/db?bad_option=1 =", "ematix")
    assert "s3cret" not in store.description
    with pytest.raises(ConfigError) as info:
        store.open()
    assert str(info.value) == ("state_store.url: is not a valid PostgreSQL connection URL (fix: use "
                               "postgresql://user@host:port/database with the password in the environment)")
    assert info.value.__cause__ is None and info.value.__context__ is None
