"""The apps' layers import in one direction only, and no module imports itself back through others.

Layers, bottom to top: core (bot config, reload, process services, logs, the background loop) → chat
(sessions, messages, gateway, send service, agent-turn engine, component registry) → scheduling
(scheduled messages, the life loop) → api (the proactive HTTP API and the MCP endpoint) → plugins (the
plugin host) → console → maibot (the project: settings, URLs, ASGI, websocket routes, commands). A
module may import its own layer and the ones below; nothing is exempt but migrations. Function-level
imports count: a deferred import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.static  # never the database: the PostgreSQL suite leaves it out

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["core", "chat", "scheduling", "api", "plugins", "console", "maibot"]


def _modules() -> dict[str, Path]:
    found = {}
    for package in LAYERS:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Our modules that `name` imports (a `from package import module` names the module)."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def _layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def test_apps_import_only_their_own_layer_and_the_ones_below():
    upward = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        for target in targets
        if _layer(target) > _layer(module)
    ]
    assert upward == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    # Tarjan's strongly connected components: any component of two or more modules is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_module_imports_itself_back_through_others():
    assert _cycles(_graph()) == []


def test_the_checker_sees_an_upward_import(tmp_path):
    # The checker itself must be able to fail: a chat module importing scheduling is reported.
    path = tmp_path / "probe.py"
    path.write_text("def f():\n    from scheduling.models import ScheduledMessage\n")
    assert _imports(path, "chat.probe", set(_modules())) == {"scheduling.models"}


def test_the_checker_sees_the_project_package_as_the_top_layer(tmp_path):
    # core importing the project package (settings, urls, commands) runs up every layer.
    path = tmp_path / "probe.py"
    path.write_text("from maibot import urls\n")
    assert _imports(path, "core.probe", set(_modules())) == {"maibot", "maibot.urls"}
    assert _layer("maibot.urls") > _layer("console.views") > _layer("core.config")


def test_the_checker_sees_a_cycle():
    graph = {"core.a": {"core.b"}, "core.b": {"core.c"}, "core.c": {"core.a"}, "core.d": {"core.a"}}
    assert _cycles(graph) == [["core.a", "core.b", "core.c"]]
