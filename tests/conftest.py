"""Fixtures shared across the test packages."""

import json

import pytest

from autotune.catalog import load_model


@pytest.fixture
def tiny_dense(tmp_path):
    """A 4-layer Llama-shaped dense model (h 64, 4 heads / 2 KV, FFN 128, vocab 256), read from a config.json."""
    cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 256,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return load_model(str(p))
