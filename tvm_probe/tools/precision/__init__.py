"""Reduced precision: probe an fp16 build by source name, say which ops break, keep them in fp32.

    probe16 = Probe.from_onnx(model, precision="fp16")   # or {"dtype": "fp16", "keep_fp32": [names]}
    probe32 = Probe.from_onnx(model)
    probe16.run(x); probe32.run(x)
    analyse(probe16, probe32).table()                     # per source op, ranked by local error
    find_keep_fp32(import_onnx(model), x).keep_fp32       # what ``tvm-probe precision`` does

**Lowering** (:func:`lower_precision`).  TVM 0.27's ``relax.transform.ToMixedPrecision`` is fp16
only and decides per op *type* (matmul/conv always fp16 with an fp32 accumulator, elementwise and
norms follow their inputs, softmax and reductions never), leaving ``call_tir`` and bindings outside
dataflow blocks alone.  tvm_probe runs it on the imported module *before* the user's pipeline, so
the module the pipeline compiles is exactly the deployable reduced-precision module.  Around it:

* every binding of ``main`` is first given a unique name.  ToMixedPrecision re-emits each
  binding under its own name (a new Var when the dtype changes), and the casts it inserts get
  fresh builder names; so after the pass, the Var with a binding's unique name is *that* op's
  value, in the dtype the reduced module stores it (fp16 for a matmul: its fp32 accumulation
  cast down), never one of the inserted casts.  The source tags are moved to those Vars; a
  tagged Var the pass dropped leaves its value explicitly unknown.
* ``keep_fp32``: the bindings computing each named source op are legalized to ``call_tir``
  first, which ToMixedPrecision leaves in fp32 (its arguments are cast back to fp32, and its
  consumers see an fp32 input).  The rest of the pipeline legalizes every other op the same way,
  so the built module differs only by those ops' dtypes — checked by :func:`check_kept`.

**Local against inherited error** (:func:`analyse`).  For each source op, its slice of the
reduced module (from the tagged values it reads to its own value, casts included) is compiled as
a function of those values and fed the fp32 run's values in the dtypes the reduced module holds
them; the same slice of the fp32 module, fed those same (rounded) values in fp32, is the
reference.  The difference is the error the op introduces *by itself* (its own arithmetic and the
rounding or overflow of its result); inputs that already overflow in the low dtype are the
producer's doing and are flagged, not counted.  The *inherited* error is the reduced build's value
against the fp32 build's.  Both count new infinities, NaNs and values flushed to zero.

**Search** (:func:`find_keep_fp32`): start from the ops ranked by local error, rebuild with the
smallest prefix of the ranking that makes the model outputs meet the tolerance, then shrink it by
delta debugging (every candidate checked by a rebuild).
"""

from .analysis import OpError, PrecisionAnalysis, analyse, error_stats  # noqa: F401
from ...build.precision import Lowered, check_kept, lower_precision, resolve_names  # noqa: F401
from .search import OutputCheck, PrecisionOutcome, Search, check_outputs, ddmin, find_keep_fp32  # noqa: F401
from ...core.precision import BF16_REFUSED, LOW_DTYPES, PrecisionError, PrecisionSpec, parse_precision, precision_tolerance  # noqa: F401
