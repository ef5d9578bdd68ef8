"""Reference values from PyTorch eager: every fx node of the program tvm_probe imports.

The reference must be keyed exactly like :func:`tvm_probe.importer.torch.import_torch`.  Both
build the program with the same :func:`~tvm_probe.importer.torch.export_program` (export, then
the decompositions TVM's importer runs) and name values with the same
:func:`~tvm_probe.importer.torch.node_keys`.  Export is deterministic, so exporting the same
module and inputs again gives the same node names (``tests/models/test_torch.py`` checks this); pass
``program=`` to interpret an already exported program instead.

The program's graph is run node by node in eager PyTorch with a ``torch.fx.Interpreter`` fed the
lifted weights and the user inputs: each node's value is what PyTorch computes for that aten op,
with no fusion and nothing of TVM involved.
"""
from __future__ import annotations

import numpy as np

from ...core.errors import ModelError, one_line
from ...importer.torch import lifted_tensors, node_keys, placeholder_tensors
from ...importer.torch_export import example_args, export_program


def torch_values(module, example_inputs, program=None) -> dict[str, np.ndarray]:
    """Run the exported program of ``module`` eagerly and return ``{source key: value}``.

    Keys are those of ``import_torch``: fx node names for user inputs and computed values
    (``getitem_3``, ``bmm_1``), state-dict names for weights.  Nodes without a tensor value
    (asserts, tuple-valued multi-output ops) are left out.

    Args:
        module: the ``torch.nn.Module`` given to ``Probe.from_torch``.
        example_inputs: the inputs to run (same shapes as those compiled).
        program: an ``export_program(module, example_inputs)`` result to reuse (skips export).
    """
    program = program if program is not None else export_program(module, example_inputs)
    args = example_args(example_inputs)
    try:
        computed = _interpret(program, _graph_args(program, args), node_keys(program))
    except Exception as err:
        raise ModelError(f"PyTorch cannot run the exported program: {one_line(err)}") from None
    values = {key: value for key, (value, _) in placeholder_tensors(program).items()}
    values.update(computed)
    return values


def _graph_args(program, user_args: tuple) -> list:
    """The lifted graph's placeholders in order: weights, buffers, constants, then user inputs."""
    import torch

    user, kinds = iter(user_args), torch.export.graph_signature.InputKind
    tensors = lifted_tensors(program)
    return [next(user) if spec.kind is kinds.USER_INPUT else tensors[spec.target]
            for spec in program.graph_signature.input_specs]


def _interpret(program, args: list, keys: dict) -> dict[str, np.ndarray]:
    """Run the program's graph with an fx Interpreter, keeping every keyed node's value."""
    import torch

    values: dict[str, np.ndarray] = {}

    class _Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            result = super().run_node(node)
            key = keys.get(node)
            if key is not None and isinstance(result, torch.Tensor):
                values[key] = result.detach().cpu().numpy().copy()  # later in-place ops must not change it
            elif key is not None and isinstance(result, (bool, int, float)):
                values[key] = np.array(result)
            return result

    with torch.no_grad():
        _Recorder(program.graph_module).run(*args)
    return values
