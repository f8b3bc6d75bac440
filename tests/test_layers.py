"""No module of fedsim imports (at module level) from a layer above its own."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "fedsim"
# lowest first; a module may import its own layer and those below
LAYERS = [
    ["fedsim", "fedsim.errors", "fedsim.registry", "fedsim.catalog", "fedsim.files", "fedsim.config",
     "fedsim.config_layers"],
    ["fedsim.traces", "fedsim.data"],
    ["fedsim.training"],
    ["fedsim.algorithms"],
    ["fedsim.sim"],
    ["fedsim.results", "fedsim.callbacks", "fedsim.replay", "fedsim.config_show", "fedsim.trackers"],
    ["fedsim.experiment"],
    ["fedsim.comparison", "fedsim.lockstep"],
    ["fedsim.study", "fedsim.study_ray", "fedsim.study_progress"],
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
    found = set()
    for node in tree.body:
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
