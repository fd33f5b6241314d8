"""Random-weights models: the default model's exact shape, seeded weights, and the exported tokenizer
(what a bare GPU machine reads in place of the default model's GGUF) equal to the GGUF's."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.loader.model_files import DEFAULT_TOKENIZER_ENV, default_tokenizer, export_default_tokenizer
from engine.loader.random_shapes import RANDOM_MODEL_SHAPES, SMOLLM2_SHAPE_RANDOM
from engine.loader.random_weights import random_weights
from tests.engine.conftest import requires_default_model


def test_smollm2_shape_is_the_default_models(smollm_checkpoint):
    shape, real = RANDOM_MODEL_SHAPES[SMOLLM2_SHAPE_RANDOM], smollm_checkpoint.config
    assert shape.rms_norm_eps == pytest.approx(real.rms_norm_eps)
    assert dataclasses.replace(shape, rms_norm_eps=real.rms_norm_eps) == real
    assert {name: tuple(w.shape) for name, w in random_weights(shape).items()} == {name: tuple(w.shape) for name, w in smollm_checkpoint.weights.items()}


def test_random_weights_are_seeded_and_scaled():
    config = RANDOM_MODEL_SHAPES["tiny-random"]
    first, second, other_seed = random_weights(config), random_weights(config), random_weights(config, seed=1)
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert not torch.equal(first["layers.0.mlp.up_proj.weight"], other_seed["layers.0.mlp.up_proj.weight"])
    assert first["layers.0.mlp.down_proj.weight"].std().item() == pytest.approx(0.5 / config.intermediate_size**0.5, rel=0.05)
    assert torch.equal(first["norm.weight"], torch.ones(config.hidden_size))


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """(the GGUF's tokenizer, the exported folder's), each loaded once."""
    folder = tmp_path_factory.mktemp("tokenizer")
    export_default_tokenizer(folder)
    gguf = default_tokenizer()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(DEFAULT_TOKENIZER_ENV, str(folder))
        return gguf, default_tokenizer()


@requires_default_model
def test_exported_tokenizer_has_the_ggufs_special_tokens_and_template(tokenizers):
    gguf, ours = tokenizers
    assert (ours.eos_token_ids, ours.bos_token_id, ours.chat_template) == (gguf.eos_token_ids, gguf.bos_token_id, gguf.chat_template)


@requires_default_model
@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8"), max_size=60) | st.sampled_from(["<|im_start|>user\nhi<|im_end|>", "  \n\t x", "héllo 世界 🙂"]))
def test_exported_tokenizer_encodes_and_decodes_as_the_gguf(tokenizers, text):
    gguf, ours = tokenizers
    ids = gguf.encode(text)
    assert ours.encode(text) == ids
    assert ours.decode(ids, skip_special_tokens=False) == gguf.decode(ids, skip_special_tokens=False)
