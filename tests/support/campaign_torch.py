"""torch.export cases of the op campaign (:mod:`support.campaign`): single aten ops and small
modules, through ``Probe.from_torch``; every served value is held to plain TVM's value of that
fx node (:func:`torch_values`: the exported program with every intermediate tensor an output
too) and to eager PyTorch running the exported program node by node (the program TVM converts),
the outputs to plain TVM's (``from_exported_program``, ``tvm.compile``, the VM) and to the
module's own eager outputs.
"""
from __future__ import annotations

import numpy as np

from .campaign import Case, Outcome, _check_outputs, check_values, lazy, one_line, run_vm, same


def _flat(value) -> list[np.ndarray]:
    import torch

    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _flat(v)]
    if isinstance(value, torch.Tensor):
        return [value.detach().numpy().copy()]
    if value is None:
        return []
    return [np.asarray(value)]


def _clone(args):
    return tuple(a.clone() for a in args)


def torch_plain(module, args, pipeline) -> list[np.ndarray]:
    """Plain TVM: ``torch.export.export``, ``from_exported_program``, ``tvm.compile``, the VM."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    program = torch.export.export(module, _clone(args))
    mod = from_exported_program(program)
    return run_vm(mod, pipeline, [a.numpy() for a in args])


#: ops whose converter in TVM's importer writes the result into its first argument's slot (an
#: in-place write): from there on TVM's "value of that node" is the written one, so plain TVM has
#: no value of its own for the destination (the node before the write) to compare with
_WRITES_INTO_FIRST = frozenset({"copy.default", "copy_.default", "fill_.Scalar", "masked_fill_.Scalar",
                                "zero_.default"})


def torch_values(module, args, pipeline) -> dict[str, np.ndarray]:
    """Plain TVM's value of every intermediate tensor, by fx node name ({} if that build fails).

    The exported and decomposed program (what ``from_exported_program`` converts) gets every
    call_function node holding one tensor appended to its output node; TVM imports it with no
    second decomposition (that would rename the nodes), and the extra outputs come last in what
    the VM returns.  Nothing of tvm_probe's is on the way.  Left out: the destinations of
    :data:`_WRITES_INTO_FIRST` (eager torch's value before the write decides there)."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    try:
        program = torch.export.export(module, _clone(args)).run_decompositions()
        graph = program.graph_module.graph
        written = {n.args[0] for n in graph.nodes
                   if n.op == "call_function" and getattr(n.target, "__name__", "") in _WRITES_INTO_FIRST}
        extras = [n for n in graph.nodes if n.op == "call_function" and n not in written
                  and isinstance(n.meta.get("val"), torch.Tensor)]
        output = next(n for n in graph.nodes if n.op == "output")
        returned = output.args[0]
        output.args = ((*(returned if isinstance(returned, (tuple, list)) else (returned,)), *extras),)
        program.graph_module.recompile()
        outs = run_vm(from_exported_program(program, run_ep_decomposition=False), pipeline, [a.numpy() for a in args])
    except Exception:  # noqa: BLE001 - then the reference alone decides (as where TVM gives no value)
        return {}
    return dict(zip((n.name for n in extras), outs[-len(extras):])) if extras and len(outs) >= len(extras) else {}


def eager_values(module, args) -> dict[str, np.ndarray]:
    """Every fx node of the exported program, run node by node in eager PyTorch, by source key.

    ``aten.empty`` has unspecified contents; it runs as zeros (what TVM's importer makes of it).
    """
    import torch

    from tvm_probe.importer.torch import export_program, lifted_tensors, node_keys

    program = export_program(module, _clone(args))
    keys = node_keys(program)
    tensors, user = lifted_tensors(program), iter(_clone(args))
    kinds = torch.export.graph_signature.InputKind
    graph_args = [next(user) if s.kind is kinds.USER_INPUT else tensors[s.target]
                  for s in program.graph_signature.input_specs]
    values = {}

    class Eager(torch.fx.Interpreter):
        def call_function(self, target, fargs, kwargs):
            if target is torch.ops.aten.empty.memory_format:
                return torch.zeros(fargs[0], **{k: v for k, v in kwargs.items() if k != "memory_format"})
            return super().call_function(target, fargs, kwargs)

        def run_node(self, node):
            result = super().run_node(node)
            if node in keys and isinstance(result, torch.Tensor):
                values[keys[node]] = result.detach().numpy().copy()  # before any later write into it
            return result

    with torch.no_grad():
        Eager(program.graph_module).run(*graph_args)
    return values


def run_torch(case: Case, pipeline: str) -> Outcome:
    import torch

    from tvm_probe import Probe

    module, args = case.make()
    outcome = Outcome(case.name, case.cls, pipeline)
    with torch.no_grad():
        eager = _flat(module(*_clone(args)))
    try:
        plain = torch_plain(module, args, pipeline)
    except Exception as err:
        outcome.plain = one_line(err)
        return outcome
    if len(plain) == len(eager) and not all(same(a, b) for a, b in zip(plain, eager)):
        outcome.plain = "plain TVM's outputs differ from eager PyTorch's (not compared further)"
        return outcome
    try:
        probe = Probe.from_torch(module, _clone(args), pipeline=pipeline)
        got = probe.run([a.numpy() for a in args], allow_nonfinite=True)
    except Exception as err:
        outcome.probe = one_line(err)
        return outcome
    _check_outputs(outcome, list(got.values()), plain)
    check_values(outcome, probe, eager_values(module, args), lazy(lambda: torch_values(module, args, pipeline)))
    return outcome


# -- the cases -----------------------------------------------------------------------------------
def _randn(*shape, seed=0):
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class Fn:
    """A module around one function of its inputs (made lazily: torch is imported late)."""

    def __new__(cls, fn, name):
        import torch

        class _Fn(torch.nn.Module):
            def forward(self, *xs):
                return fn(*xs)

        _Fn.__name__ = _Fn.__qualname__ = name
        return _Fn().eval()


def _op(name, group, fn, *shapes, ints=False):
    def make():
        import torch

        args = tuple(_randn(*s, seed=k) for k, s in enumerate(shapes))
        if ints:
            args = tuple((a * 4).to(torch.int64) for a in args)
        return Fn(fn, name), args
    return Case(f"torch/{name}", "torch", group, make)


def _mod(name, group, factory, *shapes):
    def make():
        import torch

        torch.manual_seed(0)
        return factory().eval(), tuple(_randn(*s, seed=k) for k, s in enumerate(shapes))
    return Case(f"torch/{name}", "torch", group, make)


def torch_cases() -> list[Case]:
    import torch
    import torch.nn.functional as F  # noqa: N812

    nn = torch.nn
    unary = {
        "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp,
        "log": lambda x: torch.log(x.abs() + 1), "sqrt": lambda x: torch.sqrt(x.abs()),
        "rsqrt": lambda x: torch.rsqrt(x.abs() + 1), "sin": torch.sin, "cos": torch.cos, "neg": torch.neg,
        "abs": torch.abs, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "silu": F.silu, "softplus": F.softplus, "elu": F.elu, "leaky_relu": F.leaky_relu,
        "hardtanh": F.hardtanh, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "mish": F.mish,
        "erf": torch.erf, "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "sign": torch.sign,
        "reciprocal": lambda x: torch.reciprocal(x.abs() + 1), "clamp": lambda x: x.clamp(-0.5, 0.5),
        "relu6": F.relu6, "selu": F.selu, "celu": F.celu, "logsigmoid": F.logsigmoid,
        "softmax": lambda x: x.softmax(-1), "log_softmax": lambda x: x.log_softmax(-1),
        "square": torch.square, "trunc": torch.trunc, "isnan": lambda x: torch.isnan(x).float(),
    }
    binary = {
        "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
        "pow": lambda a, b: torch.pow(a.abs() + 0.5, b), "maximum": torch.maximum, "minimum": torch.minimum,
        "where": lambda a, b: torch.where(a > 0, a, b), "lt": lambda a, b: (a < b).float(),
        "eq_int": lambda a, b: (a.round() == b.round()).to(torch.int32), "atan2": torch.atan2,
        "matmul_t": lambda a, b: a @ b.T, "fmod": lambda a, b: torch.fmod(a, b.abs() + 1),
    }
    cases = [_op(n, "unary", f, (2, 3, 4)) for n, f in unary.items()]
    cases += [_op(n, "binary", f, (3, 4), (3, 4)) for n, f in binary.items()]
    cases += [_op("add_broadcast", "binary", torch.add, (2, 3, 4), (4,)),
              _op("int_add_mul", "binary", lambda a, b: a * 2 + b, (3, 4), (3, 4), ints=True)]
    reduce = {
        "sum_dim": lambda x: x.sum(1), "mean_keep": lambda x: x.mean(-1, keepdim=True),
        "max_dim": lambda x: x.max(1), "min_dim_values": lambda x: x.min(2).values,
        "argmax": lambda x: x.argmax(-1), "prod": lambda x: x.prod(1), "std": lambda x: x.std(1),
        "var": lambda x: x.var(-1), "logsumexp": lambda x: x.logsumexp(1), "cumsum": lambda x: x.cumsum(1),
        "amax": lambda x: x.amax((0, 2)), "norm": lambda x: x.norm(dim=-1), "all_any": lambda x: (x > 0).any(1),
    }
    cases += [_op(n, "reduce", f, (2, 3, 4)) for n, f in reduce.items()]
    shape = {
        "reshape": lambda x: x.reshape(6, 4) + 1, "permute": lambda x: x.permute(2, 0, 1) * 2,
        "transpose": lambda x: x.transpose(0, 1).contiguous() + 1, "flatten": lambda x: x.flatten(1).relu(),
        "squeeze_unsqueeze": lambda x: x.unsqueeze(0).squeeze(0) + 1, "expand": lambda x: x[:, :1].expand(2, 3, 4) * 2,
        "repeat": lambda x: x.repeat(1, 2, 1), "cat": lambda x: torch.cat([x, x * 2], 1),
        "stack": lambda x: torch.stack([x, -x], 0), "split": lambda x: [t + 1 for t in x.split(2, -1)],
        "chunk": lambda x: x.chunk(3, 1)[1] * 2, "narrow": lambda x: x.narrow(2, 1, 2) + 1,
        "slice_step": lambda x: x[:, ::2, 1:] * 2, "select": lambda x: x[1] + 1,
        "index_select": lambda x: x.index_select(2, torch.tensor([3, 0])),
        "gather": lambda x: x.gather(2, torch.tensor([[[0, 1]] * 3] * 2)), "flip": lambda x: x.flip(1),
        "roll": lambda x: x.roll(1, 2), "tril": lambda x: x.tril(), "triu": lambda x: x.triu(1),
        "pad_constant": lambda x: F.pad(x, (1, 2)), "pad_reflect": lambda x: F.pad(x, (1, 1), mode="reflect"),
        "pad_replicate": lambda x: F.pad(x, (1, 1), mode="replicate"),
        "pad_circular": lambda x: F.pad(x, (1, 1), mode="circular"),
        "masked_fill": lambda x: x.masked_fill(x > 0, 0.5), "topk": lambda x: x.topk(2, -1),
        "sort": lambda x: x.sort(-1).values, "view_chain": lambda x: x.view(2, 12).t().contiguous().view(-1),
        "einsum": lambda x: torch.einsum("abc,abd->acd", x, x), "bmm": lambda x: torch.bmm(x, x.transpose(1, 2)),
        "one_hot": lambda x: F.one_hot(x.argmax(-1), 5).float(),
        "masked_select": lambda x: x.masked_select(x > 0),
        "return_none": lambda x: (x + 1, None),
    }
    cases += [_op(n, "shape", f, (2, 3, 4)) for n, f in shape.items()]

    def inplace(fn):
        def forward(x, y):
            fn(x, y)
            return x * 2
        return forward
    inplace_ops = {
        "add_": lambda x, y: x.add_(1), "mul_": lambda x, y: x.mul_(y), "relu6_": lambda x, y: F.relu6(x, inplace=True),
        "fill_": lambda x, y: x.fill_(3.0), "copy_": lambda x, y: x.copy_(y),
        "index_put_": lambda x, y: x.index_put_((torch.tensor([0, 2]), torch.tensor([1, 3])), y[0, :2]),
        "index_put_rows_": lambda x, y: x.index_put_((torch.tensor([0, 2]),), y[:2]),
        "clamp_": lambda x, y: x.clamp_(-0.1, 0.1), "slice_copy_": lambda x, y: x[:, 1:].copy_(y[:, 1:]),
    }
    cases += [_op(f"inplace_input_{n}", "in-place on input", inplace(f), (3, 4), (3, 4))
              for n, f in inplace_ops.items()]
    cases += [_op("inplace_input_returned", "in-place on input", lambda x: x.add_(1), (3, 4))]
    modules = {
        "linear": (lambda: nn.Linear(4, 3), (2, 4)),
        "mlp": (lambda: nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2)), (3, 4)),
        "conv1d": (lambda: nn.Conv1d(2, 3, 3, padding=1), (1, 2, 6)),
        "conv2d": (lambda: nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU()), (1, 2, 6, 6)),
        "conv2d_group_stride": (lambda: nn.Conv2d(4, 4, 3, stride=2, groups=2), (1, 4, 7, 7)),
        "conv_transpose2d": (lambda: nn.ConvTranspose2d(2, 3, 2, stride=2), (1, 2, 3, 3)),
        "batchnorm2d": (lambda: nn.BatchNorm2d(3), (2, 3, 4, 4)),
        "layernorm": (lambda: nn.LayerNorm(4), (2, 3, 4)),
        "groupnorm": (lambda: nn.GroupNorm(2, 4), (1, 4, 3, 3)),
        "instancenorm": (lambda: nn.InstanceNorm2d(2), (1, 2, 4, 4)),
        "maxpool2d": (lambda: nn.MaxPool2d(2), (1, 2, 4, 4)),
        "avgpool2d": (lambda: nn.AvgPool2d(3, stride=1, padding=1), (1, 2, 4, 4)),
        "adaptive_avgpool": (lambda: nn.AdaptiveAvgPool2d(1), (1, 2, 4, 4)),
        "pixel_shuffle": (lambda: nn.PixelShuffle(2), (1, 4, 2, 2)),
        "upsample_nearest": (lambda: nn.Upsample(scale_factor=2), (1, 1, 2, 3)),
        "upsample_bilinear": (lambda: nn.Upsample(scale_factor=2, mode="bilinear"), (1, 1, 2, 3)),
        "softmax_module": (lambda: nn.Softmax(dim=1), (2, 5)),
        "dropout_eval": (lambda: nn.Sequential(nn.Dropout(0.5), nn.Tanh()), (2, 5)),
        "mha": (lambda: nn.MultiheadAttention(4, 2, batch_first=True), (1, 3, 4), (1, 3, 4), (1, 3, 4)),
        "lstm": (lambda: nn.LSTM(4, 5, batch_first=True), (1, 3, 4)),
        "gru": (lambda: nn.GRU(4, 5, batch_first=True), (1, 3, 4)),
        "transformer_layer": (lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                              (1, 3, 8)),
    }
    cases += [_mod(n, "module", f, *s) for n, (f, *s) in modules.items()]
    cases += [_op("sdpa", "module", F.scaled_dot_product_attention, (1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4)),
              _op("embedding_like", "module", lambda x: F.embedding(x.abs().argmax(-1) % 3, x), (3, 4))]
    return cases
