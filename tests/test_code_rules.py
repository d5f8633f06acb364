"""Rules the source tree keeps: one error tree, and packages layered along the data path.

Both are read from the code itself (its syntax tree), so a new raise or a new
import that breaks a rule fails here, with the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "streamrag"

BUILTIN_RAISES = {"ValueError", "KeyError", "RuntimeError", "TypeError", "Exception"}
"""Raised bare, these escape ``except StreamragError``; raise a leaf of ``streamrag.errors``."""

LAYERS: dict[str, int] = {
    "errors": 0,
    "timing": 1,
    "cpus": 1,
    "changes": 2,
    "config": 2,
    "sources": 3,
    "chunking": 3,
    "embed": 3,
    "index": 3,
    "ingest": 4,
    "eventtime": 4,
    "batching": 5,
    "runtime": 6,
    "serve": 7,
    "testing": 8,
    "integrations": 8,
    "cli": 8,
    "__main__": 9,
    "__init__": 9,
}
"""The data path from the bottom up: a module imports only from lower layers (or its own package).

sources read bytes, ingest decodes them into changes, eventtime assigns them to
windows, batching forms micro-batches, chunking and embed turn text into vectors,
index commits them; runtime drives all of that and serve answers from it.
"""


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _unit(path: Path) -> str:
    """The layer unit of a file: its top package under streamrag, or its module name."""
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imported_units(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "streamrag" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


def test_every_module_has_a_layer() -> None:
    units = {_unit(p) for p in _modules()} - {"data"}
    assert units <= set(LAYERS), f"give these a layer in LAYERS: {sorted(units - set(LAYERS))}"


def test_no_package_imports_one_above_it_in_the_data_path() -> None:
    wrong: list[str] = []
    for path in _modules():
        unit = _unit(path)
        if unit not in LAYERS:
            continue
        for line, target in _imported_units(ast.parse(path.read_text(encoding="utf-8"))):
            if target == unit or target not in LAYERS:
                continue
            if LAYERS[target] >= LAYERS[unit]:
                rel = path.relative_to(SRC.parent)
                wrong.append(
                    f"{rel}:{line} ({unit}, layer {LAYERS[unit]}) imports {target} "
                    f"(layer {LAYERS[target]})"
                )
    assert not wrong, "imports against the data path:\n" + "\n".join(wrong)


def test_src_raises_only_errors_of_the_streamrag_tree() -> None:
    wrong: list[str] = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in BUILTIN_RAISES:
                wrong.append(f"{path.relative_to(SRC.parent)}:{node.lineno} raises {exc.id}")
    assert not wrong, (
        "raise a leaf of streamrag.errors (ArgumentError, StateError, SpecError, ...) instead:\n"
        + "\n".join(wrong)
    )


def test_the_rules_see_what_they_forbid() -> None:
    """The checks above would find a bare raise and an upward import if there were one."""
    tree = ast.parse("from streamrag.serve.app import x\nraise ValueError('no')\n")
    assert _imported_units(tree) == [(1, "serve")]
    raises = [n for n in ast.walk(tree) if isinstance(n, ast.Raise)]
    assert isinstance(raises[0].exc, ast.Call)
    assert isinstance(raises[0].exc.func, ast.Name)
    assert raises[0].exc.func.id == "ValueError"


MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 60
"""In the packages every change passes through (``runtime``, ``index``): small steps."""


def test_files_and_the_functions_of_the_data_path_stay_small() -> None:
    wrong: list[str] = []
    for path in _modules():
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(SRC.parent)
        if len(text.splitlines()) > MAX_FILE_LINES:
            wrong.append(f"{rel}: {len(text.splitlines())} lines (split it by role)")
        if _unit(path) not in ("runtime", "index"):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    wrong.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    assert not wrong, "too long:\n" + "\n".join(wrong)
