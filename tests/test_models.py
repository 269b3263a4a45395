from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tasks.config import ConfigError
from tasks.models import (
    MODELS,
    build_model,
    classifier_keys,
    embedding,
    feature_maps,
    head_of,
    model_for,
    num_blocks,
)
from tasks.settings import ModelSettings


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("channels, size", [(1, 28), (3, 32)])
@pytest.mark.parametrize("norm", ["none", "bn", "gn"])
def test_output_shapes(name, channels, size, norm):
    model = build_model(name, channels, 10, size, norm, (0.5,) * channels, (0.25,) * channels)
    model.eval()
    assert model(torch.rand(2, channels, size, size)).shape == (2, 10)
    kinds = {type(m) for m in model.modules()}
    assert (nn.BatchNorm2d in kinds) == (norm == "bn")
    assert (nn.GroupNorm in kinds) == (norm == "gn")


def test_classes_follow_dataset_and_resnet18_gn_uses_32_groups():
    model = build_model("resnet18", 3, 100, 32, "gn", (0.5,) * 3, (0.25,) * 3)
    assert model(torch.rand(1, 3, 32, 32)).shape == (1, 100)
    groups = {m.num_groups for m in model.modules() if isinstance(m, nn.GroupNorm)}
    assert groups == {32}


def test_resnet9_matches_fedmatch_definition():
    model = build_model("resnet9", 3, 10, 32, "none", (0.5,) * 3, (0.25,) * 3)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 8 and all(c.bias is None for c in convs)
    assert model[1].classifier.bias is None


# Feature-map shapes (C, H, W) per conv block, by model and input size.
BLOCK_SHAPES = {
    ("small_cnn", 28): [(32, 14, 14), (64, 7, 7)],
    ("small_cnn", 32): [(32, 16, 16), (64, 8, 8)],
    ("resnet9", 28): [(64, 28, 28), (128, 14, 14), (256, 7, 7), (512, 3, 3)],
    ("resnet9", 32): [(64, 32, 32), (128, 16, 16), (256, 8, 8), (512, 4, 4)],
    ("resnet18", 28): [(64, 28, 28), (64, 28, 28), (128, 14, 14), (256, 7, 7), (512, 4, 4)],
    ("resnet18", 32): [(64, 32, 32), (64, 32, 32), (128, 16, 16), (256, 8, 8), (512, 4, 4)],
}
# Where each block ends in the net's ``features`` layers: SmallCNN conv+pool blocks,
# ResNet-9 stages conv64 | conv128+pool, res128 | conv256+pool | conv512+pool, res512,
# ResNet-18 stem and four stages of two basic blocks.
BLOCK_ENDS = {"small_cnn": (4, 8), "resnet9": (1, 3, 4, 6), "resnet18": (3, 5, 7, 9, 11)}
NUM_BLOCKS = {name: len(ends) for name, ends in BLOCK_ENDS.items()}
EMBED_WIDTH = {"small_cnn": 128, "resnet9": 512, "resnet18": 512}
HEAD_KEYS = {
    "small_cnn": ["1.classifier.3.weight", "1.classifier.3.bias"],
    "resnet9": ["1.classifier.weight"],
    "resnet18": ["1.classifier.weight", "1.classifier.bias"],
}
SMALL_CNN_BN_KEYS = [
    "1.features.0.weight",
    "1.features.1.weight",
    "1.features.1.bias",
    "1.features.1.running_mean",
    "1.features.1.running_var",
    "1.features.1.num_batches_tracked",
    "1.features.4.weight",
    "1.features.5.weight",
    "1.features.5.bias",
    "1.features.5.running_mean",
    "1.features.5.running_var",
    "1.features.5.num_batches_tracked",
    "1.classifier.1.weight",
    "1.classifier.1.bias",
    "1.classifier.3.weight",
    "1.classifier.3.bias",
]
SMALL_CNN_NONE_KEYS = [
    "1.features.0.weight",
    "1.features.0.bias",
    "1.features.4.weight",
    "1.features.4.bias",
    "1.classifier.1.weight",
    "1.classifier.1.bias",
    "1.classifier.3.weight",
    "1.classifier.3.bias",
]


