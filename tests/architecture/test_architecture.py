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
