"""Blame: whose bug is it — TVM's importer, a named pass of the pipeline, or the op's kernel.

    from tvm_probe.tools.blame import blame
    b = blame("model.onnx", inputs, pipeline="fused")
    b.stage       # "importer" | "pass" | "kernel" | "runtime-crash" | "none" | "undecided"
    b.pass_name, b.pass_path   # "FuseTIR", "_pipeline>sequential>FuseTIR"
    print(b)      # the evidence in a few lines
    b.write_repro("repro/")    # the module before the pass as TVMScript, and the pass

**Modules**, bottom to top: :mod:`.semantics` (what a Relax op means, in numpy: the
independent evaluation that tells the importer from the kernel), :mod:`.result` (:class:`Blame`),
:mod:`.repro` (the standalone reproduction: TVMScript and the pass, delta debugging),
:mod:`.entry` (:func:`blame`: the questions in order, bisection over the pipeline's steps).
"""
from __future__ import annotations

from .entry import FINISH, blame
from .repro import lift_constants, pass_constructor
from .result import STAGES, Blame

__all__ = ["blame", "Blame", "STAGES", "FINISH", "lift_constants", "pass_constructor"]
