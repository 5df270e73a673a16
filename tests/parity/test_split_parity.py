"""Uneven pipeline splits against megatron-core: every rank's parameter count of a real GPTModel built by the
runner (runner/build.py, which sets Megatron's split fields from Layout.layer_split: account for embedding / loss,
first / last stage layers, else the pipeline layout) equals autotune's prediction for that rank's stage. CPU, gloo,
one process per rank. The fields the runner sets are those Megatron's training arguments set from the same flags."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from autotune.layout import Layout  # noqa: E402
from autotune.layout.splits import legal_splits, megatron_split, split_config  # noqa: E402
from parity_harness import build_chunks, predicted_params, rank_coords, run_world, runner_overrides, shrink  # noqa: E402

pytestmark = pytest.mark.slow

# (layers, PP, VPP, megatron_split keywords, TransformerConfig fields Megatron sets from the same flags)
CASES = [
    (6, 4, 1, {"embedding": True, "loss": True},
     {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}),
    (6, 2, 2, {"embedding": True, "loss": True},  # VPP: virtual stages (1, 2 | 2, 1) over two ranks
     {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}),
    (5, 2, 1, {"first": 2}, {"num_layers_in_first_pipeline_stage": 2}),
    (7, 3, 1, {"last": 1}, {"num_layers_in_last_pipeline_stage": 1}),
]
FLAG_OF = {"embedding": "account_for_embedding_in_pipeline_split", "loss": "account_for_loss_in_pipeline_split",
           "first": "num_layers_in_first_pipeline_stage", "last": "num_layers_in_last_pipeline_stage"}
# a split only --pipeline-model-parallel-layout can say: 5 layers over PP 2 x VPP 2, the balanced (2, 1, 1, 1)
LAYOUT_ONLY = (5, 2, 2, (2, 1, 1, 1))


@pytest.mark.parametrize("case", CASES, ids=[f"L{c[0]}-PP{c[1]}-VPP{c[2]}-{'-'.join(c[3])}" for c in CASES])
def test_runner_fields_build_the_same_split_as_megatrons_flags(case):
    """The fields the runner sets build the split (another flag set may build the same one: 5 layers over PP 2
    with the first stage 2 is also the embedding counted as a layer)."""
    layers, pp, vpp, kw, fields = case
    split = megatron_split(layers, pp, vpp, **kw)
    cfg = split_config(split, layers, pp, vpp)
    back = {v: k for k, v in FLAG_OF.items()}
    assert set(cfg) <= set(back) and megatron_split(layers, pp, vpp, **{back[k]: v for k, v in cfg.items()}) == split
    assert {back[k]: v for k, v in fields.items()} == kw  # the table's own fields are Megatron's for the flags


def test_a_split_no_flag_builds_goes_to_the_pipeline_layout():
    layers, pp, vpp, split = LAYOUT_ONLY
    assert split in legal_splits(layers, pp, vpp)
    assert split_config(split, layers, pp, vpp) == {"pipeline_model_parallel_layout": "Ett|t|t|tL"}


def split_count(model, layout) -> dict:
    chunks, _ = build_chunks(model, layout, overrides=runner_overrides(model))
    return {**rank_coords(), "count": sum(p.numel() for c in chunks for p in c.parameters())}


SPLITS = [(c[0], c[1], c[2], megatron_split(c[0], c[1], c[2], **c[3])) for c in CASES] + [LAYOUT_ONLY]


@pytest.mark.parametrize("case", SPLITS, ids=[f"L{c[0]}-PP{c[1]}-VPP{c[2]}-{','.join(map(str, c[3]))}" for c in SPLITS])
def test_uneven_split_parameter_counts_match_megatron(case):
    layers, pp, vpp, split = case
    model = shrink("Qwen3-30B-A3B", layers, experts=8)
    layout = Layout(world=pp, pp=pp, vpp=vpp, layer_split=split)
    ranks = run_world(layout, split_count, model, layout)
    wrong = [(got["pp"], got["count"], predicted_params(model, layout, got["pp"])) for got in ranks
             if got["count"] != predicted_params(model, layout, got["pp"])]
    assert not wrong, f"split {layout.layer_split}: stage, megatron, autotune: {wrong}"
