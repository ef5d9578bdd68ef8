"""The op campaign: many small models, each run by plain TVM and by tvm_probe, values compared.

A :class:`Case` is one small model (an ONNX op with its attributes, dtypes and, in the ``@dyn``
variant, every input dimension symbolic; or a torch.export program of one aten op or a small
module, :mod:`support.campaign_torch`).  :func:`run_case` runs it under one pipeline:

1. **plain TVM**: TVM's own importer, ``tvm.compile`` with that pipeline, the VM; a model plain
   TVM cannot build or run is recorded as such and goes no further (not ours to run);
2. **tvm_probe**: ``Probe.from_onnx`` / ``Probe.from_torch`` with the same pipeline, one run;
   its outputs must equal plain TVM's;
3. **every value**: a served value is compared with plain TVM's value of that tensor, from plain
   TVM built with every tensor as an extra output (an ONNX graph with every node output a graph
   output; a torch.export program whose output node returns every intermediate tensor too): the
   differential check, TVM's own value whatever the reference says; and with onnxruntime's (eager
   torch's), which is what decides where plain TVM cannot give that value.  An unknown value must
   say why in one line; ``get`` must never raise anything but that explicit unknown.

The result is an :class:`Outcome` (plain data) whose :attr:`Outcome.problems` are empty when
tvm_probe did everything right.  ``bench/campaign.py`` runs all cases and writes
``bench/campaign_results.md``; ``tests/models/test_op_campaign.py`` runs a fixed sample.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

PIPELINES = ("default", "fused")
RTOL, ATOL = 1e-3, 1e-4


@dataclass(frozen=True)
class Case:
    """One model of the campaign; ``make()`` gives ``(model, inputs)``: an ONNX ModelProto and
    ``{input name: array}``, or a torch module and its tuple of example tensors."""

    name: str
    family: str  # "onnx" or "torch"
    cls: str     # what results are counted by: the op type, or the torch case's group
    make: Callable


@dataclass
class Outcome:
    """What one case did under one pipeline."""

    case: str
    cls: str
    pipeline: str
    plain: str = ""        # "" when plain TVM built and ran it, else why not (one line)
    probe: str = ""        # "" when tvm_probe ran it, else its failure (one line)
    compared: int = 0      # served values compared
    equal: int = 0         # ... equal to the reference (onnxruntime / eager) or to plain TVM
    via_tvm: int = 0       # ... of which equal to plain TVM only (the reference differs from TVM)
    against_tvm: int = 0   # ... of which plain TVM gave its value (built with it as an output)
    dead: int = 0          # values no output depends on (unavailable)
    uncompared: int = 0    # served, but neither the reference nor plain TVM gives that value
    unknown: dict = field(default_factory=dict)  # key → why (one line)
    wrong: list = field(default_factory=list)    # values served wrongly or whose get raised

    @property
    def ran_plain(self) -> bool:
        return not self.plain

    @property
    def problems(self) -> list[str]:
        """What tvm_probe did wrong (an unknown is not a problem when it says why in one line)."""
        if self.plain:
            return []
        out = [f"run: {self.probe}"] if self.probe else []
        out += list(self.wrong)
        out += [f"{k}: unknown without a one-line reason" for k, why in self.unknown.items()
                if not why or "\n" in why]
        return out


def one_line(err: BaseException | str, limit: int = 300) -> str:
    text = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "…"


def reason_class(text: str) -> str:
    """A reason with names and numbers taken out, so that equal reasons count together."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"\b[\w.]*\d[\w.]*\b", "N", text)
    return text[:160]


# -- comparing ---------------------------------------------------------------------------------
def same(a, b) -> bool:
    if isinstance(a, list) or isinstance(b, list):  # sequences: element by element
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "fc" or b.dtype.kind in "fc":
        return bool(np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=RTOL, atol=ATOL, equal_nan=True))
    return bool(np.array_equal(a, b))


def to_numpy_list(value) -> list[np.ndarray]:
    """A VM result (tensor, tuple, shape, scalar, nested) as a flat list of arrays."""
    import tvm

    if isinstance(value, (list, tuple, tvm.ir.Array)) and not isinstance(value, tvm.runtime.ShapeTuple):
        return [a for v in value for a in to_numpy_list(v)]
    if isinstance(value, tvm.runtime.ShapeTuple):
        return [np.array(list(value), dtype=np.int64)]
    if hasattr(value, "numpy"):
        return [value.numpy()]
    if value is None:
        return []
    return [np.asarray(value)]


def _pipeline_pass(pipeline: str):
    import tvm

    from tvm_probe.build.compile import resolve_pipeline

    return resolve_pipeline(pipeline, tvm.target.Target("llvm"))[0]


