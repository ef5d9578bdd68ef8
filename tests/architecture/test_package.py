"""The package itself: light to import, its documented examples run, and every module path the
docs write is the one path of a real module (no aliases of the paths from before the stages)."""
from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_importing_tvm_probe_pulls_in_nothing_heavy():
    code = ("import sys, tvm_probe; heavy = {'tvm', 'onnx', 'onnxruntime', 'torch', 'pandas'}; "
            "print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_package_docstring_example_runs():
    import tvm_probe

    example = tvm_probe.__doc__.split("\n\n")[1]
    scope: dict = {}
    exec(compile("\n".join(line[4:] for line in example.splitlines()), "tvm_probe.__doc__", "exec"), scope)
    from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

    probe, model = scope["probe"], scope["model"]
    key = probe.resolve("layer_._0/attention/self/MatMul")
    expected = onnxruntime_values(model, tvm_probe.demo.demo_inputs(model), [key])[key]
    np.testing.assert_allclose(probe.get("layer_._0/attention/self/MatMul"), expected, rtol=1e-3, atol=1e-4)


def test_python_dash_m_runs_the_cli():
    out = subprocess.run([sys.executable, "-m", "tvm_probe", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: tvm-probe" in out.stdout


def test_the_public_names_are_importable():
    import tvm_probe

    missing = [name for name in tvm_probe.__all__ if not hasattr(tvm_probe, name)]
    assert not missing and "Instrument" in tvm_probe.__all__


# -- one public surface: the paths the docs write import as written -----------------------------------
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: ``tvm_probe.a.b`` anywhere in a page: prose, python blocks, their comments
DOTTED = re.compile(r"\btvm_probe(?:\.[A-Za-z_]\w*)+")
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
#: Dotted names the docs write that are no Python paths: global functions the native library
#: registers in TVM (``tvm_probe.capture.hook``, docs/architecture.md).
NOT_PYTHON = {"tvm_probe.capture.hook"}


def written_paths(page: Path) -> dict[str, int]:
    """``{dotted path: line}`` of every ``tvm_probe`` path ``page`` writes, with each name of a
    ``from tvm_probe.x import a, b`` in its python blocks as ``tvm_probe.x.a``."""
    text = page.read_text()
    found: dict[str, int] = {}
    for match in DOTTED.finditer(text):
        found.setdefault(match.group(), text.count("\n", 0, match.start()) + 1)
    for block in PYTHON_BLOCK.finditer(text):
        first_line = text.count("\n", 0, block.start(1)) + 1
        for node in ast.walk(ast.parse(block.group(1), str(page))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tvm_probe":
                for alias in node.names:
                    found.setdefault(f"{node.module}.{alias.name}", first_line + node.lineno - 1)
    return {path: line for path, line in found.items() if path not in NOT_PYTHON}


def resolve(dotted: str):
    """The object at ``dotted``, as an import finds it: each part an attribute of the one before,
    else its submodule (ModuleNotFoundError where there is none)."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        if not hasattr(obj, part):
            importlib.import_module(".".join(parts[: i + 1]))
        obj = getattr(obj, part)
    return obj


def _broken(paths: dict[str, int]) -> list[str]:
    broken = []
    for path, line in sorted(paths.items(), key=lambda item: item[1]):
        try:
            resolve(path)
        except (ImportError, AttributeError) as err:
            broken.append(f"line {line}: {path} ({type(err).__name__}: {err})")
    return broken


@pytest.mark.parametrize("page", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_every_path_the_docs_write_imports_as_written(page):
    """What docs/api.md lists (and every other page writes) is a real module path and its names exist."""
    paths = written_paths(page)
    assert page.name != "api.md" or len(paths) > 10, "the page lists the public surface"
    broken = _broken(paths)
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_the_path_check_finds_an_old_path_and_a_missing_name(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("`tvm_probe.hf` was\n\n```python\nfrom tvm_probe.llm import (compare_generation,\n"
                    "    no_such_name)\n```\n")
    assert written_paths(page) == {"tvm_probe.hf": 1, "tvm_probe.llm": 4, "tvm_probe.llm.compare_generation": 4,
                                   "tvm_probe.llm.no_such_name": 4}
    assert [line.split(" (")[0] for line in _broken(written_paths(page))] == [
        "line 1: tvm_probe.hf", "line 4: tvm_probe.llm.no_such_name"]


@pytest.mark.parametrize("old", ["hf", "calls", "quantization", "cli", "errors", "reference.tflite", "compare"])
def test_the_flat_paths_from_before_the_stages_are_gone(old):
    """The package was never released: each module has one path, no alias (``tvm_probe.hf`` was one)."""
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"tvm_probe.{old}")


def test_compare_is_the_function():
    import tvm_probe
    from tvm_probe.comparison.verdict import compare

    assert tvm_probe.compare is compare and "compare" in tvm_probe.__all__


# -- install hints: the command that adds an extra where this tvm_probe came from ----------------------
def _editable_here() -> bool:
    import importlib.metadata as metadata

    from tvm_probe.core.install import editable_checkout

    return any(editable_checkout(d.read_text("direct_url.json")) == ROOT
               for d in metadata.distributions(name="tvm_probe"))


@pytest.mark.parametrize("cwd", ["checkout", "elsewhere"])
def test_the_install_hint_of_this_editable_install_names_its_checkout(cwd, tmp_path):
    """``pip install -e .`` of this checkout (README, CI): the hint installs the extra from it.  Run in
    the checkout too, where ``tvm_probe.egg-info`` (no direct_url.json) comes first on the path."""
    if not _editable_here():
        pytest.skip("tvm_probe is not installed editable from this checkout")
    code = "from tvm_probe.core.install import install_hint; print(install_hint('view'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT if cwd == "checkout" else tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == f'pip install -e "{ROOT}[view]"'


def _installed_copy(site: Path, direct_url: str | None, packaging: bool = False) -> str:
    """The package copied into ``site`` (with a dist-info recording ``direct_url``, and setup.cfg and
    setup.py beside it when ``packaging``); the hint a fresh Python finds there, site-packages off."""
    import shutil

    shutil.copytree(ROOT / "tvm_probe", site / "tvm_probe", ignore=shutil.ignore_patterns("__pycache__"))
    if direct_url is not None:
        info = site / "tvm_probe-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tvm_probe\nVersion: 0.1.0\n")
        (info / "direct_url.json").write_text(direct_url)
    for name in ("setup.cfg", "setup.py") if packaging else ():
        shutil.copy(ROOT / name, site / name)
    code = (f"import sys; sys.path.insert(0, {str(site)!r}); "
            "from tvm_probe.core.install import install_hint; print(install_hint('torch'))")
    # -S: no site-packages, so only the copy is installed (the hint needs the standard library alone)
    return subprocess.run([sys.executable, "-S", "-c", code], cwd=site, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_install_hint_of_a_wheel_install_names_the_distribution(tmp_path):
    wheel = '{"archive_info": {}, "url": "file:///tmp/dist/tvm_probe-0.1.0-py3-none-any.whl"}'
    assert _installed_copy(tmp_path, wheel) == 'pip install "tvm_probe[torch]"'


def test_the_install_hint_of_a_clone_on_the_path_names_the_clone(tmp_path):
    """No install at all (the clone on ``PYTHONPATH``): pip could not find ``tvm_probe`` by name."""
    assert _installed_copy(tmp_path, None, packaging=True) == f'pip install -e "{tmp_path}[torch]"'


@pytest.mark.parametrize("direct_url, checkout", [
    ('{"dir_info": {"editable": true}, "url": "file:///work/main"}', "/work/main"),
    ('{"dir_info": {"editable": true}, "url": "file:///home/me/my%20clones/tvm_probe"}', "/home/me/my clones/tvm_probe"),
    ('{"dir_info": {}, "url": "file:///work/main"}', None),                       # pip install /work/main
    ('{"archive_info": {}, "url": "file:///d/tvm_probe-0.1.0-py3-none-any.whl"}', None),
    ('{"vcs_info": {"vcs": "git", "commit_id": "abc"}, "url": "https://github.com/x/tvm_probe"}', None),
    ('{"dir_info": {"editable": true}, "url": "https://example.com/tvm_probe"}', None),
    ("not json", None),
    (None, None),                                                                  # no direct_url.json
])
def test_an_editable_checkout_is_read_from_direct_url_json(direct_url, checkout):
    from tvm_probe.core.install import editable_checkout

    found = editable_checkout(direct_url)
    assert (found if found is None else found.as_posix()) == checkout


@pytest.mark.parametrize("checkout", ["/work/main", "/home/me/my clones/tvm_probe", "/srv/$HOME/it's", '/a"b'])
def test_the_editable_command_is_one_shell_word_per_argument(checkout):
    import shlex

    from tvm_probe.core.install import pip_install

    assert shlex.split(pip_install("view", checkout)) == ["pip", "install", "-e", f"{checkout}[view]"]


def test_the_command_is_in_double_quotes_where_every_shell_reads_them_alike():
    from tvm_probe.core.install import pip_install

    assert pip_install("view", "/home/me/my clones/tp") == 'pip install -e "/home/me/my clones/tp[view]"'
    assert pip_install("view", None) == 'pip install "tvm_probe[view]"'
