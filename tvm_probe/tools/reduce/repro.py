"""The result, :class:`Reduction`, and the standalone reproduction folder it is written as:
``model.onnx``, ``inputs.npz``, ``expected.npz``, ``repro.py`` (filled in from the package's
``templates/repro.py``) and ``README.md``, verified by running ``repro.py`` in a fresh process."""
from __future__ import annotations

import logging
import shutil
import string
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ...build.compile import target_literal
from ...core.errors import ProbeError, one_line
from ...core.schema import PIPELINE_NAMES
from ...core.tolerance import Tolerance, default_tolerance
from ...probe.tvm_reference import build_label, pipeline_label, target_label
from ...store.atomic import replace_folder
from ...store.npz import save_npz
from ..blame import blame
from .check import TVMBuild
from .failure import CompileFailure, Divergence, Failure, ReduceError

log = logging.getLogger(__package__)

FILES = ("model.onnx", "inputs.npz", "expected.npz", "repro.py", "README.md")
PASS_REPRO = "pass-repro"  # the blame's reproduction, where a pass is blamed
REPRO_TIMEOUT_S = 600


@dataclass
class Reduction:
    """A reduced model that fails as the whole model did.

    Attributes:
        model: the reduced ``onnx.ModelProto``.
        inputs: its inputs: the whole model's inputs, or the values onnxruntime computed for
            them on the whole model.
        expected: the reference's outputs of the reduced model.
        actual: TVM's outputs of the reduced model (None for a compile failure).
        failure: a :class:`Divergence` or :class:`CompileFailure`.
        nodes_before: nodes of the whole model.  ``nodes_after`` is the reduced model's.
        seconds: how long the reduction took; tried: how many sub-models it compiled.
        target, pipeline, reference: the build that fails and what it was compared with
            (None: onnxruntime).
        expected_from: what computed ``expected``.
        complete: False when ``max_seconds`` stopped the search (the model may reduce further).
        tolerance: the tolerance given (None: the dtype's default).
        out_dir: the reproduction folder, once written.
    """

    model: Any
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    actual: dict[str, np.ndarray] | None
    failure: Failure
    nodes_before: int
    seconds: float
    tried: int
    target: Any
    pipeline: Any
    reference: TVMBuild | None
    expected_from: str
    complete: bool = True
    tolerance: Tolerance | None = None
    tvm_version: str = ""
    out_dir: Path | None = None

    @property
    def nodes_after(self) -> int:
        return len(self.model.graph.node)

    @property
    def kept(self) -> list[str]:
        """``Relu 'bug/relu'`` for each node left."""
        return [f"{n.op_type} '{n.name or n.output[0]}'" for n in self.model.graph.node]

    @property
    def tvm_label(self) -> str:
        return build_label(self.target, self.pipeline, self.tvm_version)

    @property
    def reference_label(self) -> str:
        return self.reference.label if self.reference is not None else "onnxruntime"

    def headline(self) -> str:
        """A title for the bug report."""
        if isinstance(self.failure, CompileFailure):
            ops = " + ".join(dict.fromkeys(n.op_type for n in self.model.graph.node))
            return f"{ops} {self.failure.headline(self.reference_label)}"
        return self.failure.headline(self.reference_label)

    def statement(self) -> str:
        """One sentence stating the bug."""
        return self.failure.statement(self.tvm_label, self.reference_label)

    def summary(self) -> str:
        """One line: nodes before and after, time, sub-models tried, the bug."""
        stopped = "" if self.complete else " (stopped at the time limit: it may reduce further)"
        return (f"reduced {self.nodes_before} nodes to {self.nodes_after} ({', '.join(self.kept)}) in "
                f"{self.seconds:.1f} s, {self.tried} sub-models tried{stopped}: {self.statement()}")

    def write(self, out_dir, overwrite: bool = False, verify: bool = True) -> Path:
        """Write the reproduction folder (see :mod:`tvm_probe.tools.reduce`); returns its path.

        Args:
            overwrite: replace an existing folder (it is removed only once the new one is complete).
            verify: run ``repro.py`` in a fresh Python process first and refuse to write a
                folder that does not reproduce the failure.

        Raises:
            ReduceError: the folder exists, the pipeline is a custom pass (a standalone script
                cannot rebuild it), or ``repro.py`` does not reproduce the failure.
        """
        self.out_dir = write_repro(self, Path(out_dir), overwrite=overwrite, verify=verify)
        return self.out_dir


