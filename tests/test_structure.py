"""The app's shape: imports go one way, modules stay small, functions stay short.

These read the source, so a new import cycle (function-level imports count),
a crowded module or a sprawling function fails here before review.
"""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "approvals"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
#: The ground floor imports nothing of the app above it.
GROUND = {
    "approvals.errors",
    "approvals.permissions",
    "approvals.conf",
    "approvals._compat",
    "approvals.events",
    "approvals.signals",
    "approvals.waiting",
    "approvals.hooks",
    "approvals.keyread",
}
#: The transport knows no decisions, rules, HTTP or pages.
TRANSPORT = {
    "approvals.listener",
    "approvals.channellink",
    "approvals.dbtail",
    "approvals.leases",
    "approvals.dbwatch",
    "approvals.inotify",
    "approvals.pgnotify",
    "approvals.rowread",
    "approvals.listenhooks",
}
#: Imports nothing of the app at all (a wrapper of the operating system).
STANDALONE = {"approvals.inotify"}
ABOVE_TRANSPORT = {
    "approvals.decisions",
    "approvals.rules",
    "approvals.sweep",
    "approvals.gate",
    "approvals.views",
    "approvals.consumers",
    "approvals.payloads",
    "approvals.jsonapi",
    "approvals.pages",
    "approvals.admin",
    "approvals.announce",
    "approvals.outbox",
    "approvals.notify_worker",
    "approvals.review",
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in APP.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(APP.parent).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__")
        found[name] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        out.update(t for t in targets if t in known and t != name)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, seen, stack = [], set(), []

    def visit(node: str) -> None:
        if node in stack:
            cycles.append(stack[stack.index(node) :] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for target in sorted(graph[node]):
            visit(target)
        stack.pop()

    for node in sorted(graph):
        visit(node)
    return cycles


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    found, todo = set(), [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in found:
                found.add(target)
                todo.append(target)
    return found


def test_the_ground_floor_imports_nothing_above_it():
    graph = _graph()
    for name in GROUND:
        assert _reaches(graph, name) <= GROUND, name


def test_the_transport_knows_no_decisions_rules_or_http():
    graph = _graph()
    for name in TRANSPORT:
        above = {m for m in _reaches(graph, name) if m.split(".")[:2] != ["approvals", "models"]}
        assert not {m for m in above if any(m.startswith(a) for a in ABOVE_TRANSPORT)}, name


def test_standalone_modules_import_nothing_of_the_app():
    graph = _graph()
    for name in STANDALONE:
        assert graph[name] == set(), name


def test_modules_stay_under_400_lines():
    long = {
        str(path.relative_to(APP.parent)): n
        for path in _modules().values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_functions_stay_under_60_lines():
    long = {}
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(APP.parent)}:{node.name}"] = n
    assert long == {}


def test_adapters_reach_the_app_only_through_the_gate():
    graph = _graph()
    allowed = {"approvals.gate", "approvals.deferred", "approvals.integrations"}
    for name in ("approvals.integrations.pydantic_ai", "approvals.integrations.openai_agents"):
        direct = {m for m in graph[name] if not m.startswith("approvals.integrations")}
        assert direct <= allowed, name


def test_the_decision_path_knows_no_notifications():
    graph = _graph()
    notifications = {"approvals.outbox", "approvals.notify_worker", "approvals.notify_bodies"}
    for name in ("approvals.decisions", "approvals.gating", "approvals.sweep"):
        assert not _reaches(graph, name) & notifications, name
