"""Name resolution: a name that means two values is ambiguous, never silently one of them;
explicit spellings pick one; patterns match every name of a value.  No TVM needed."""
from __future__ import annotations

import pytest

from tvm_probe import AmbiguousNameError, UnknownNameError
from tvm_probe.core.names import NameIndex
from tvm_probe.core.sources import SourceValue


@pytest.fixture
def index():
    values = [
        SourceValue(key="embedding", node="embedding", op_type="aten.embedding.default"),   # the fx node
        SourceValue(key="add_2", node="add_2", op_type="aten.add.Tensor", modules=("embedding",)),  # the module
        SourceValue(key="bmm_3", node="bmm_3", op_type="aten.bmm.default",
                    modules=("transformer_blocks.0.attention",)),
        SourceValue(key="t:0", node="bert/layer_._0/attention/self/MatMul", op_type="MatMul"),
    ]
    return NameIndex(values, notes={"transformer_blocks.1": "its forward is called directly, which "
                                                            "torch.export does not record"})


def test_a_name_meaning_two_values_is_ambiguous_with_spellings(index):
    with pytest.raises(AmbiguousNameError) as err:
        index.resolve("embedding")
    assert str(err.value) == ("'embedding' names 2 different values: node:embedding; module:embedding: "
                              "give one of these spellings, or a longer name")
    assert index.resolve("node:embedding") == "embedding"
    assert index.resolve("module:embedding") == "add_2"
    assert index.resolve("tensor:embedding") == "embedding"


def test_suffixes_and_kinds(index):
    assert index.resolve("layer_._0/attention/self/MatMul") == "t:0"
    assert index.resolve("module:transformer_blocks.0.attention") == "bmm_3"
    with pytest.raises(UnknownNameError):
        index.resolve("module:bmm_3")  # a node name is not a module path


def test_patterns_match_every_kind_of_name(index):
    assert index.match("transformer_blocks.0*") == ["bmm_3"]
    assert index.match("module:*") == ["add_2", "bmm_3"]
    assert index.match("*/self/MatMul") == ["t:0"]


def test_a_known_name_without_a_value_says_why(index):
    with pytest.raises(UnknownNameError) as err:
        index.resolve("transformer_blocks.1")
    assert str(err.value) == ("'transformer_blocks.1' has no value: its forward is called directly, which "
                              "torch.export does not record")


@pytest.mark.parametrize("typed,meant", [
    ("layer_._0/attention/self/MatMuk", "bert/layer_._0/attention/self/MatMul"),  # a typo in a suffix
    ("self/matmul", "bert/layer_._0/attention/self/MatMul"),                    # another case
    ("LAYER_._0/Attention/Self/MatMul", "bert/layer_._0/attention/self/MatMul"),
    ("transformer_block.0.attention", "transformer_blocks.0.attention"),          # a typo in a full name
    ("embeding", "embedding"),
])
def test_unknown_names_suggest_the_closest_spellings(index, typed, meant):
    """A suffix or case miss is suggested as a full typo is (tf2onnx names are long: a suffix typo
    compared with whole names found nothing)."""
    with pytest.raises(UnknownNameError) as err:
        index.resolve(typed)
    assert str(err.value).startswith(f"no source value is named {typed!r}; did you mean {meant!r}")
