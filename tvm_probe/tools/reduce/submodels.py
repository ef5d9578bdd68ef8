"""Sub-models: any subset of a model's nodes, carved as a standalone ONNX model that reads what
it no longer computes as graph inputs (fed with onnxruntime's values on the whole model) or as
initializers (the tensors TVM's importer folded)."""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from ...core.sources import Kind
from ...importer.onnx_graph import (
    node_inputs,  # every tensor a node reads, subgraphs included
    sub_model,
)


class CannotCut(Exception):
    """A node set cannot be made a sub-model (a tensor it reads has no tensor value)."""


class SubModels:
    """The nodes of a model in topological order, and sub-models made of any subset of them.

    ``values`` holds a value for every tensor a sub-model may have to read from outside: the
    model inputs and every node output (from onnxruntime on the whole model).  ``constants``
    names the tensors that become initializers rather than inputs (set once known).
    """

    def __init__(self, proto, values: Mapping[str, np.ndarray]):
        self.proto = proto
        self.nodes = list(proto.graph.node)
        self.reads = [node_inputs(node) for node in self.nodes]
        self.producer = {out: i for i, node in enumerate(self.nodes) for out in node.output if out}
        self.readers: dict[str, set[int]] = {}
        for i, names in enumerate(self.reads):
            for name in names:
                self.readers.setdefault(name, set()).add(i)
        self.initializers = {t.name: t for t in proto.graph.initializer}
        self.outputs = [o.name for o in proto.graph.output]
        self.values = values
        self.constants: set[str] = set()

    def __len__(self) -> int:
        return len(self.nodes)

    def model(self, keep: Iterable[int], extra_outputs: Iterable[str] = ()):
        """The sub-model of the nodes ``keep`` (see :mod:`tvm_probe.tools.reduce` for its inputs and outputs).

        Raises:
            CannotCut: a tensor it must read or return has no tensor value.
        """
        from onnx import numpy_helper


        kept = sorted(set(keep))
        kept_set = set(kept)
        produced = {out for i in kept for out in self.nodes[i].output if out}
        inputs, weights = [], []
        for name in dict.fromkeys(n for i in kept for n in self.reads[i]):
            if name in produced:
                continue
            if name in self.initializers:
                weights.append(self.initializers[name])
            elif name in self.constants:
                weights.append(numpy_helper.from_array(self._value(name), name))
            else:
                inputs.append(self._info(name))
        handed_on = [out for i in kept for out in self.nodes[i].output
                     if out and self.readers.get(out, set()) - kept_set]
        wanted = [o for o in self.outputs if o in produced] + handed_on + [o for o in extra_outputs if o in produced]
        outputs = [self._info(name) for name in dict.fromkeys(wanted)]
        if not outputs:
            raise CannotCut("the nodes compute no output")
        return sub_model(self.proto, [self.nodes[i] for i in kept], inputs, outputs, weights,
                         name=self.proto.graph.name or "reduced", check=False)

    def feeds(self, model) -> dict[str, np.ndarray]:
        """The values that feed the graph inputs of a sub-model."""
        return {vi.name: self.values[vi.name] for vi in model.graph.input}

    def constant_tensors(self, sources=None) -> set[str]:
        """Tensors that were constants in the whole model: those TVM's importer folded (from
        ``sources``, the SourceMap of an import), else those computed from weights and shapes alone."""

        if sources is not None:
            return {v.key for v in sources if v.kind is Kind.CONSTANT}
        constant = set(self.initializers)
        for node, reads in zip(self.nodes, self.reads):
            if node.op_type in ("Shape", "Size") or (not node.op_type.startswith("Random")
                                                     and all(r in constant for r in reads)):
                constant.update(out for out in node.output if out)
        return constant - set(self.initializers)

    def _value(self, name: str) -> np.ndarray:
        value = self.values.get(name)
        if not isinstance(value, np.ndarray):
            raise CannotCut(f"tensor {name!r} has no tensor value")
        return value

    def _info(self, name: str):
        from onnx import helper

        value = self._value(name)
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
