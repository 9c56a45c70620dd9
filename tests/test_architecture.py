"""The tree keeps the shape docs/architecture.md draws: no import cycles, heavy libraries only where a job
runs, gradio only in ui/, and the document names every package there is."""
from __future__ import annotations

import ast
import gc
import re
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("engine", "ui")
HEAVY = ("torch", "diffusers", "transformers", "safetensors.torch")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(path: Path, top_only: bool = False) -> list[tuple[str, int]]:
    """(module named, line) of every import in ``path``, skipping ``if TYPE_CHECKING:`` blocks; with
    ``top_only``, only those at module level."""
    source = path.read_text()
    # A finalizer that the garbage collector runs in the middle of parsing (an earlier test's leftovers) trips
    # CPython 3.11's "AST constructor recursion depth mismatch": no collection during the parse.
    gc.disable()
    try:
        tree = ast.parse(source)
    finally:
        gc.enable()
    found = []

    def visit(node, depth: int):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not (top_only and depth):
                found.extend((f"{node.module}.{alias.name}", node.lineno) for alias in node.names)
                found.append((node.module, node.lineno))
        elif isinstance(node, ast.Import) and not (top_only and depth):
            found.extend((alias.name, node.lineno) for alias in node.names)
        inner = depth + isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, 0)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {imported for imported, _ in _imports(path) if imported in modules and imported != name
                   and not name.startswith(imported + ".")}
            for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that import one another (strongly connected, more than one module)."""
    order, low, stack, on_stack, groups = {}, {}, [], set(), []

    def walk(module):
        order[module] = low[module] = len(order)
        stack.append(module)
        on_stack.add(module)
        for other in graph[module]:
            if other not in order:
                walk(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                groups.append(sorted(group))

    for module in graph:
        if module not in order:
            walk(module)
    return groups


def test_no_module_imports_one_that_imports_it_back():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_engine_never_imports_gradio():
    offenders = [(name, line) for name, path in _modules().items() if name.startswith("engine")
                 for imported, line in _imports(path) if imported.split(".")[0] == "gradio"]
    assert offenders == []


def test_torch_and_diffusers_load_only_when_a_job_needs_them():
    """No module imports them at module level (the page and the CLI start light); planning and settings
    never import them at all (the planner is pure)."""
    at_top = [(name, imported) for name, path in _modules().items() for imported, _ in _imports(path, top_only=True)
              if imported.startswith(HEAVY)]
    assert at_top == []
    pure = [(name, imported) for name, path in _modules().items()
            if name.startswith(("engine.planning", "engine.settings", "ui.views"))
            for imported, _ in _imports(path) if imported.startswith(HEAVY)]
    assert pure == []


def test_the_architecture_document_names_every_package():
    text = (ROOT / "docs" / "architecture.md").read_text()
    packages = sorted(str(p.parent.relative_to(ROOT)) for package in PACKAGES
                      for p in (ROOT / package).rglob("__init__.py"))
    named = set(re.findall(r"`((?:engine|ui)(?:/\w+)?)/`", text))
    assert named == set(packages), (sorted(named), packages)


def test_both_kinds_of_engines_have_what_the_page_uses_with_its_parameters(tmp_path):
    """WorkerClient (one engine process) and EnginePool (one per GPU) are the same Engines to the page and the
    command line: every member, and every parameter of each method (by name, with its default kept optional)."""
    import inspect

    from engine.service.engines import MEMBERS, Engines
    from engine.service.pool import EnginePool
    from engine.service.worker import WorkerClient

    declared = {name for name in vars(Engines) if not name.startswith("_")} | set(Engines.__annotations__)
    assert declared == set(MEMBERS)
    for made in (WorkerClient(tmp_path), EnginePool(tmp_path)):
        for name in MEMBERS:
            assert hasattr(type(made), name) or hasattr(made, name), (type(made).__name__, name)
            wanted = getattr(Engines, name, None)
            if not inspect.isfunction(wanted):
                continue
            have = inspect.signature(getattr(type(made), name)).parameters
            for parameter in inspect.signature(wanted).parameters.values():
                assert parameter.name in have, (type(made).__name__, name, parameter.name)
                if parameter.default is not inspect.Parameter.empty:
                    assert have[parameter.name].default is not inspect.Parameter.empty, (name, parameter.name)


# The engine's packages from the bottom up: a module may import its own package and those below it, never one
# above (TYPE_CHECKING imports and imports inside functions included). The top-level modules (events, words,
# errors, atomic, folders) are the bottom; ui/ and app.py sit above the whole engine.
LAYERS = ("events", "words", "errors", "atomic", "folders", "device", "models", "settings", "planning", "outputs",
          "run", "service")


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[0] == "engine" and parts[1] in LAYERS else None


def _upward_imports() -> set[tuple[str, str]]:
    found = set()
    for path in (ROOT / "engine").rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        own = _layer(module)
        if own is None:
            continue
        gc.disable()
        try:
            tree = ast.parse(path.read_text())
        finally:
            gc.enable()
        for node in ast.walk(tree):   # every import: module level, in functions, under TYPE_CHECKING
            named = [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else \
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            for name in named:
                layer = _layer(name)
                if layer is not None and layer > own:
                    found.add((path.relative_to(ROOT).as_posix(), ".".join(name.split(".")[:3])))
    return found


def test_the_engine_s_packages_import_only_their_own_layer_and_those_below():
    upward = _upward_imports()
    assert not upward, f"imports that go up the layers: {sorted(upward)}"


def test_the_layer_check_sees_imports_in_functions_and_type_checking_blocks(tmp_path, monkeypatch):
    import tests.test_architecture as here

    engine = tmp_path / "engine" / "models"
    engine.mkdir(parents=True)
    (engine / "late.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                    "    from engine.run.engine import Engine\n"
                                    "def f():\n    import engine.service.worker\n")
    monkeypatch.setattr(here, "ROOT", tmp_path)
    assert here._upward_imports() == {("engine/models/late.py", "engine.run.engine"),
                                      ("engine/models/late.py", "engine.service.worker")}


# The most lines a module and a function may have; a longer function says why in a comment among its first lines.
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60


def test_modules_stay_short_and_a_long_function_says_why():
    long_files, unexplained = [], []
    paths = [ROOT / "app.py", *(p for folder in (*PACKAGES, "bench") for p in (ROOT / folder).rglob("*.py"))]
    for path in paths:
        source = path.read_text()
        lines = source.splitlines()
        if len(lines) > MAX_FILE_LINES:
            long_files.append((str(path.relative_to(ROOT)), len(lines)))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                start = node.body[0].lineno - 1
                head = lines[start:start + 8]
                if not any(line.strip().startswith("#") for line in head):
                    unexplained.append((str(path.relative_to(ROOT)), node.name, node.end_lineno - node.lineno + 1))
    assert long_files == [], f"modules over {MAX_FILE_LINES} lines: {long_files}"
    assert unexplained == [], f"functions over {MAX_FUNCTION_LINES} lines without a comment saying why: {unexplained}"
