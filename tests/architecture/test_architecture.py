"""The package's structure: every import points down (lazy imports included), each shared fact
is stated in one module, and no leftovers are tracked."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tvm_probe"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path) -> set[str]:
    """Every tvm_probe module ``name`` imports, at the top or inside a function."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in MODULES else base)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in MODULES and m not in (name, "tvm_probe")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_lazy_imports_included():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    assert "tvm_probe.core.device" in graph["tvm_probe.capture.recompute"]  # the walk sees imports at all
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# -- the floors: read from docs/architecture.md, the one place they are written ---------------------
ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: modules beside the floors: the package's lazy facade, ``python -m``
FACADE = {"tvm_probe", "tvm_probe.__main__"}


def floors() -> list[str]:
    """The stage packages, bottom floor first: the first column of the table under "## Floors"."""
    text = ARCHITECTURE.read_text()
    table = text[text.index("\n## Floors"):].split("\n## ", 2)[1]
    return [row.split("|")[1].strip().strip("`") for row in table.splitlines()
            if row.startswith("| `")]


def _floor(module: str) -> str:
    return module.split(".")[1]


def _import_sites(path: Path):
    """``(line, tvm_probe module, deferred, names)`` of every import of the package in ``path``."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]

    def walk(node, deferred):
        for child in ast.iter_child_nodes(node):
            inner = deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom):
                base = ".".join(package[: len(package) - child.level + 1] + ([child.module] if child.module else [])) \
                    if child.level else child.module
                if base and base.split(".")[0] == "tvm_probe":
                    for alias in child.names:
                        target = f"{base}.{alias.name}"
                        yield child.lineno, target if target in MODULES else base, inner, alias.name
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] == "tvm_probe":
                        yield child.lineno, alias.name, inner, ""
            yield from walk(child, inner)

    yield from walk(ast.parse(path.read_text()), False)


STAGE_MODULES = {n: p for n, p in MODULES.items() if n not in FACADE}


def test_the_floors_cover_the_package():
    assert {_floor(n) for n in STAGE_MODULES} == set(floors()), "a package is missing from docs/architecture.md"


def test_every_import_points_down_deferred_ones_included():
    rank = {floor: i for i, floor in enumerate(floors())}
    upward = [f"{path.relative_to(ROOT)}:{line} imports {target}"
              for name, path in STAGE_MODULES.items() for line, target, _, _ in _import_sites(path)
              if target not in FACADE and rank[_floor(target)] > rank[_floor(name)]]
    assert not upward, "\n".join(upward)


def test_imports_are_at_the_top():
    """At most 15 % of the import statements of the package are inside functions (those left are
    for optional heavy dependencies: torch, transformers, tflite, Model Explorer)."""
    statements = {(path, line): lazy for path in STAGE_MODULES.values() for line, _, lazy, _ in _import_sites(path)}
    deferred = sorted(f"{path.relative_to(ROOT)}:{line}" for (path, line), lazy in statements.items() if lazy)
    assert len(deferred) <= 0.15 * len(statements), \
        f"{len(deferred)} of {len(statements)} deferred:\n" + "\n".join(deferred)


def test_no_private_name_is_imported_across_packages():
    private = [f"{path.relative_to(ROOT)}:{line} {target}.{alias}"
               for name, path in STAGE_MODULES.items() for line, target, _, alias in _import_sites(path)
               if alias.startswith("_") and not alias.startswith("__") and target not in FACADE
               and _floor(target) != _floor(name)]
    assert not private, "\n".join(private)


def test_the_house_keeps_its_plan():
    flat = sorted(n for n in MODULES if n.count(".") == 1 and not (PACKAGE / n.split(".")[1]).is_dir())
    assert len(flat) + 1 <= 3, f"modules flat in tvm_probe/: {['tvm_probe', *flat]}"  # + __init__
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 700}
    assert not long, f"modules over 700 lines: {long}"


def _code_lines(path: Path):
    """(line number, text) of the code of ``path``, docstrings and comments left out."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if number not in docstrings:
            yield number, line.split("#", 1)[0]


@pytest.mark.parametrize("fact, pattern, home", [
    ("the pipeline names", r"""["']default["'],\s*["']fused["']""", {"tvm_probe/core/schema.py"}),
    ("the default target", r"""=\s*["']llvm["']""", {"tvm_probe/core/schema.py"}),
    ("target kind -> device", r"""["']llvm["']\s*:\s*["'](cpu|CPU)""", {"tvm_probe/core/device.py"}),
    ("the debug graph file name", r"_tvmdbg_graph_dump\.json", {"tvm_probe/store/graph.py"}),
])
def test_each_fact_has_one_home(fact, pattern, home):
    where = {str(path.relative_to(ROOT)) for path in PACKAGE.rglob("*.py") if "templates" not in path.parts
             for _, line in _code_lines(path) if re.search(pattern, line)}
    assert where == home, f"{fact} is stated in {sorted(where)}"


def test_exit_help_follows_the_exit_statuses():
    from tvm_probe.core.schema import EXIT_HELP, Exit

    for status in Exit:
        assert f"{int(status)} {status.meaning}" in EXIT_HELP


def test_bfloat16_tensors_count_their_bytes():
    from tvm_probe.core.dtypes import itemsize, nbytes

    assert itemsize("bfloat16") == 2 and itemsize("float8_e4m3fn") == 1 and itemsize("bool") == 1
    assert nbytes((3, 4), "bfloat16") == 24 and itemsize("int4") is None and itemsize("float32x4") is None
    assert itemsize("float8_e3m4") == 1  # the element's bits, not the exponent/mantissa digits


def test_no_leftovers_are_tracked():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    assert [f for f in tracked if f.endswith((".orig", ".rej", ".bak", "~"))] == []


def test_test_modules_have_unique_basenames():
    """pytest imports test folders without __init__.py by basename: two test_x.py break collection."""
    tests = Path(__file__).parents[1]
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted(tests.rglob("*.py")):
        if path.name in ("__init__.py", "conftest.py") or "support" in path.parts or "fixtures" in path.parts:
            continue
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(tests)} and {path.relative_to(tests)}")
        seen.setdefault(path.name, path)
    assert not clashes, f"test modules share a basename (rename one): {clashes}"