def write_repro(result: Reduction, out_dir: Path, overwrite: bool = False, verify: bool = True) -> Path:
    """Write ``result`` as a reproduction folder (see :meth:`Reduction.write`)."""
    import onnx

    out_dir = Path(out_dir)
    check_out_dir(out_dir, overwrite)
    script = repro_script(result)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    except OSError as err:
        raise ReduceError(f"cannot write '{out_dir}': {err.strerror or err}") from None
    try:
        onnx.save(result.model, str(tmp / "model.onnx"))
        save_npz(tmp / "inputs.npz", result.inputs)
        save_npz(tmp / "expected.npz", result.expected)
        (tmp / "repro.py").write_text(script)
        transcript = run_repro(tmp, result.failure) if verify else None
        found = blame_of(result)
        if found is not None and found.stage == "pass" and not getattr(found.repro, "why_not", "x"):
            found.write_repro(tmp / PASS_REPRO)
        (tmp / "README.md").write_text(readme(result, transcript, found))
        replace_folder(tmp, out_dir)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OSError):
            raise ReduceError(f"cannot write '{out_dir}': {err.strerror or err}") from None
        raise
    return out_dir


def check_out_dir(out_dir: Path, overwrite: bool) -> None:
    """ReduceError unless ``out_dir`` may be written (absent, or a folder and ``overwrite``)."""
    if out_dir.exists() and not overwrite:
        raise ReduceError(f"'{out_dir}' already exists: choose another folder or pass overwrite=True")
    if out_dir.exists() and not out_dir.is_dir():
        raise ReduceError(f"'{out_dir}' exists and is not a folder: choose another path")


def run_repro(folder: Path, failure: Failure) -> str:
    """Run ``repro.py`` of ``folder`` in a fresh Python process; its output when it reproduces
    ``failure``, else ReduceError."""
    try:
        done = subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True,
                              timeout=REPRO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ReduceError(f"repro.py did not finish within {REPRO_TIMEOUT_S} s") from None
    out = done.stdout
    if isinstance(failure, Divergence):
        shown = f"MISMATCH output '{failure.tensor}'" in out
    else:
        shown = f"{failure.error_type}: " in out and failure.short_message[:80] in out
    if done.returncode != 1 or not shown:
        last = one_line((done.stderr or out).strip().splitlines()[-1] if (done.stderr or out).strip() else "")
        raise ReduceError(f"the reduced model does not reproduce the failure in a plain TVM run (repro.py exit "
                          f"status {done.returncode}: {last}); nothing was written. Please report this")
    return out


def repro_script(result: Reduction) -> str:
    """The text of ``repro.py`` (standalone: tvm, onnx, onnxruntime and numpy only)."""
    build = (result.target, result.pipeline)
    builds = [build] + ([(result.reference.target, result.reference.pipeline)] if result.reference else [])
    for target, pipeline in builds:
        if not isinstance(pipeline, str) or pipeline not in PIPELINE_NAMES:
            raise ReduceError(f"repro.py needs a named pipeline (one of {', '.join(PIPELINE_NAMES)}), not the custom pass "
                              f"{pipeline_label(pipeline, target)!r}: a standalone script cannot rebuild it")
    tolerances = {name: _tolerance_for(result, value) for name, value in result.expected.items()}
    reference = (None if result.reference is None
                 else (target_literal(result.reference.target), result.reference.pipeline))
    script = string.Template(repro_template()).safe_substitute(
        TITLE=f"TVM {result.tvm_version}: {result.headline()}",
        NODES_BEFORE=result.nodes_before, NODES_AFTER=result.nodes_after)
    return _set_settings(script, {
        "TARGET": target_literal(result.target), "PIPELINE": repr(result.pipeline),
        "REFERENCE": "None" if reference is None else f"({reference[0]}, {reference[1]!r})",
        "REFERENCE_LABEL": repr(result.reference_label), "TOLERANCES": repr(tolerances)})


REPRO_TEMPLATE = "tools/reduce/templates/repro.py"
"""The package file ``repro.py`` is written from (its path below ``tvm_probe/``; setup.cfg ships it
as package data): a runnable script whose settings block holds placeholder values, and whose
docstring has ``$TITLE``, ``$NODES_AFTER`` and ``$NODES_BEFORE``."""


