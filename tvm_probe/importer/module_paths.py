"""Module paths (``bert.encoder.layer.0.attention``) as names of the values modules output.

Shared by the PyTorch importer (fx nodes' ``nn_module_stack``) and the ONNX importer (the
dynamo exporter's ``pkg.torch.onnx.name_scopes``), so both follow one rule.

A module exported inside a wrapper (``Probe.from_hf`` exports a ``CacheStep`` that holds the
user's model as ``self.model``) names its values as the wrapped model does: :func:`relative_to`
is that one rule, for module paths and for parameter and buffer names alike.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping, Sequence

_GETATTR = re.compile(r"getattr\(([^()]*), '([^']*)'\)")
_SELF_PREFIX = re.compile(r"^(L\[['\"]self['\"]\]|self)(?=\.|\[|$)")
_SUBSCRIPT = re.compile(r"(?:\._modules)?\[['\"]?([^'\"\]]*)['\"]?\]")


def module_path(scope: str, root: str = "") -> str:
    """A module path in ``named_modules()`` form: ``bert.encoder.layer.0.attention.self.query``.

    torch versions spell paths ``bert.encoder.layer.0``, ``L['self'].bert.encoder.layer[0]`` or
    ``getattr(L['self'].bert.encoder.layer, '0')``; all become the first form ('' for the root),
    then the path as the submodule at ``root`` names it (:func:`relative_to`).
    """
    path = str(scope).strip()
    while _GETATTR.search(path):  # innermost first: the pattern admits no nested parentheses
        path = _GETATTR.sub(r"\1.\2", path)
    path = _SUBSCRIPT.sub(r".\1", _SELF_PREFIX.sub("", path))
    return relative_to(path.strip("."), root)


def relative_to(name: str, root: str) -> str:
    """``name`` — a module path or a parameter's or buffer's state-dict name of the exported
    module, dotted — as its submodule at path ``root`` names it: ``root.x`` → ``x``, ``root``
    itself → ``''`` (the root of ``named_modules()``: no name); a name outside ``root`` is kept,
    and ``root=''`` keeps every name.

    ``Probe.from_hf`` exports the user's causal LM inside a wrapper whose attribute ``model``
    holds it, so torch records ``model.model.layers.0`` and ``model.lm_head.weight``; with
    ``root="model"`` they are ``model.layers.0`` and ``lm_head.weight``, as the user's own
    ``named_modules()`` / ``named_parameters()`` spell them.
    """
    if not root:
        return name
    if name == root:
        return ""
    return name[len(root) + 1:] if name.startswith(root + ".") else name


def module_outputs(values: Iterable[tuple[str, Mapping, Sequence]],
                   first_outputs: Mapping[str, set] | None = None, root: str = "") -> dict[str, tuple[str, ...]]:
    """Which module paths name which value: ``{value key: (module path, ...)}``.

    The output of a module call is the last value (in graph order) produced inside that call and
    used outside it (or returned by the graph).  A module that returns several tensors answers,
    as a forward hook's ``output[0]`` does, with the first one: where ``first_outputs`` names it
    (its keys) and it leaves the call, it wins over the last.  A module called several times
    answers with its *last* call.  A path equal to some node's name is kept: the name then means two values, and
    name resolution says so (``module:relu`` / ``node:relu`` pick one).

    Args:
        values: ``(key, scopes, consumers)`` in graph order.  ``scopes`` maps each scope (one
            module call) the producer runs in to its raw module path; ``consumers`` holds, per
            use of the value, the collection of scopes the consumer runs in, or ``None`` for a
            graph output.
        first_outputs: ``{module path: keys}`` of the first tensor a module returned (paths
            already relative to ``root``).
        root: the submodule whose paths name the values (:func:`relative_to`); its own path
            becomes '' and names nothing.
    """
    first_outputs = first_outputs or {}
    last: dict[str, str] = {}
    first: dict[str, str] = {}
    for key, scopes, consumers in values:
        for scope, raw in scopes.items():
            if any(c is None or scope not in c for c in consumers):
                path = module_path(raw, root)
                if path:
                    last[path] = key
                    if key in first_outputs.get(path, ()):
                        first[path] = key
    last.update(first)
    found: dict[str, list[str]] = {}
    for path, key in last.items():
        found.setdefault(key, []).append(path)
    # innermost module first: the name closest to the op that computed the value
    return {k: tuple(sorted(p, key=lambda s: -s.count("."))) for k, p in found.items()}


def unrecorded_modules(all_paths: Iterable[str], recorded: Iterable[str],
                       containers: Iterable[str] = ()) -> dict[str, str]:
    """``{module path: why it has no value}`` for modules of the model in which ``torch.export``
    recorded no op: they did not run, computed nothing of their own (``Dropout`` in eval mode
    returns its input), or had their ``forward`` called directly while carrying hooks (the one
    case :func:`tvm_probe.importer.torch.visible_module_calls` leaves alone); and for
    ``containers`` (``ModuleList``, ``ModuleDict``), which have no ``forward`` at all."""
    recorded = set(recorded)
    notes = {path: ("a ModuleList or ModuleDict has no forward of its own, so it outputs nothing: name one of "
                    f"the modules it holds ({path}.0 ...)") for path in containers if path}
    notes.update({path: ("torch.export recorded no op of this module: it did not run in forward, computes nothing "
                         "of its own (as Dropout in eval mode), or has hooks and its forward was called directly; "
                         "name one of its ops, its input or its submodules instead")
                  for path in all_paths if path and path not in recorded})
    return notes