def run_vm(mod, pipeline: str, args, outputs: int | None = None) -> list:
    """``tvm.compile(mod)`` with ``pipeline`` and one run on the CPU: the outputs, flattened (or,
    given the number of ``outputs`` of ``main``, one item per output: an array, or a sequence's
    list of arrays)."""
    import tvm
    from tvm import relax

    ex = tvm.compile(mod, target="llvm", relax_pipeline=_pipeline_pass(pipeline))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    # np.require, not ascontiguousarray: that turns a 0-d input (an If's condition, TopK's k) 1-d
    results = [vm["main"](*[tvm.runtime.tensor(np.require(a, requirements="C")) for a in args]) for _ in range(2)]
    runs = [to_numpy_list(r) for r in results]
    if len(runs[0]) != len(runs[1]) or not all(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
                                               for a, b in zip(*runs)):
        # (a reduction over an empty axis reads memory it never wrote: nothing to compare with)
        raise RuntimeError("plain TVM's outputs differ between two runs of one build on the same inputs")
    if outputs is None:
        return runs[0]
    return [_one_output(item) for item in (list(results[0]) if outputs > 1 else [results[0]])]


def _one_output(item):
    """One output as an array, or a sequence (a tuple of tensors) as its list of arrays."""
    import tvm

    if isinstance(item, (list, tuple, tvm.ir.Array)) and not isinstance(item, tvm.runtime.ShapeTuple):
        return [a for v in item for a in to_numpy_list(v)]
    return to_numpy_list(item)[0]


# -- ONNX ----------------------------------------------------------------------------------------
def onnx_plain(model, inputs: Mapping[str, np.ndarray], pipeline: str, outputs: int | None = None) -> list:
    """Plain TVM: ``from_onnx``, ``tvm.compile``, the VM (outputs as :func:`run_vm` gives them)."""
    from tvm.relax.frontend.onnx import from_onnx

    mod = from_onnx(model)
    inits = {t.name for t in model.graph.initializer}
    return run_vm(mod, pipeline, [inputs[i.name] for i in model.graph.input if i.name not in inits],
                  outputs)


def with_all_outputs(model):
    """A copy of ``model`` with every node output also a graph output (in node order)."""
    from onnx import ModelProto, helper

    m = ModelProto()
    m.CopyFrom(model)
    known = {o.name for o in m.graph.output}
    for node in m.graph.node:
        for out in node.output:
            if out and out not in known:
                known.add(out)
                m.graph.output.append(helper.make_empty_tensor_value_info(out))
    return m


def ort_values(model, inputs) -> dict[str, np.ndarray]:
    """onnxruntime's value of every node output it can give ({} if it cannot run the model); a
    sequence as its list of arrays, and each element ``k`` under ``name[k]`` too (tvm_probe's
    name of that element)."""
    import onnxruntime as ort

    m = with_all_outputs(model)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        sess = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        values = dict(zip(names, sess.run(names, dict(inputs))))
    except Exception:
        return {}
    out = {n: v for n, v in values.items() if isinstance(v, np.ndarray)}
    for name, seq in values.items():
        if isinstance(seq, list) and all(isinstance(v, np.ndarray) for v in seq):
            out[name] = seq
            out.update({f"{name}[{k}]": v for k, v in enumerate(seq)})
    return out


def tvm_values(model, inputs, pipeline) -> dict[str, np.ndarray]:
    """Plain TVM's value of every node output: the model built with all of them as outputs
    ({} if that build fails, or it returns another number of outputs); a sequence as its list of
    arrays, and each element ``k`` under ``name[k]`` too, as :func:`ort_values` gives them."""
    m = with_all_outputs(model)
    names = [o.name for o in m.graph.output]
    try:
        outs = onnx_plain(m, inputs, pipeline, outputs=len(names))
    except Exception:
        return {}
    if len(outs) != len(names):
        return {}
    values = dict(zip(names, outs))
    for name, seq in list(values.items()):
        if isinstance(seq, list):
            values.update({f"{name}[{k}]": v for k, v in enumerate(seq)})
    return values


def run_onnx(case: Case, pipeline: str) -> Outcome:
    from tvm_probe import Probe

    model, inputs = case.make()
    outcome = Outcome(case.name, case.cls, pipeline)
    try:
        plain = onnx_plain(model, inputs, pipeline)
    except Exception as err:
        outcome.plain = one_line(err)
        return outcome
    try:
        probe = Probe.from_onnx(model, pipeline=pipeline)
        got = probe.run(inputs, allow_nonfinite=True)
    except Exception as err:
        outcome.probe = one_line(err)
        return outcome
    _check_outputs(outcome, [got[o.name] for o in model.graph.output if o.name in got], plain)
    check_values(outcome, probe, ort_values(model, inputs), lazy(lambda: tvm_values(model, inputs, pipeline)))
    if outcome.wrong and plain_is_undefined(model, inputs, pipeline, plain):
        # (a reduction over an empty axis reads memory it never wrote: each build, each run, reads
        # other garbage, so tvm_probe's build has nothing to be held to)
        return Outcome(case.name, case.cls, pipeline, plain=UNDEFINED)
    return outcome


