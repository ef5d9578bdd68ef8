"""Random ONNX graphs made to stress the kernel map, and the check every served value must pass.

The generator draws its choices from a :class:`Chooser`, so the same code runs under
hypothesis (``tests/kernel_map/test_fuzz_kernel_map.py``, shrinkable, fixed seed in CI) and from a plain
seeded RNG (``bench/fuzz.py``, thousands of graphs on demand).  What it puts in a graph is what
broke earlier versions on real models:

* repeated identical subexpressions (the same op on the same inputs, under another name);
* shared weights, and identical blocks that FuseOps turns into one shared grouped function;
* multi-output ops (Split, TopK) and their elements used in different kernels;
* views (Reshape, Transpose, Squeeze/Unsqueeze, Flatten) and Identity;
* constants and branches FoldConstant folds, shape arithmetic the importer folds;
* dead branches, chains fusion puts into one kernel, graph outputs that are used inside too.

:func:`check_probe` is the property: every value the probe serves equals onnxruntime's, and
every claim that is not a value (dead, folded, constant) is checked independently of tvm_probe.

This module is a helper, not a test file.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
TOLERANCE = (1e-4, 1e-3)  # atol, rtol: fused and unfused TVM kernels against onnxruntime


class Chooser:
    """Where the generator's choices come from."""

    def int(self, lo: int, hi: int) -> int:  # inclusive
        raise NotImplementedError

    def choice(self, items):
        return items[self.int(0, len(items) - 1)]

    def coin(self, percent: int) -> bool:
        return self.int(1, 100) <= percent


class RandomChooser(Chooser):
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def int(self, lo, hi):
        return int(self.rng.integers(lo, hi + 1))


class HypothesisChooser(Chooser):
    def __init__(self, data):
        import hypothesis.strategies as st

        self._data, self._st = data, st

    def int(self, lo, hi):
        return self._data.draw(self._st.integers(lo, hi))


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: int = TensorProto.FLOAT


@dataclass
class _Graph:
    """A graph under construction: nodes, weights and the float tensors ops can read."""

    chooser: Chooser
    rng: np.random.Generator
    nodes: list = field(default_factory=list)
    weights: dict = field(default_factory=dict)   # name → TensorProto
    pool: list[_Tensor] = field(default_factory=list)
    used: set[str] = field(default_factory=set)
    counter: int = 0

    def name(self, op: str) -> str:
        self.counter += 1
        return f"n{self.counter}/{op}"

    def node(self, op: str, inputs: list[str], n_out: int = 1, named: bool = True, **attrs) -> list[str]:
        """Append ``op``; its node name is empty now and then (exporters do that too)."""
        base = self.name(op)
        outs = [f"{base}:{k}" if n_out > 1 else f"{base}_out" for k in range(n_out)]
        node_name = base if named and not self.chooser.coin(20) else ""
        self.nodes.append(helper.make_node(op, inputs, outs, name=node_name, **attrs))
        self.used.update(inputs)
        return outs

    def weight(self, shape, scale: float = 1.0) -> str:
        name = f"w{len(self.weights)}"
        array = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.weights[name] = numpy_helper.from_array(array, name)
        return name

    def weight_int(self, values) -> str:
        """An int64 initializer (shapes, axes, indices)."""
        name = f"i{len(self.weights)}"
        self.weights[name] = numpy_helper.from_array(np.array(values, dtype=np.int64), name)
        return name

    def pick(self, shape=None) -> _Tensor:
        """A float tensor of the pool, recent ones more likely (so chains get deep)."""
        pool = [t for t in self.pool if t.dtype == TensorProto.FLOAT and (shape is None or t.shape == shape)]
        recent = pool[-4:]
        return self.chooser.choice(recent if self.chooser.coin(70) else pool)

    def add(self, name: str, shape) -> _Tensor:
        t = _Tensor(name, tuple(shape))
        self.pool.append(t)
        return t


# -- the ops -------------------------------------------------------------------------------------
def _unary(g: _Graph):
    x = g.pick()
    op = g.chooser.choice(["Relu", "Tanh", "Sigmoid", "Neg", "Abs", "Identity", "Softmax"])
    attrs = {"axis": -1} if op == "Softmax" else {}
    g.add(g.node(op, [x.name], **attrs)[0], x.shape)


def _binary(g: _Graph):
    x = g.pick()
    if g.chooser.coin(60):
        y = g.pick(x.shape).name
    else:  # a broadcast weight, sometimes one that another op uses too
        shared = [w for w, t in g.weights.items()
                  if tuple(t.dims) == (x.shape[-1],) and t.data_type == TensorProto.FLOAT]
        y = g.chooser.choice(shared) if shared and g.chooser.coin(50) else g.weight((x.shape[-1],))
    op = g.chooser.choice(["Add", "Sub", "Mul", "Max", "Min"])
    g.add(g.node(op, [x.name, y])[0], x.shape)