def _model(name, channels, size, norm="bn", **options):
    torch.manual_seed(0)
    return build_model(
        name, channels, 10, size, norm, (0.5,) * channels, (0.25,) * channels, **options
    )


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("channels, size", [(1, 28), (3, 32)])
def test_feature_maps_per_block(name, channels, size):
    model = _model(name, channels, size).eval()
    x = torch.rand(2, channels, size, size)
    maps = feature_maps(model, x)
    assert num_blocks(model) == model[1].num_blocks == NUM_BLOCKS[name] == len(maps)
    assert [tuple(m.shape) for m in maps] == [(2, *s) for s in BLOCK_SHAPES[name, size]]
    # Each map is the output of the net's layers up to the block's end, after Normalize.
    layers = model[1].features
    for got, end in zip(maps, BLOCK_ENDS[name], strict=True):
        assert torch.equal(got, layers[:end](model[0](x)))
    assert not torch.equal(maps[0], layers[: BLOCK_ENDS[name][0]](x))


@pytest.mark.parametrize(
    "name, pool",
    [("resnet9", lambda m: m.amax((2, 3))), ("resnet18", lambda m: m.mean((2, 3)))],
)
def test_last_feature_map_pools_to_the_embedding(name, pool):
    model = _model(name, 3, 32).eval()
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(embedding(model, x), pool(feature_maps(model, x)[-1]))


def test_small_cnn_embedding_is_the_hidden_layer_on_the_last_map():
    model = _model("small_cnn", 1, 28).eval()
    x = torch.rand(2, 1, 28, 28)
    hidden = model[1].classifier[:-1](feature_maps(model, x)[-1])
    assert torch.equal(embedding(model, x), hidden)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_feature_map_loss_between_two_networks_reaches_both(name):
    one, two = _model(name, 3, 32), _model(name, 3, 32, norm="gn")
    x = torch.rand(2, 3, 32, 32)
    pairs = zip(feature_maps(one, x)[:2], feature_maps(two, x)[:2], strict=True)
    sum(nn.functional.mse_loss(a, b) for a, b in pairs).backward()
    for model in (one, two):
        grads = [p.grad for p in model[1].features[0].parameters()]
        assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("channels, size", [(1, 28), (3, 32)])
@pytest.mark.parametrize("train", [False, True])
def test_forward_is_head_of_embedding(name, channels, size, train):
    dropout = {"dropout": 0.25} if name == "small_cnn" else {}
    model = _model(name, channels, size, **dropout).train(train)
    x = torch.rand(4, channels, size, size)
    torch.manual_seed(1)
    logits = model(x)
    torch.manual_seed(1)
    emb = embedding(model, x)
    assert emb.shape == (4, EMBED_WIDTH[name])
    assert torch.equal(logits, head_of(model)(emb))
    # ... and equal to the pre-split forward, classifier(features(normalize(x))).
    torch.manual_seed(1)
    assert torch.equal(logits, model[1].classifier(model[1].features(model[0](x))))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_classifier_keys_are_the_heads_parameters(name):
    model = _model(name, 3, 32)
    head = {id(p) for p in head_of(model).parameters()}
    assert classifier_keys(model) == HEAD_KEYS[name]
    assert classifier_keys(model) == [n for n, p in model.named_parameters() if id(p) in head]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_head_size_sets_the_logit_width(name):
    model = _model(name, 1, 28, head_size=7)
    x = torch.rand(2, 1, 28, 28)
    assert model(x).shape == (2, 7)
    assert embedding(model, x).shape == (2, EMBED_WIDTH[name])
    assert head_of(model).out_features == 7
    with pytest.raises(ValueError, match="head_size"):
        _model(name, 1, 28, head_size=0)


def test_model_for_reads_head_size_with_zero_as_the_class_count_and_refuses_fewer():
    data = SimpleNamespace(channels=1, num_classes=10, image_size=28, mean=(0.5,), std=(0.25,))
    x = torch.rand(2, 1, 28, 28)
    assert model_for(ModelSettings(), data)(x).shape == (2, 10)
    assert model_for(ModelSettings(head_size=0), data)(x).shape == (2, 10)
    assert model_for(ModelSettings(head_size=13), data)(x).shape == (2, 13)
    with pytest.raises(ConfigError, match=r"model\.head_size"):
        model_for(ModelSettings(head_size=7), data)


@pytest.mark.parametrize("norm, keys", [("bn", SMALL_CNN_BN_KEYS), ("none", SMALL_CNN_NONE_KEYS)])
def test_small_cnn_state_dict_keys(norm, keys):
    assert list(_model("small_cnn", 1, 28, norm).state_dict()) == keys
    assert list(_model("small_cnn", 1, 28, norm, dropout=0.25).state_dict()) == keys


def test_accessors_reject_a_model_not_from_build_model():
    with pytest.raises(TypeError, match="build_model"):
        head_of(nn.Sequential(nn.Linear(2, 2)))
