"""The project's import graph: no circles (lazy imports included), layers kept apart."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ssfl.registry import METHODS
from tests.conftest import ROOT

PACKAGES = ("client_app", "server_app", "strategies", "tasks", "ssfl", "benchmarks")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {
        module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
    }


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules ``path`` imports anywhere in its body (functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and modules[name] != path:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of the graph (one path per strongly connected component)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        for nxt in graph.get(node, ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_cycle_finder_finds_a_hand_made_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_scan_sees_lazy_imports():
    graph = import_graph()
    assert "tasks.data" in graph["ssfl.experiment"]  # imported inside resolve_config
    assert "ssfl.registry" in graph["client_app.app"]


def test_no_import_circles_anywhere():
    assert cycles(import_graph()) == []


def test_a_client_process_never_imports_a_server_half():
    reached = reachable(import_graph(), "client_app.app")
    assert not {m for m in reached if m.startswith(("strategies", "server_app"))}


def test_the_flower_free_layer_imports_no_other_layer():
    graph = import_graph()
    for module, targets in graph.items():
        if module.startswith("tasks"):
            assert all(t.startswith("tasks") for t in targets), (module, targets)


# The YAML reader and the declarations: the only modules that read the config as a dict.
CONFIG_READERS = ("tasks/settings.py", "tasks/config.py", "ssfl/experiment.py")
DICT_READ = re.compile(r"\b(?:cfg|algo)\[")
PAPER_NAMES = ("FedSEAL", "FedMatch", "FedSup", "FedoSSL", "FedRGD", "FixMatch", "SSFL benchmark")


def code_files() -> list[Path]:
    folders = ("ssfl", "strategies", "client_app", "server_app", "tasks", "benchmarks")
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_only_the_yaml_reader_reads_the_config_as_a_dict():
    readers = {ROOT / path for path in CONFIG_READERS}
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in code_files()
        if path not in readers
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if DICT_READ.search(line)
    ]
    assert found == []
    assert DICT_READ.search('x = cfg["split"]') and DICT_READ.search("algo['tau']")


def test_the_round_loop_names_no_method():
    text = (ROOT / "strategies/loop.py").read_text()
    names = [*METHODS, *PAPER_NAMES]
    assert [n for n in names if re.search(rf"\b{re.escape(n)}\b", text, re.I)] == []