UNDEFINED = "plain TVM's values differ between two builds, or two runs, of one model on the same inputs"


def plain_is_undefined(model, inputs, pipeline: str, plain: list) -> bool:
    """Whether plain TVM's values on this model are not defined: a second build returns other
    outputs than ``plain``, or the build with every tensor an output differs between two runs."""
    try:
        again = onnx_plain(model, inputs, pipeline)
        if len(again) != len(plain) or not all(map(same, again, plain)):
            return True
        onnx_plain(with_all_outputs(model), inputs, pipeline)
    except RuntimeError as err:
        return "differ between two runs" in str(err)
    except Exception:  # (a build that fails says nothing either way)
        return False
    return False


def lazy(build: Callable[[], dict]) -> Callable:
    """``key → value`` of the dict ``build()`` makes, made at the first call (a model with
    nothing served builds nothing)."""
    made: list[dict] = []

    def value(key):
        if not made:
            made.append(build())
        return made[0].get(key)
    return value


def _check_outputs(outcome: Outcome, got: list, plain: list) -> None:
    flat = [a for g in got for a in (to_numpy_list(g) if not isinstance(g, np.ndarray) else [g])]
    if len(flat) != len(plain):
        outcome.wrong.append(f"outputs: {len(flat)} served, plain TVM returns {len(plain)}")
        return
    for k, (a, b) in enumerate(zip(flat, plain)):
        if not same(a, b):
            outcome.wrong.append(f"output {k} differs from plain TVM's")


def check_values(outcome: Outcome, probe, reference: Mapping, tvm_value: Callable) -> None:
    """Every value ``probe`` holds: served ones against ``tvm_value(key)`` (plain TVM's, built with
    that value as an output; None where it cannot give it) and ``reference`` (onnxruntime's, eager
    torch's: what decides where plain TVM gives nothing), unknown ones with their one-line why."""
    from tvm_probe.core.sources import Kind, Served

    for value in probe.sources_map:
        if value.kind in (Kind.INPUT, Kind.PARAM):
            continue
        key, served = value.key, probe.servings[value.key].served
        if served is Served.UNAVAILABLE:
            outcome.dead += 1
            continue
        try:
            got = probe.get_tensor(key)
        except Exception as err:
            if served is Served.UNKNOWN and type(err).__name__ == "ValueUnavailableError":
                outcome.unknown[key] = str(err)
            else:
                outcome.wrong.append(f"{key}: get raised {one_line(err)} (served: {served.value})")
            continue
        if served is Served.UNKNOWN:
            outcome.wrong.append(f"{key}: answers a value although it is unknown")
            continue
        theirs, ref = tvm_value(key), reference.get(key)
        if theirs is None and ref is None:
            outcome.uncompared += 1
            continue
        outcome.compared += 1
        outcome.against_tvm += theirs is not None
        as_ref = ref is not None and same(got, ref)
        if theirs is not None and not same(got, theirs):
            outcome.wrong.append(f"{key}: served as {served.value}, differs from plain TVM's value (built with it "
                                 f"as an output){', although equal to the reference' if as_ref else ''}")
        elif theirs is None and not as_ref:
            outcome.wrong.append(f"{key}: served as {served.value}, differs from the reference (plain TVM gives "
                                 "no value to compare with)")
        else:
            outcome.equal += 1
            outcome.via_tvm += ref is not None and not as_ref


def run_plain(case: Case, pipeline: str) -> list[np.ndarray]:
    """Plain TVM alone on ``case`` (what a crashed case is run again with, in a process of its
    own, to tell whose crash it was)."""
    from .campaign_torch import torch_plain

    model, inputs = case.make()
    return (onnx_plain if case.family == "onnx" else torch_plain)(model, inputs, pipeline)


def run_case(case: Case, pipeline: str) -> Outcome:
    """``case`` under ``pipeline``; an exception of the campaign itself is recorded, not raised."""
    from .campaign_torch import run_torch

    try:
        return (run_onnx if case.family == "onnx" else run_torch)(case, pipeline)
    except Exception as err:
        return Outcome(case.name, case.cls, pipeline, probe=f"campaign error: {one_line(err)}")
