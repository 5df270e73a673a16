"""Uneven pipeline splits against megatron-core: every rank's parameter count of a real GPTModel built with
Megatron's split settings (account for embedding / loss, first / last stage layers) equals autotune's
prediction for that rank's stage under the same Layout.layer_split. CPU, gloo, one process per rank."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from autotune.layout import Layout  # noqa: E402
from autotune.layout.splits import megatron_split  # noqa: E402
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


def split_count(model, layout, fields) -> dict:
    chunks, _ = build_chunks(model, layout, overrides={**runner_overrides(model), **fields})
    return {**rank_coords(), "count": sum(p.numel() for c in chunks for p in c.parameters())}


@pytest.mark.parametrize("case", CASES, ids=[f"L{c[0]}-PP{c[1]}-VPP{c[2]}-{'-'.join(c[3])}" for c in CASES])
def test_uneven_split_parameter_counts_match_megatron(case):
    layers, pp, vpp, kw, fields = case
    model = shrink("Qwen3-30B-A3B", layers, experts=8)
    layout = Layout(world=pp, pp=pp, vpp=vpp, layer_split=megatron_split(layers, pp, vpp, **kw))
    ranks = run_world(layout, split_count, model, layout, fields)
    wrong = [(got["pp"], got["count"], predicted_params(model, layout, got["pp"])) for got in ranks
             if got["count"] != predicted_params(model, layout, got["pp"])]
    assert not wrong, f"split {layout.layer_split}: stage, megatron, autotune: {wrong}"