def repro_template() -> str:
    """The text of :data:`REPRO_TEMPLATE` (read from the installed package)."""
    return resources.files("tvm_probe").joinpath(REPRO_TEMPLATE).read_text(encoding="utf-8")


def _set_settings(script: str, values: Mapping[str, str]) -> str:
    """``script`` with each ``NAME = ...`` line of its settings block set to ``values[NAME]``
    (Python source), keeping the line's comment."""
    lines = script.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("# -- settings"))
    end = next(i for i, line in enumerate(lines) if line.startswith("# -- end of settings"))
    missing = set(values)
    for i in range(start + 1, end):
        name, _, rest = lines[i].partition(" = ")
        if name in values:
            comment = rest[rest.index("  # "):] if "  # " in rest else ""
            lines[i] = f"{name} = {values[name]}{comment}"
            missing.discard(name)
    if missing:  # the template and this writer disagree: a tvm_probe bug
        raise AssertionError(f"{REPRO_TEMPLATE} has no setting {sorted(missing)}")
    return "\n".join(lines)


def _tolerance_for(result: Reduction, value: np.ndarray) -> tuple[float, float]:
    tol = result.tolerance or default_tolerance(np.asarray(value).dtype)
    return (float(tol.atol), float(tol.rtol))


def blame_of(result: Reduction):
    """Which stage of TVM the reduced model's failure is (:func:`tvm_probe.tools.blame.blame`), or
    None when no blame could be made (the reason is logged)."""
    reference = None if result.reference is None else result.expected  # onnxruntime, else the build's outputs
    try:
        return blame(result.model, result.inputs, reference=reference, pipeline=result.pipeline, target=result.target)
    except ProbeError as err:
        log.info("no blame for the reduced model: %s", err)
        return None


def _blame_section(found) -> str:
    if found is None:
        return "blame: not established (see the log)\n\n"
    lines = "\n".join(f"- {line}" for line in found.evidence)
    more = (f"\n\nThe pass-level reproduction is in `{PASS_REPRO}/` (the module before the pass as TVMScript, "
            "and the pass).") if found.stage == "pass" and not getattr(found.repro, "why_not", "x") else ""
    return f"{found.headline()}\n\n{lines}{more}\n\n"


def readme(result: Reduction, transcript: str | None, found=None) -> str:
    """README.md of the folder: versions, build, the bug in one sentence, its blame (the stage of TVM
    responsible), how to run, its output."""
    import onnx
    import onnxruntime

    pipeline = {"default": "`default` — `tvm.compile(mod, target)`",
                "fused": "`fused` — `tvm.compile(mod, target, relax_pipeline=relax.get_default_pipeline(target))`"}
    rows = [("TVM", result.tvm_version), ("onnxruntime", onnxruntime.__version__), ("onnx", onnx.__version__),
            ("numpy", np.__version__), ("Python", sys.version.split()[0]),
            ("target", f"`{target_label(result.target)}`"),
            ("pipeline", pipeline.get(result.pipeline, f"`{result.pipeline}`")),
            ("compared with", result.reference_label), ("expected.npz from", result.expected_from),
            ("model", f"{result.nodes_after} node(s): {', '.join(result.kept)} (reduced by tvm_probe from "
                      f"{result.nodes_before} nodes in {result.seconds:.1f} s)")]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    graph = onnx.helper.printable_graph(result.model.graph) if result.nodes_after <= 20 else ""
    output = (f"Output of `python repro.py` when this folder was written:\n\n```\n{transcript.rstrip()}\n```\n"
              if transcript else "")
    return (f"# [Bug][Relax][ONNX] {result.headline()}\n\n"
            f"{result.statement()}.\n\n{_blame_section(found)}| | |\n|---|---|\n{table}\n\n"
            "## Reproduce\n\n```bash\npip install apache-tvm onnx onnxruntime numpy\npython repro.py   "
            "# exit status 1 while the bug is present\n```\n\n"
            "`model.onnx` is the reduced model; `inputs.npz` holds its inputs (the original model's "
            "inputs, or the values the original model computed for them in onnxruntime); `expected.npz` "
            "holds the outputs "
            f"{result.expected_from} computes from them.\n\n"
            + (f"## The model\n\n```\n{graph}\n```\n\n" if graph else "") + output)
