"""The layout keeps its shape (issue 25), read from the source with ast (nothing imported): no import cycle
between modules (imports inside functions included), no class over 400 lines, no module over 600, at most 10
modules directly in personalize/, and no module importing another package's private names. The layers
themselves are import-linter's contracts (.importlinter, run by `make test`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "personalize"


def _modules() -> dict[str, Path]:
    out = {}
    for f in sorted(ROOT.rglob("*.py")):
        parts = list(f.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _imports(name: str, f: Path, mods: dict[str, Path]):
    """(imported module, names) for every import of a personalize module in f, at any depth."""
    tree = ast.parse(f.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if f.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            yield base, [a.name for a in node.names]


def _target(t: str, mods: dict[str, Path]) -> str:
    while t and t not in mods:
        t = t.rpartition(".")[0]
    return t


def test_no_import_cycles_between_modules():
    mods = _modules()
    edges = {m: set() for m in mods}
    for m, f in mods.items():
        for base, names in _imports(m, f, mods):
            if not base.startswith("personalize"):
                continue
            for t in [base, *(f"{base}.{n}" for n in names)]:
                t = _target(t, mods)
                if t and t != m and not (m.startswith(t + ".") and mods[t].name == "__init__.py"):
                    edges[m].add(t)
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for t in edges[m]:
            assert state.get(t) != 1, f"import cycle: {' -> '.join([*path, t])}"
            if t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in mods:
        if m not in state:
            visit(m, [m])


def test_sizes_and_the_top_level():
    mods = _modules()
    assert len([f for f in mods.values() if f.parent == ROOT and f.name != "__init__.py"]) <= 10
    for f in mods.values():
        src = f.read_text()
        assert src.count("\n") <= 600, f"{f} has {src.count(chr(10))} lines"
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno - node.lineno + 1 <= 400, f"{f}:{node.name} is over 400 lines"


def test_no_private_names_across_packages():
    mods = _modules()
    for m, f in mods.items():
        package = m.rpartition(".")[0]
        for base, names in _imports(m, f, mods):
            if not base.startswith("personalize"):
                continue
            other = _target(base, mods)
            other_package = other if mods[other].name == "__init__.py" else other.rpartition(".")[0]
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            assert not private or other_package == package, f"{m} imports {private} from {base}"


def test_every_package_says_what_it_holds_and_may_import():
    for init in ROOT.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in doc or "may import" in doc, f"{init} does not say what it may import"
