"""The import map, read from the source: no import circle between modules, and no package importing a
layer above it (cli on top; catalog, layout, cost, space pure; recipes and trials never import each
other). Function-level imports count too; imports under `if TYPE_CHECKING:` do not (they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "autotune"

# a package may import packages of a lower rank only (same rank: not each other)
RANK = {
    "errors": 0, "killpoints": 0, "__init__": 0,
    "words": 0,  # plurals and small numbers for any message; imports nothing
    "fsutil": 1,  # raises errors.Unwritable, naming the user's path
    "catalog": 1, "layout": 2, "cost": 3, "space": 4, "launch": 4,
    "trials": 5, "recipes": 5,
    "runner": 6,
    "gates": 7,
    "search": 8,
    "report": 9,
    "cli": 10,
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    me = _module_name(path).split(".")
    pkg = me if path.name == "__init__.py" else me[:-1]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("autotune"):
                out.add(mod)
                for a in node.names:  # `from . import x` may name a submodule
                    out.add(f"{mod}.{a.name}")
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("autotune"))
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in SRC.rglob("*.py")}
    return {m: {i for i in _imports(p) if i in files and i != m} for m, p in files.items()}


def _top(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_package_imports_a_layer_above_it():
    bad = []
    for mod, deps in _graph().items():
        a = _top(mod)
        for dep in deps:
            b = _top(dep)
            if a != b and RANK[b] >= RANK[a]:
                bad.append(f"{mod} -> {dep}")
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(bad))


def test_every_package_has_a_rank():
    tops = {_top(m) for m in _graph()}
    assert tops <= set(RANK), f"add these packages to RANK: {sorted(tops - set(RANK))}"


def test_no_import_circle():
    g = _graph()
    # package __init__ files re-export their submodules: an edge into a package's own __init__ from inside
    # it is not a circle of behaviour, so only edges between distinct non-__init__ modules are followed
    seen, stack, cycles = set(), [], []

    def visit(n, path):
        if n in path:
            cycles.append(path[path.index(n):] + [n])
            return
        if n in seen:
            return
        seen.add(n)
        for d in sorted(g.get(n, ())):
            if _is_pkg(d) and n.startswith(d + "."):
                continue
            visit(d, path + [n])

    for n in sorted(g):
        visit(n, stack)
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles[:10])


def _is_pkg(mod: str) -> bool:
    return (SRC.parent / Path(*mod.split(".")) / "__init__.py").exists()
