"""The package's import graph: no cycles, and no import from a lower layer to a higher one.

Every module under obsspec/ is parsed with `ast` (imports inside functions count too: a lazy
import is still a dependency). The layers, bottom to top (README.md, "Layout"):

- base       chat, tokens, commands, fields, jsonl, progress, env/, engines/
- rollout    rollout/ (the episode loop, predictors, tools), sim/ (the rollout simulator)
- config     the recipe: obsspec/config.py and the sections it is made of
- models     models/, worldmodel/, build.py (a recipe's engines, predictors and tools), and
             rollout_run.py (`obsspec rollout`, which builds through build.py)
- training   training/
- export     export/: a finished (or killed) run's checkpoints into model folders
- consumers  ui/, report/: they read events and run directories, never the trainer
- top        cli.py, demo.py, __main__.py

A module may import its own layer and the layers ALLOWED names for it, nothing else; and
nothing (here or in bench/) imports another module's private name.

Run: .venv/bin/python -m pytest -q tests/test_imports.py
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "obsspec"

# (layer, module prefixes): the first matching row names a module's layer (longest prefix wins)
LAYERS = {
    "base": ["obsspec", "obsspec.chat", "obsspec.tokens", "obsspec.commands", "obsspec.fields",
             "obsspec.jsonl", "obsspec.progress", "obsspec.env", "obsspec.engines"],
    "rollout": ["obsspec.rollout", "obsspec.sim"],
    "config": ["obsspec.config", "obsspec.rollout.config", "obsspec.models.config",
               "obsspec.worldmodel.config", "obsspec.training.config"],
    "models": ["obsspec.models", "obsspec.worldmodel", "obsspec.build", "obsspec.rollout_run"],
    "training": ["obsspec.training"],
    "export": ["obsspec.export"],
    "consumers": ["obsspec.ui", "obsspec.report"],
    "top": ["obsspec.cli", "obsspec.demo", "obsspec.__main__"],
}
# what each layer may import besides itself
ALLOWED = {
    "base": set(),
    "rollout": {"base"},
    "config": {"base", "rollout"},
    "models": {"base", "rollout", "config"},
    "training": {"base", "rollout", "config", "models"},
    "export": {"base", "rollout", "config", "models", "training"},
    "consumers": {"base", "rollout", "config"},
    "top": {"base", "rollout", "config", "models", "training", "export", "consumers"},
}


def modules(package: pathlib.Path = PACKAGE) -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The obsspec modules `name` imports (a package's own __init__ when the target is a name
    defined in it, the module itself when the target is a submodule)."""

    def owner(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == "obsspec":
                module = owner(target)
                if module and module != name:
                    found.add(module)
    return found


def layer_of(module: str) -> str:
    best = max(((prefix, layer) for layer, prefixes in LAYERS.items() for prefix in prefixes
                if module == prefix or module.startswith(prefix + ".")), key=lambda p: len(p[0]))
    return best[1]


def graph(package: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    found = modules(package)
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
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
                found.append(_cycle_through(sorted(component), edges))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _cycle_through(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A closed path start -> ... -> start inside one strongly connected component."""
    members, start = set(component), component[0]
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for w in sorted(edges[path[-1]] & members):
            if w == start:
                return path + [start]
            if w not in seen:
                seen.add(w)
                paths.append(path + [w])
    return component


def upward(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(edges.items()):
        mine = layer_of(module)
        for target in sorted(targets):
            theirs = layer_of(target)
            if theirs != mine and theirs not in ALLOWED[mine]:
                bad.append(f"{module} ({mine}) -> {target} ({theirs})")
    return bad


# ---------------------------------------------------------------------------------------------


def test_every_module_has_a_layer():
    for module in modules():
        assert layer_of(module) in ALLOWED, module


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "import cycles (each one closed path):\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    bad = upward(graph())
    assert not bad, "imports against the layering (module (layer) -> module (layer)):\n" + "\n".join(bad)


def test_nothing_imports_a_private_name_of_another_module():
    """A private name: `from obsspec.x import _name` reaches into another module."""
    bad = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "bench").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("obsspec")):
                bad += [f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name} from {node.module}"
                        for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad, "private names imported from another module:\n" + "\n".join(bad)


def test_the_checks_see_a_cycle_and_an_upward_import(tmp_path):
    package = tmp_path / "obsspec"
    (package / "env").mkdir(parents=True)
    (package / "training").mkdir()
    for init in (package, package / "env", package / "training"):
        (init / "__init__.py").write_text("")
    (package / "chat.py").write_text("from obsspec import tokens\n")
    (package / "tokens.py").write_text("def f():\n    from .chat import render\n")
    (package / "env" / "suite.py").write_text("from obsspec.training.grpo import TrainError\n")
    (package / "training" / "grpo.py").write_text("")
    edges = graph(package)
    assert cycles(edges) == [["obsspec.chat", "obsspec.tokens", "obsspec.chat"]]
    assert upward(edges) == ["obsspec.env.suite (base) -> obsspec.training.grpo (training)"]
