"""No module of fedsim imports (at module level) from a layer above its own."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "fedsim"
# lowest first; a module may import its own layer and those below
LAYERS = [
    ["fedsim", "fedsim.errors", "fedsim.files", "fedsim.config"],
    ["fedsim.traces", "fedsim.data"],
    ["fedsim.training"],
    ["fedsim.algorithms"],
    ["fedsim.sim"],
    ["fedsim.results", "fedsim.runs.callbacks", "fedsim.runs.replay", "fedsim.runs.trackers"],
    ["fedsim.runs.experiment"],
    ["fedsim.runs", "fedsim.runs.comparison"],
    ["fedsim.studies"],
    ["fedsim.cli", "fedsim.__main__"],
]

def layer_of(module: str) -> int:
    best = max((prefix for layer in LAYERS for prefix in layer
                if module == prefix or module.startswith(prefix + ".")), key=len)
    return next(i for i, layer in enumerate(LAYERS) if best in layer)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.Module) -> set[str]:
    """fedsim modules imported at module level (`from fedsim.x import y` counts as fedsim.x.y
    when y is a submodule)."""
    return fedsim_imports(tree.body)


def fedsim_imports(nodes) -> set[str]:
    """The fedsim modules that these import statements import."""
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fedsim")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fedsim"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (PACKAGE.parent / Path(*sub.split("."))).with_suffix(".py").exists() or \
                    (PACKAGE.parent / Path(*sub.split("."))).is_dir()
                found.add(sub if is_module else node.module)
    return found


def test_no_module_imports_from_a_layer_above_it():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        for target in imported(ast.parse(path.read_text())):
            if layer_of(target) > layer_of(name):
                upward.append(f"{name} -> {target}")
    assert not upward, upward


def test_the_layer_map_knows_every_module():
    for path in PACKAGE.rglob("*.py"):
        layer_of(module_name(path))  # raises if no prefix matches


def every_import(tree: ast.Module, name: str) -> set[str]:
    """The fedsim modules `name` imports anywhere (also inside functions), but not those
    imported for type annotations only (under `if TYPE_CHECKING:`)."""
    annotations_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                        and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
                        for n in ast.walk(node)}
    return fedsim_imports(n for n in ast.walk(tree) if id(n) not in annotations_only) - {name}


def test_no_import_circle_between_modules():
    """Following every import (lazy ones too) from any module never leads back to it."""
    graph = {module_name(path): every_import(ast.parse(path.read_text()), module_name(path))
             for path in PACKAGE.rglob("*.py")}
    circles = []
    for start in graph:
        seen, stack = set(), [(start, (start,))]
        while stack:
            module, path = stack.pop()
            for target in graph.get(module, ()):
                if target == start:
                    circles.append(" -> ".join((*path, start)))
                elif target in graph and target not in seen:
                    seen.add(target)
                    stack.append((target, (*path, target)))
    assert not circles, circles[:5]


def test_the_top_of_the_package_holds_at_most_five_modules():
    """The CLI, errors and file helpers (and the package's own files); the rest is in packages by role."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "cli.py", "errors.py", "files.py"], loose

