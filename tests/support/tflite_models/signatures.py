"""Give a shipped TFLite model the tensor names and signature a SavedModel conversion writes.

``tf.lite.TFLiteConverter.from_saved_model`` (and Keras' ``from_keras_model``) names the model's
inputs ``serving_default_<key>:0`` and its outputs ``StatefulPartitionedCall:<k>``, and records
the user's names (``input_ids``, ``logits``) only as the keys of a ``serving_default`` signature.
:func:`with_signature` rewrites a model (made by ``make_models.py`` from a concrete function,
which has no signature) that way with the TFLite schema's object API (``ai_edge_litert``'s
``schema_py_generated``), so the tests need no TensorFlow.  Nothing but names changes: the ops,
weights and tensor order are those of the original.
"""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent


def with_signature(content: bytes, inputs: dict[str, str], outputs: dict[str, str],
                   key: str = "serving_default") -> bytes:
    """``content`` with signature ``key``: ``inputs`` / ``outputs`` map a tensor's current name
    to its signature key; inputs are renamed ``<key>_<signature key>:0``, outputs
    ``StatefulPartitionedCall:<k>`` (k in signature order), as TF's converter names them."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(content), 0)
    subgraph = model.subgraphs[0]
    index = {t.name.decode(): i for i, t in enumerate(subgraph.tensors)}
    signature = schema.SignatureDefT()
    signature.signatureKey, signature.subgraphIndex = key, 0
    signature.inputs, signature.outputs = [], []
    for k, (name, sig_key) in enumerate(list(inputs.items()) + list(outputs.items())):
        entry = schema.TensorMapT()
        entry.name, entry.tensorIndex = sig_key, index[name]
        if k < len(inputs):
            subgraph.tensors[index[name]].name = f"{key}_{sig_key}:0".encode()
            signature.inputs.append(entry)
        else:
            subgraph.tensors[index[name]].name = f"StatefulPartitionedCall:{k - len(inputs)}".encode()
            signature.outputs.append(entry)
    model.signatureDefs = [signature]
    builder = flatbuffers.Builder(len(content) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def bert_with_signature() -> bytes:
    """The shipped BERT (``bert.tflite``) as a SavedModel conversion names it."""
    return with_signature((HERE / "bert.tflite").read_bytes(),
                          {"input_ids": "input_ids", "attention_mask": "attention_mask"}, {"Identity": "logits"})
