"""The import structure of ``vedart/``: layers, no module cycles, no folder cycles.

Every ``import`` and ``from ... import`` statement of every module is read from its syntax
tree, at any depth (inside functions too: a lazy import is still a dependency), except those
under ``if TYPE_CHECKING:``, which never run. An import of a package's attribute that is a
module (``from vedart import lifecycle``) counts as an import of that module.

``LAYERS`` is the declared order, lowest first: a module may import modules of its own layer
or of layers below, never above. A folder is a subpackage (``vedart/gpu/``...); each module
directly under ``vedart/`` is a unit of its own, since that folder holds both the lowest layer
and the top one. Neither modules nor folders may import each other in a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "vedart"

# Lowest first; a module belongs to the layer of the longest prefix naming it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("vedart._version", "vedart.errors", "vedart.units", "vedart._logging",
                    "vedart.locks", "vedart.tasks", "vedart.telemetry", "vedart.config",
                    "vedart.lifecycle")),
    ("devices", ("vedart.gpu",)),
    ("device API", ("vedart.backends",)),
    ("offload and kernels", ("vedart.offload", "vedart.kernels")),
    ("pipelines", ("vedart.parallel",)),
    ("runtime", ("vedart.runtime",)),
    ("public API", ("vedart",)),
    ("commands", ("vedart.__main__", "vedart.cli", "vedart.demo", "vedart.calibrate",
                  "vedart.bench")),
)


def module_files(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` (a package is its
    ``__init__``)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Ids of the nodes under an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) test."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
                (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
                or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")):
            skipped.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return skipped


def imported_modules(name: str, path: Path, modules: Iterable[str]) -> set[str]:
    """The modules among ``modules`` that module ``name`` (at ``path``) imports."""
    known = set(modules)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skipped = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in known else source)
    imported = set()
    for module in found:
        while module and module not in known:  # `import a.b.c` of a non-module attribute
            module = module.rpartition(".")[0]
        if module and module != name:
            imported.add(module)
    return imported


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    modules = module_files(package)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def layer_of(module: str) -> int:
    best, best_length = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    return best


def folder_of(module: str) -> str:
    """The subpackage a module lies in, or the module itself for one directly under vedart/."""
    parts = module.split(".")
    return ".".join(parts[:2])


def folder_graph(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    folders: dict[str, set[str]] = {}
    for module, imported in graph.items():
        edges = folders.setdefault(folder_of(module), set())
        edges.update(folder_of(target) for target in imported)
        edges.discard(folder_of(module))
    return folders


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def upward_imports(graph: Mapping[str, set[str]]) -> list[str]:
    return sorted(f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} "
                  f"({LAYERS[layer_of(target)][0]})"
                  for module, imported in graph.items() for target in imported
                  if layer_of(target) > layer_of(module))


# --- vedart itself ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(PACKAGE)


def test_every_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    assert [module for module in graph if layer_of(module) < 0] == []


def test_no_module_imports_a_layer_above_its_own(graph: dict[str, set[str]]) -> None:
    assert upward_imports(graph) == []


def test_no_import_cycle_between_modules(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


def test_no_import_cycle_between_folders(graph: dict[str, set[str]]) -> None:
    assert cycles(folder_graph(graph)) == []


# --- the walker on a package made for it --------------------------------------------------


def _write(root: Path, files: Mapping[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "vedart"


def test_walker_sees_nested_relative_and_attribute_imports_and_skips_type_checking(
        tmp_path: Path) -> None:
    package = _write(tmp_path, {
        "vedart/__init__.py": "",
        "vedart/errors.py": "",
        "vedart/config.py": "",
        "vedart/gpu/__init__.py": "",
        "vedart/gpu/a.py": ("from typing import TYPE_CHECKING\n"
                            "if TYPE_CHECKING:\n    from vedart import runtime\n"
                            "def f():\n    if True:\n        from vedart import errors\n"),
        "vedart/gpu/b.py": "from . import a\nfrom .a import f\nimport vedart.config.x\n",
        "vedart/runtime.py": "",
    })
    graph = import_graph(package)
    assert graph["vedart.gpu.a"] == {"vedart.errors"}
    assert graph["vedart.gpu.b"] == {"vedart.gpu.a", "vedart.config"}


def test_checks_find_an_upward_import_and_both_kinds_of_cycle(tmp_path: Path) -> None:
    package = _write(tmp_path, {
        "vedart/__init__.py": "",
        "vedart/config.py": "def f():\n    import vedart.runtime\n",
        "vedart/runtime.py": "",
        "vedart/gpu/__init__.py": "",
        "vedart/gpu/a.py": "from vedart.backends import b\n",
        "vedart/backends/__init__.py": "",
        "vedart/backends/b.py": "from vedart.gpu import c\n",
        "vedart/gpu/c.py": "",
        "vedart/parallel/__init__.py": "",
        "vedart/parallel/p.py": "from vedart.parallel import q\n",
        "vedart/parallel/q.py": "from vedart.parallel.p import x\n",
    })
    graph = import_graph(package)
    assert upward_imports(graph) == [
        "vedart.config (foundation) imports vedart.runtime (runtime)",
        "vedart.gpu.a (devices) imports vedart.backends.b (device API)",
    ]
    assert cycles(graph) == [["vedart.parallel.p", "vedart.parallel.q"]]
    assert cycles(folder_graph(graph)) == [["vedart.backends", "vedart.gpu"]]
