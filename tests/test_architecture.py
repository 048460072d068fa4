"""The tree is the architecture: layers as folders, imports pointing down, no circle, no private
name borrowed across modules. The layer contracts themselves are in pyproject.toml."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp

import ragexam

PACKAGE = Path(ragexam.__file__).parent
PYPROJECT = PACKAGE.parents[1] / "pyproject.toml"


def test_the_import_contracts_hold() -> None:
    # In a process of its own: import-linter configures logging, which would silence ours.
    lint = Path(sys.executable).with_name("lint-imports")  # import-linter's command, in this venv
    command = [str(lint), "--config", str(PYPROJECT), "--no-cache"]
    checked = subprocess.run(command, capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout[-2000:]


def test_no_module_is_in_an_import_circle() -> None:
    # Every import, those inside functions included; an import for type annotations only
    # (under TYPE_CHECKING) makes no circle when the code runs.
    graph = grimp.build_graph("ragexam", exclude_type_checking_imports=True)
    circles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported != "ragexam" and graph.chain_exists(imported, module):
                chain = graph.find_shortest_chain(imported, module) or ()
                circles.append(" -> ".join([module, *chain]))
    assert circles == []


def test_no_module_imports_another_modules_private_name() -> None:
    borrowed = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules = _imported_modules(tree)  # names bound to one of ragexam's modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                borrowed.append(f"{path.relative_to(PACKAGE)}: a relative import")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ragexam"):
                private = [a.name for a in node.names if _private(a.name)]
                borrowed += [
                    f"{path.relative_to(PACKAGE)}: {node.module}.{name}" for name in private
                ]
            if isinstance(node, ast.Attribute) and _private(node.attr):
                value = node.value
                if isinstance(value, ast.Name) and value.id in modules:
                    borrowed.append(f"{path.relative_to(PACKAGE)}: {value.id}.{node.attr}")
    assert borrowed == []


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _imported_modules(tree: ast.Module) -> set[str]:
    """The names a module binds to ragexam's modules (`from ragexam.report import page`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name for a in node.names if a.name.startswith("ragexam")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ragexam"):
            for alias in node.names:
                if (PACKAGE / Path(*node.module.split(".")[1:]) / f"{alias.name}.py").exists():
                    names.add(alias.asname or alias.name)
    return names


def test_the_top_of_the_package_reads_as_a_handful_of_layers() -> None:
    top = sorted(
        entry.name
        for entry in PACKAGE.iterdir()
        if entry.name != "__pycache__" and (entry.is_dir() or entry.suffix == ".py")
    )
    layers = {"io", "llm", "store", "rag", "stages", "analysis", "report", "cli"}
    assert layers <= set(top)
    assert len(top) <= 16, top