def _matmul(g: _Graph):
    x = g.pick()
    k = x.shape[-1]
    n = g.chooser.choice([4, 6, 8])
    shared = [w for w, t in g.weights.items() if tuple(t.dims) == (k, n) and t.data_type == TensorProto.FLOAT]
    w = g.chooser.choice(shared) if shared and g.chooser.coin(50) else g.weight((k, n), 1 / np.sqrt(k))
    out = g.node("MatMul", [x.name, w])[0]
    if g.chooser.coin(50):  # a bias: MatMul + Add, what Gemm-less exporters write
        out = g.node("Add", [out, g.weight((n,))])[0]
    g.add(out, x.shape[:-1] + (n,))


def _mean_center(g: _Graph):
    """``x - mean(x)``, sometimes computing the same mean twice (hand-written LayerNorm)."""
    x = g.pick()
    mean = g.node("ReduceMean", [x.name], axes=[-1], keepdims=1)[0]
    g.add(mean, x.shape[:-1] + (1,))
    if g.chooser.coin(50):
        mean = g.node("ReduceMean", [x.name], axes=[-1], keepdims=1)[0]
    g.add(g.node("Sub", [x.name, mean])[0], x.shape)


def _split(g: _Graph):
    x = g.pick()
    parts = g.chooser.choice([p for p in (2, 3) if x.shape[-1] % p == 0] or [1])
    if parts == 1:
        return
    outs = g.node("Split", [x.name], n_out=parts, axis=-1)
    for o in outs:
        g.add(o, x.shape[:-1] + (x.shape[-1] // parts,))


def _topk(g: _Graph):
    x = g.pick()
    k = g.chooser.int(1, x.shape[-1])
    values, indices = g.node("TopK", [x.name, g.weight_int([k])], n_out=2, axis=-1)
    g.add(values, x.shape[:-1] + (k,))
    g.pool.append(_Tensor(indices, x.shape[:-1] + (k,), TensorProto.INT64))


def _view(g: _Graph):
    x = g.pick()
    kind = g.chooser.choice(["reshape", "transpose", "unsqueeze", "flatten"])
    if kind == "reshape" and len(x.shape) == 2 and x.shape[-1] % 2 == 0:
        shape = (x.shape[0], 2, x.shape[1] // 2)
        target = g.weight_int(shape)
        out = g.node("Reshape", [x.name, target])[0]
        g.add(out, shape)
    elif kind == "reshape" and len(x.shape) == 3:
        shape = (x.shape[0], x.shape[1] * x.shape[2])
        g.add(g.node("Reshape", [x.name, g.weight_int(shape)])[0], shape)
    elif kind == "transpose":
        perm = list(range(len(x.shape)))[::-1]
        g.add(g.node("Transpose", [x.name], perm=perm)[0], tuple(x.shape[p] for p in perm))
    elif kind == "unsqueeze":
        axes = g.weight_int((0,))
        mid = g.node("Unsqueeze", [x.name, axes])[0]
        g.add(g.node("Squeeze", [mid, axes])[0], x.shape)
    else:
        shape = (x.shape[0], int(np.prod(x.shape[1:])))
        g.add(g.node("Flatten", [x.name], axis=1)[0], shape)


def _constant_branch(g: _Graph):
    """A branch on weights alone: FoldConstant folds it (Transpose / Relu of a weight)."""
    x = g.pick()
    n = x.shape[-1]
    w = g.weight((n, n), 1 / np.sqrt(n))
    wt = g.node("Transpose", [w], perm=[1, 0])[0]
    wr = g.node("Relu", [wt])[0]
    g.add(g.node("MatMul", [x.name, wr])[0], x.shape)


def _shape_arithmetic(g: _Graph):
    """Reshape through Shape → Gather → Concat: the importer folds the shape to a constant."""
    x = g.pick()
    if len(x.shape) != 2:
        return
    shape = g.node("Shape", [x.name])[0]
    first = g.node("Gather", [shape, g.weight_int(0)], axis=0)[0]
    first1 = g.node("Unsqueeze", [first, g.weight_int((0,))])[0]
    target = g.node("Concat", [first1, g.weight_int((-1,))], axis=0)[0]
    g.add(g.node("Reshape", [x.name, target])[0], x.shape)


def _duplicate(g: _Graph):
    """The same op on the same inputs again, under a new name."""
    candidates = [n for n in g.nodes if n.op_type not in ("Shape", "Gather", "Concat") and len(n.output) == 1
                  and any(t.name == n.output[0] for t in g.pool)]
    if not candidates:
        return
    node = g.chooser.choice(candidates)
    shape = next(t.shape for t in g.pool if t.name == node.output[0])
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    g.add(g.node(node.op_type, list(node.input), **attrs)[0], shape)


def _block(g: _Graph):
    """MatMul → Add → Tanh twice on the same shapes: FuseOps shares one grouped function."""
    x = g.pick()
    n = x.shape[-1]
    w = g.weight((n, n), 1 / np.sqrt(n))
    for _ in range(2):
        w_i = w if g.chooser.coin(30) else g.weight((n, n), 1 / np.sqrt(n))
        h = g.node("MatMul", [x.name, w_i])[0]
        h = g.node("Add", [h, g.weight((n,))])[0]
        x = g.add(g.node("Tanh", [h])[0], x.shape)


_OPS = [_unary, _unary, _binary, _binary, _matmul, _mean_center, _split, _topk, _view, _view,
        _constant_branch, _shape_arithmetic, _duplicate, _duplicate, _block]


def random_graph(chooser: Chooser, max_ops: int = 10) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A random model (see module docstring) and inputs for it."""
    rng = np.random.default_rng(chooser.int(0, 2**31))
    g = _Graph(chooser, rng)
    width = chooser.choice([4, 6, 8])
    g.add("x", (2, width))
    if chooser.coin(40):
        g.add("y", (2, width))
    for _ in range(chooser.int(2, max_ops)):
        chooser.choice(_OPS)(g)
    floats = [t for t in g.pool if t.dtype == TensorProto.FLOAT and t.name not in ("x", "y")]
    if not floats:
        _unary(g)
        floats = [t for t in g.pool if t.name not in ("x", "y")]
    outputs = [floats[-1]]  # the last value, and now and then a value used inside too
    extra = [t for t in g.pool if t.name not in ("x", "y") and t is not floats[-1]]
    if extra and chooser.coin(50):
        outputs.append(chooser.choice(extra))
    graph_inputs = [t for t in g.pool if t.name in ("x", "y")]
    graph = helper.make_graph(
        g.nodes, "fuzz",
        [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.shape)) for t in graph_inputs],
        [helper.make_tensor_value_info(t.name, t.dtype, list(t.shape)) for t in outputs],
        list(g.weights.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model, random_inputs(model, rng)


def random_inputs(model, rng) -> dict[str, np.ndarray]:
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


# -- the property --------------------------------------------------------------------------------
def live_tensors(model) -> set[str]:
    """Tensors some graph output depends on, from the ONNX graph alone (not tvm_probe's code)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    live, todo = set(), [o.name for o in model.graph.output]
    while todo:
        name = todo.pop()
        if name in live:
            continue
        live.add(name)
        if name in producer:
            todo.extend(producer[name].input)
    return live


def all_values(model, inputs) -> dict[str, np.ndarray]:
    """onnxruntime's value of every node output (the model is copied with every tensor an output)."""
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    known = {o.name for o in m.graph.output}
    for node in m.graph.node:
        for out in node.output:
            if out and out not in known:
                m.graph.output.append(helper.make_empty_tensor_value_info(out))
    options = ort.SessionOptions()
    options.log_severity_level = 3  # no warnings about the unused weights the generator leaves
    sess = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs)))


def check_probe(probe, model, inputs, other_inputs) -> list[str]:
    """Every problem with what ``probe`` serves after ``probe.run(inputs)`` (empty: all right).

    Served values must equal onnxruntime's.  "dead" must be dead in the ONNX graph; "folded" and
    "constant" values must equal onnxruntime's and not change when the inputs change; nothing
    may be "unknown".
    """
    from tvm_probe.core.sources import Kind, Served
    from tvm_probe.core.tolerance import Tolerance, within

    ref, ref2 = all_values(model, inputs), all_values(model, other_inputs)
    live = live_tensors(model)
    tol = Tolerance(*TOLERANCE)
    problems = []
    for value in probe.sources_map:
        if value.kind in (Kind.INPUT, Kind.PARAM):
            continue
        key, served = value.key, probe.servings[value.key].served
        if served is Served.UNKNOWN:
            problems.append(f"{key}: unknown ({probe.kernel_map.lost.get(key)})")
            continue
        if served is Served.UNAVAILABLE:
            if key in live:
                problems.append(f"{key}: called dead but a graph output depends on it")
            continue
        got = probe.get_tensor(key)
        if got.shape != ref[key].shape or not within(got, ref[key], tol).all():
            err = np.abs(got.astype(np.float64) - ref[key]).max() if got.shape == ref[key].shape else "shape"
            problems.append(f"{key}: served as {served.value}, differs from onnxruntime (max abs error {err})")
        if served in (Served.FOLDED, Served.CONSTANT) and not np.array_equal(ref[key], ref2[key]):
            problems.append(f"{key}: served as {served.value} but its value depends on the inputs")
    return problems
