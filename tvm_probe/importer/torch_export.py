"""The export side of the PyTorch importer: ``torch.export`` of the user's module (with direct
``.forward`` calls made visible, so module paths name them), and where the user's code made a value."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import warnings
from pathlib import PurePath

from ..core.errors import ModelError, one_line
from ..core.install import install_hint


def require_torch():
    """The ``torch`` module, or a one-line :class:`ModelError` saying how to install it."""
    try:
        import torch
    except ImportError:
        raise ModelError(f"PyTorch is not installed: {install_hint('torch')}") from None
    return torch



def export_program(module, example_inputs, dynamic_shapes=None):
    """``torch.export.export(module, args).run_decompositions()``: the program TVM converts.

    ``from_exported_program`` decomposes before converting, and decomposition renames nodes, so
    the importer and the eager reference both read this program.  Export is deterministic:
    the same module and inputs give the same node names (``tests/models/test_torch.py`` checks it).
    """
    torch = require_torch()
    if not isinstance(module, torch.nn.Module):
        raise ModelError(f"cannot import a {type(module).__name__}: pass a torch.nn.Module")
    args = example_args(example_inputs)
    name = type(module).__name__
    with warnings.catch_warnings(), _quiet_torch():
        warnings.simplefilter("ignore")  # torch's deprecation chatter; failures are reported
        try:
            with visible_module_calls(module) as first_outputs:
                program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
        except Exception as err:
            raise ModelError(f"torch.export cannot trace {name}: {_export_failure(err)}") from None
        try:
            decomposed = program.run_decompositions()
        except Exception as err:
            raise ModelError(f"torch.export cannot decompose {name}: {one_line(err)}") from None
    decomposed.graph_module.meta[_FIRST_OUTPUTS] = {
        path: _alias_chain(program, name) for path, name in first_outputs.items()}
    return decomposed



_FIRST_OUTPUTS = "tvm_probe_first_outputs"  # graph_module.meta key: visible_module_calls' record



@contextlib.contextmanager
def visible_module_calls(module):
    """Within the block, a submodule whose ``forward`` is called directly runs as a module call.

    ``torch.export`` (and the dynamo ONNX exporter, which uses it) records a module only when it
    runs through ``Module.__call__``; ``x = block.forward(x, mask)`` records nothing, so the
    block's output would have no module path.  Inside this block each submodule's ``forward`` is
    an instance attribute that, when called directly, calls the module instead; ``__call__``
    then runs the class's own ``forward`` with the same arguments, so what is computed does not
    change.  A module with hooks of its own is left alone (routing would run its hooks on calls
    that skipped them).  Use it around a dynamo ONNX export to give those modules name scopes::

        with visible_module_calls(model):
            torch.onnx.export(model, args, "model.onnx", dynamo=True)

    Yields ``{module path: fx node name}``: for each module whose (last) call returned several
    tensors while torch traced it, the node of the first one, which forward hooks call the
    module's output (see :func:`_add_module_paths`).
    """
    first_outputs: dict[str, str] = {}
    routed = [_route_forward(m, name, first_outputs) for name, m in module.named_modules()
              if name and not _has_hooks(m)]
    try:
        yield first_outputs
    finally:
        for undo in routed:
            undo()



def _has_hooks(m) -> bool:
    """Hooks of the module's own, or global module hooks (which every module call runs)."""
    from torch.nn.modules import module as nn_module

    return bool(m._forward_hooks or m._forward_pre_hooks or nn_module._global_forward_hooks
                or nn_module._global_forward_pre_hooks)



def _route_forward(m, path: str, first_outputs: dict):
    """Make a direct ``m.forward(...)`` call ``m(...)``; returns the function that undoes it.

    A pre-hook counts the calls ``__call__`` has entered; the instance ``forward`` it then calls
    consumes one and runs the class's ``forward``.  With none pending, the call came from user
    code, and goes through ``m(...)``.
    """
    own = m.__dict__.get("forward")  # an instance forward already set (kept, and restored)
    original = own if own is not None else type(m).forward.__get__(m)
    pending = [0]

    def entered(_module, _args):
        pending[0] += 1

    def forward(*args, **kwargs):
        if pending[0]:
            pending[0] -= 1
            result = original(*args, **kwargs)
            _note_first_output(path, result, first_outputs)
            return result
        return m(*args, **kwargs)

    handle = m.register_forward_pre_hook(entered)
    m.forward = forward

    def undo():
        handle.remove()
        if own is not None:
            m.forward = own
        else:
            del m.forward
    return undo



