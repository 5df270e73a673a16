"""A recipe's highlights and summary name every setting that tells it apart: any recompute other than the seed's
reference (full, uniform, 1 layer, which the seed page leaves unsaid), "no recompute" when there is none, and EP /
TP communication overlap, CUDA graphs, FSDP and token drop when on."""

from __future__ import annotations

from autotune.catalog import Workload
from autotune.layout import Layout, Recompute
from autotune.recipes import highlights, summarize

W = Workload()
BASE = Layout(world=32, tp=2, pp=4, vpp=2, ep=8, recompute=Recompute("full", "uniform", 1), max_tokens_per_gpu=8192)


def test_recompute_is_named_unless_it_is_the_seeds_reference():
    assert highlights(BASE, W) == "max 8,192 tokens/GPU, load-balancing loss off"  # the seed page's words
    assert "recompute 2 layers" in highlights(BASE.with_(recompute=Recompute("full", "uniform", 2)), W)
    assert "block recompute 1 layer" in highlights(BASE.with_(recompute=Recompute("full", "block", 1)), W)
    assert "no recompute" in highlights(BASE.with_(recompute=Recompute()), W)


def test_settings_beyond_the_seed_are_named_when_on():
    sel = Recompute("selective", modules=("layernorm",))
    cases = {
        "EP comm overlap": ("EP communication overlap", dict(ep_overlap=True, recompute=sel)),
        "TP comm overlap": ("TP communication overlap", dict(tp_comm_overlap=True)),
        "CUDA graphs attn": ("CUDA graphs (attn)", dict(cuda_graphs="attn")),
        "FSDP": ("Megatron FSDP", dict(fsdp=True)),
        "token drop (capacity 1.5)": ("token drop at capacity factor 1.5", dict(moe_capacity_factor=1.5)),
    }
    plain_h, plain_s = highlights(BASE, W), summarize(BASE, W)
    rows = {highlights(BASE.with_(**kw), W) for _, kw in cases.values()}
    assert len(rows) == len(cases) and plain_h not in rows  # each reads apart from the rest and from the plain one
    for short, (long, kw) in cases.items():
        lay = BASE.with_(**kw)
        assert short in highlights(lay, W) and short not in plain_h, short
        assert long in summarize(lay, W) and long not in plain_s, long
    # TP communication overlap as it takes effect: not at TP 1
    assert "TP comm overlap" not in highlights(BASE.with_(tp=1, tp_comm_overlap=True), W)
