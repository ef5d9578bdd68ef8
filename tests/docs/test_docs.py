"""The docs run as written: every ``python`` block of README.md and docs/*.md.

A reader copies a file's blocks in order into one Python session started in an empty folder, and
may do it again in the same folder the next day.  So each file's blocks run here in order, in one
namespace, in a fresh Python process whose working folder is a new empty one, and then, where
that run left files there, again in a second fresh process in that same folder (an example that
writes a dump must not trip on the one the first run left; a file that leaves nothing would only
run the same again).  A fresh process, not this one: a block must not lean on what the test
session imported or put on ``sys.path`` (``tests/``, for ``support``).

Sybil finds the blocks and runs them (its Markdown parser and Python evaluator; a failure names
the ``.md`` file and line); other fences (```bash, ```text, ```yaml) are not run.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Files whose runs take longer than 30 s on 2 CPU cores (still run in CI).
SLOW = {"README.md", "llm.md", "onnx.md", "python.md"}

#: What a block's comments promise, checked in its namespace right after it ran:
#: {file: (index of the python block, code)}.
CHECKS = {
    # "Your own model": the dump, read with numpy alone, holds the value probe.get served
    "README.md": (0, ("import numpy as np\n"
                      "np.testing.assert_array_equal(r.get('layer_._0/attention/self/MatMul'), x)")),
    # (the same on python.md's first block)
    "python.md": (0, ("import numpy as np\n"
                      "np.testing.assert_array_equal(r.get('layer_._0/attention/self/MatMul'), x)")),
    # the five-node model reduces to its Relu, and the reproduction folder holds what the page lists
    "reduce.md": (0, ("import os\n"
                      "assert result.summary().startswith(\"reduced 5 nodes to 1 (Relu 'act/Relu')\"), result.summary()\n"
                      "assert sorted(os.listdir('repro')) == "
                      "['README.md', 'expected.npz', 'inputs.npz', 'model.onnx', 'repro.py'], os.listdir('repro')")),
}

#: One run of one file: its python blocks in order in one namespace (Sybil), then the check.
RUN_FILE = """
import sys
from pathlib import Path
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

path, check_after, check = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
document = Sybil(parsers=[PythonCodeBlockParser()]).parse(path)
for index, example in enumerate(document):
    example.evaluate()
    if index == check_after:
        exec(check, dict(document.namespace))
"""


def python_blocks(path: Path) -> list:
    return list(Sybil(parsers=[PythonCodeBlockParser()]).parse(path))


def run_file(path: Path, folder: Path) -> subprocess.CompletedProcess:
    """One fresh process in ``folder``, importing this checkout's tvm_probe."""
    check_after, check = CHECKS.get(path.name, (-1, ""))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", RUN_FILE, str(path), str(check_after), check],
                          cwd=folder, env=env, capture_output=True, text=True, check=False)


def doc_params():
    for path in DOCS:
        marks = [pytest.mark.slow] if path.name in SLOW else []
        yield pytest.param(path, id=str(path.relative_to(ROOT)), marks=marks)


@pytest.mark.parametrize("path", doc_params())
def test_a_docs_file_runs_as_written_and_again_over_what_it_left(path, tmp_path):
    if not python_blocks(path):
        return  # nothing to run: its fences are bash, text, yaml
    for attempt in ("first", "second"):
        done = run_file(path, tmp_path)
        assert done.returncode == 0, f"{path.name}, {attempt} run in {tmp_path}:\n{done.stderr[-6000:]}"
        if not any(tmp_path.iterdir()):
            break  # (it left nothing a second run could trip on)


def test_the_docs_files_with_python_blocks_are_found():
    """A docs file the glob missed would never be run: README.md and the pages with examples are in."""
    with_blocks = {p.name for p in DOCS if python_blocks(p)}
    assert {"README.md", "api.md", "llm.md", "onnx.md", "precision.md", "python.md", "pytorch.md", "quantization.md",
            "reduce.md", "split.md", "tensorflow.md", "tvm-native.md"} <= with_blocks


def test_a_failing_block_fails_the_run_with_its_file_and_line(tmp_path):
    """The runner can fail: a block that raises is reported with the .md file and line."""
    page = tmp_path / "page.md"
    page.write_text("# page\n\n```python\nx = 1\n```\n\n```text\nnot python\n```\n\n"
                    "```python\nassert x == 2, 'x is 1'\n```\n")
    done = run_file(page, tmp_path)
    assert done.returncode != 0
    assert f'File "{page}", line 12' in done.stderr and "AssertionError: x is 1" in done.stderr


def test_a_check_runs_right_after_its_block(tmp_path, monkeypatch):
    """A check sees the namespace as its block left it, and a false one fails the run."""
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 1\n```\n\n```python\nx = 2\n```\n")
    monkeypatch.setitem(CHECKS, "page.md", (0, "assert x == 1, 'after block 0'"))
    assert run_file(page, tmp_path).returncode == 0
    monkeypatch.setitem(CHECKS, "page.md", (1, "assert x == 1, 'after block 1'"))
    done = run_file(page, tmp_path)
    assert done.returncode != 0 and "AssertionError: after block 1" in done.stderr


def command_line_block(path: Path, after: str) -> list[list[str]]:
    """The ``tvm-probe`` commands of the first ```bash block after the line ``after``, as argv lists."""
    import shlex

    text = path.read_text()
    block = text[text.index(after):].split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.startswith("tvm-probe ")]


@pytest.mark.slow
def test_the_readme_command_line_runs_on_the_files_its_python_left(tmp_path):
    """"On the command line": each command as written, in the folder where the README's Python
    blocks left model.onnx and inputs.npz (bash blocks are not run by Sybil)."""
    done = run_file(ROOT / "README.md", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    commands = command_line_block(ROOT / "README.md", "On the command line")
    assert [c[:2] for c in commands] == [["tvm-probe", "run"]] * 3 + [["tvm-probe", "ls"], ["tvm-probe", "get"]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for command in commands:
        ran = subprocess.run([sys.executable, "-m", "tvm_probe.app.cli", "-q", *command[1:]], cwd=tmp_path, env=env,
                             capture_output=True, text=True, check=False)
        assert ran.returncode == 0, f"{' '.join(command)}:\n{ran.stdout[-2000:]}\n{ran.stderr[-2000:]}"
    assert (tmp_path / "model.yaml").is_file() and (tmp_path / "tvm_probe_out" / "model" / "report" / "report.html").is_file()
