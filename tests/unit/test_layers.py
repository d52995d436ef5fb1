"""The layers the design promises (docs/architecture.md): the calibration core sits below decoding, deployment,
evaluation and the constraints stage, and the shared statistics and readers sit below it. Read from the code's own
imports (every ``import``/``from`` anywhere in a module, lazy ones inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "workflow" / "lara"

# a package (or module) -> the packages it must never import
NEVER = {
    "calibrate": ("decode", "deploy", "evaluate", "constraints", "train", "realtext"),
    "read": ("calibrate", "decode", "deploy", "evaluate", "constraints", "train"),
    "stats": ("calibrate", "decode", "deploy", "evaluate", "constraints", "train", "read"),
}


def imports(path: Path) -> set[str]:
    """Every ``lara.X`` module named by an import in ``path``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m == "lara" or m.startswith("lara.")}


def modules(layer: str) -> list[Path]:
    folder = PACKAGE / layer
    return sorted(folder.rglob("*.py")) if folder.is_dir() else [PACKAGE / f"{layer}.py"]


@pytest.mark.parametrize("layer", sorted(NEVER))
def test_no_layer_imports_a_layer_above_it(layer):
    files = modules(layer)
    assert files and all(f.is_file() for f in files)
    broken = [f"{f.relative_to(PACKAGE)} imports {m}" for f in files for m in sorted(imports(f))
              if m.count(".") and m.split(".")[1] in NEVER[layer]]
    assert not broken, "; ".join(broken)


def test_the_finder_sees_a_lazy_import(tmp_path):
    """The check reads imports inside functions too (a lazy import is still a dependency)."""
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from lara.decode.bon import select\n    import lara.deploy.online\n")
    assert imports(f) == {"lara.decode.bon", "lara.deploy.online"}


def test_no_module_is_over_600_lines():
    long = {str(f.relative_to(PACKAGE)): n for f in PACKAGE.rglob("*.py")
            if (n := len(f.read_text().splitlines())) > 600}
    assert not long, long