def _note_first_output(path: str, result, first_outputs: dict) -> None:
    """While torch traces, record the fx node of ``result[0]`` when a call returns several tensors."""
    import torch
    from torch.fx.experimental import proxy_tensor

    if not isinstance(result, (tuple, list)):
        return
    tensors = [t for t in result if isinstance(t, torch.Tensor)]
    mode = getattr(proxy_tensor, "get_proxy_mode", lambda: None)()
    if len(tensors) < 2 or mode is None or not isinstance(result[0], torch.Tensor):
        return
    try:  # torch internals: without them the module keeps the "last value leaving it" rule
        name = proxy_tensor.get_proxy_slot(result[0], mode.tracer, None, lambda p: p.proxy.node.name)
    except Exception:
        name = None
    if name is not None:
        first_outputs[path] = name
    else:
        first_outputs.pop(path, None)



@contextlib.contextmanager
def _quiet_torch():
    """Silence what torch writes to stderr while exporting (graphs, tracebacks on failure).

    A failure becomes one ModelError line.  torch prints some of it directly and logs the rest
    through its own loggers, which do not propagate to the root logger and hold the original
    stderr, so they are switched off one by one and restored afterwards.
    """
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)
               if n == "torch" or n.startswith("torch.")]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, was in zip(loggers, before):
            lg.disabled = was



def example_args(example_inputs) -> tuple:
    """``forward``'s positional arguments: a tuple of tensors (a lone tensor is wrapped)."""
    torch = require_torch()
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise ModelError(f"example_inputs is a {type(example_inputs).__name__}: pass a tuple of tensors")
    return tuple(example_inputs)



def _export_failure(err: Exception) -> str:
    """One line: torch's reason, where it happened, and what to do about it."""
    text = str(err)
    reason = one_line(text, limit=160).rstrip(".")
    if "data-dependent" not in text:
        return f"{reason}: check that example_inputs fit forward() and that torch.export supports the model"
    where = re.search(r'File "([^"]+)", line (\d+), in \w+\n\s*(.+)',
                      text.split("The following call raised this error:")[-1])
    at = f" at {where[1]}:{where[2]} `{where[3].strip()}`" if where else ""
    return (f"{reason}{at}: make the forward traceable (no data-dependent Python control flow; "
            "use torch.where or torch.cond)")



# -- where the user's code made a value -------------------------------------------------------
def stack_origin(stack_trace: str | None) -> str:
    """``file:line`` of the user's code in an fx node's ``meta["stack_trace"]``, or ''.

    The trace lists frames outermost first; the innermost frame outside PyTorch itself is where
    the user's code made the value (``masked_fill(mask == 0, ...)``, or the ``self.token(x)``
    that called ``nn.Embedding``).
    """
    frames = re.findall(r'File "([^"]+)", line (\d+)', stack_trace or "")
    for path, line in reversed(frames):
        if not path.startswith("<") and not _in_torch(path) and not _in_tvm_probe(path):
            return f"{path}:{line}"
    return ""



def _in_tvm_probe(path: str) -> bool:
    """Frames of tvm_probe itself (its export wrappers) are never the user's line."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.abspath(path).startswith(root + os.sep)



def _in_torch(path: str) -> bool:
    torch = sys.modules.get("torch")
    root = os.path.dirname(getattr(torch, "__file__", "") or "")
    if root and os.path.abspath(path).startswith(root + os.sep):
        return True
    parts = PurePath(path).parts
    return any(p in ("site-packages", "dist-packages") for p in parts) and "torch" in parts


def _alias_chain(program, name: str) -> list[str]:
    """``name`` and the nodes it merely aliases (``x.to(x.dtype)``, ``alias``, ``clone``), nearest
    first: decomposition drops such no-op nodes and their users read the aliased node instead."""
    nodes = {n.name: n for n in program.graph.nodes}
    chain, node = [name], nodes.get(name)
    while node is not None and _is_noop_alias(node):
        node = node.args[0]
        chain.append(node.name)
    return chain


def _is_noop_alias(node) -> bool:
    source = node.args[0] if node.op == "call_function" and node.args else None
    if not hasattr(source, "meta") or not str(node.target).startswith(("aten.to.", "aten.alias.", "aten.clone.")):
        return False
    val, before = node.meta.get("val"), source.meta.get("val")
    return (hasattr(val, "shape") and hasattr(before, "shape") and val.dtype == before.dtype
            and tuple(val.shape) == tuple(before.shape))
