"""Reduce: the smallest ONNX sub-model on which TVM still fails the same way, written as a
standalone reproduction ready to paste into a TVM issue.

    from tvm_probe.tools.reduce import reduce
    result = reduce("model.onnx", inputs, pipeline="fused", out_dir="repro/")
    result.summary()   # "reduced 23 nodes to 1 (Relu 'bug/relu') in 6.1 s, 4 sub-models tried: ..."

**The same failure.**  A debugger must never call a different failure the same, so "same" is
strict:

* a *divergence*: the first value, in model order, that is out of tolerance against the
  reference is the same tensor, with the same kinds of disagreement (finite values out of
  tolerance, NaN the reference has and TVM lacks, NaN TVM adds, infinities, shape) and the NaN
  disagreements at the same positions;
* a *compile failure*: TVM's ONNX importer (or ``tvm.compile``) raises the same exception type
  with the same message, up to its numbers (Relax temporaries, registers, addresses, source
  lines: :func:`tvm_probe.core.errors.failure_identity`, the rule the compile diagnosis uses too).

**How.**  ONNX stores nodes in topological order.  The search first checks that the whole
model, rebuilt as a sub-model, still fails; for a divergence it then tries the failing node
alone.  Otherwise it bisects a window of consecutive nodes, from the input side and then from
the output side (as Polygraphy's ``debug reduce`` does), and then removes single nodes one at a
time while the failure persists.  Every candidate is compiled and run for real.

**Sub-models.**  A sub-model reads each tensor whose producer it dropped as a graph input, fed
with the value onnxruntime computed for it on the whole model — so a divergence deep in the
model reproduces without its prefix.  Tensors that were constants in the whole model (TVM's
importer folded them: shape arithmetic, ``Constant`` nodes) become initializers instead, as TVM
saw them.  The outputs of a sub-model are the tensors its nodes hand to dropped nodes, the model
outputs it still computes, and the failing tensor.  Graph inputs are declared with the static
shapes of the values fed.

**The reproduction folder** (``out_dir`` or :meth:`Reduction.write`): ``model.onnx``,
``inputs.npz``, ``expected.npz`` (the reference's outputs), ``repro.py`` (needs only tvm,
onnx, onnxruntime and numpy) and ``README.md``.  It is written to a temporary sibling folder;
``repro.py`` is run there in a fresh Python process and must reproduce the failure, then the
folder is renamed into place.  An existing folder is replaced only with ``overwrite=True``.

**Modules**, bottom to top: :mod:`.failure` (what failed, and when two failures are the same),
:mod:`.submodels` (carving sub-models), :mod:`.check` (the references; compiling and running a
candidate), :mod:`.search` (the search over node sets), :mod:`.repro` (:class:`Reduction` and
the reproduction folder, written from ``templates/repro.py``) and :mod:`.entry` (:func:`reduce`).
"""
from __future__ import annotations

from .check import Checker, RuntimeReference, TVMBuild
from .entry import reduce
from .failure import CompileFailure, Divergence, Failure, ReduceError, find_divergence
from .repro import (
    FILES,
    REPRO_TEMPLATE,
    REPRO_TIMEOUT_S,
    Reduction,
    readme,
    repro_script,
    repro_template,
    run_repro,
    save_npz,
    write_repro,
)
from .search import ReduceStep, Search
from .submodels import CannotCut, SubModels

__all__ = [
    "reduce", "Reduction", "ReduceStep", "ReduceError", "Divergence", "CompileFailure", "Failure",
    "find_divergence", "TVMBuild", "RuntimeReference", "Checker", "Search", "CannotCut", "SubModels",
    "write_repro", "run_repro", "repro_script", "repro_template", "readme", "save_npz",
    "FILES", "REPRO_TEMPLATE", "REPRO_TIMEOUT_S",
]
