"""Megatron's fine-grained activation offloading (--fine-grained-activation-offloading --offload-modules): a Layout
setting with megatron-core's rules and flags, priced in memory (a stage keeps one layer's offloaded inputs) and in time
(they cross the host link twice), searched where a space names it, and read from the recipes that run it."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import MB_TERMS, MemoryCoefficients, TimeCoefficients, estimate_memory, evaluate
from autotune.cost._offload import module_tables
from autotune.cost._raw import raw_time
from autotune.cost.layers import PARTS, layer_tables
from autotune.cost.measurements import published_measurements
from autotune.errors import BadInput
from autotune.launch.run_block import run_env
from autotune.layout import Layout, LayoutTable, Recompute, format_args, layout_args, layout_from_args, violations
from autotune.layout.dimensions import layout_from_params, layout_params

GiB = 2**30
P = {p: j for j, p in enumerate(PARTS)}


def test_the_setting_round_trips_through_table_flags_and_study_parameters():
    lay = Layout(world=64, ep=8, offload_modules=("expert_fc1", "attn_proj", "core_attn"))
    assert lay.offload_modules == ("core_attn", "attn_proj", "expert_fc1")  # megatron-core's order
    assert LayoutTable.from_layouts([lay]).row(0).offload_modules == lay.offload_modules
    words = format_args(layout_args(lay, moe=True))
    i = words.index("--offload-modules")
    assert "--fine-grained-activation-offloading" in words and words[i + 1:i + 4] == list(lay.offload_modules)
    assert layout_from_args(words, world=64).offload_modules == lay.offload_modules
    assert run_env(lay)["NVTE_CPU_OFFLOAD_V1"] == "1" and "NVTE_CPU_OFFLOAD_V1" not in run_env(Layout(world=64))
    params = layout_params(lay)
    assert params["offload_modules"] == "core_attn,attn_proj,expert_fc1"
    assert layout_from_params(64, params).offload_modules == lay.offload_modules
    assert layout_params(Layout(world=8))["offload_modules"] == "none"
    with pytest.raises(BadInput, match="--offload-modules mlp: choose among"):
        Layout(world=8, offload_modules=("mlp",))
    with pytest.raises(BadInput, match="without --offload-modules"):
        layout_from_args(["--fine-grained-activation-offloading"], world=8)


@pytest.mark.parametrize("model,kw,code", [
    ("Llama-3.1-8B", dict(offload_modules=("moe_act",)), "fine_offload_moe"),
    ("Llama-3.1-8B", dict(offload_modules=("attn_proj",)), "fine_offload_attn_proj"),
    ("Llama-3.1-8B", dict(offload_modules=("core_attn",), activation_offload_layers=2), "fine_offload_not_layers"),
    ("Llama-3.1-8B", dict(offload_modules=("qkv_linear",), recompute=Recompute("full", "uniform", 1)),
     "fine_offload_full_recompute"),
    ("Qwen3-30B-A3B", dict(ep=8, offload_modules=("expert_fc1",), recompute=Recompute("selective", None, None, ("moe",))),
     "fine_offload_moe_recompute"),
    ("Qwen3-30B-A3B", dict(ep=8, offload_modules=("moe_act",), cuda_graphs="full", dispatcher="hybridep"),
     "fine_offload_paged_stash"),
])
def test_megatron_cores_rules(model, kw, code):
    """Each rule fires on its case and goes with the offload; core_attn with attn_proj on a dense model is legal."""
    m, w = load_model(model), Workload(seq_len=4096, global_batch=64)
    assert code in [v.code for v in violations(m, w, Layout(world=8, **kw))]
    assert code not in [v.code for v in violations(m, w, Layout(world=8, **dict(kw, offload_modules=())))]
    dense = load_model("Llama-3.1-8B")
    assert not [v for v in violations(dense, w, Layout(world=8, offload_modules=("core_attn", "attn_proj")))
                if v.code.startswith("fine_offload")]


def test_module_tables_are_the_modules_inputs():
    """Each module's bytes are its input's part, on the layers that have the module: Qwen3.5's Gated DeltaNet layers
    have no core attention to offload, its MoE layers have the experts' inputs."""
    m = load_model("Qwen3.5-122B-A10B")
    lt, mods = layer_tables(m), module_tables(m)
    core, fc1, act = mods[2], mods[5], mods[6]
    softmax = np.isin(lt.kind, (0, 1, 3))
    assert softmax.any() and (~softmax).any()
    assert np.array_equal(core[:, P["attn_core"]], np.where(softmax, lt.act[:, P["attn_core"]], 0.0))
    assert np.array_equal(fc1[:, P["moe_perm"]], lt.act[:, P["moe_perm"]]) and fc1.sum() == fc1[:, P["moe_perm"]].sum()
    assert np.array_equal(act[:, P["moe_fc1"]], lt.act[:, P["moe_fc1"]])
    # attn_norm + mlp_norm: both of a dense layer's norms, no more
    d = load_model("Llama-3.1-8B")
    both = module_tables(d)[0] + module_tables(d)[4]
    assert np.allclose(both[:, P["ln"]], layer_tables(d).act[:, P["ln"]])


def test_a_stage_keeps_one_layers_offloaded_inputs_and_moves_them_twice():
    """Llama-3.1-8B at PP 1 (one micro-batch in flight): offloading core attention's q, k, v frees them on all but one
    of the 32 layers; each micro-batch sends them down and back over PCIe."""
    m, w = load_model("Llama-3.1-8B"), Workload(seq_len=8192, global_batch=64)
    c = ClusterSpec.of("H100", 8)
    lays = [Layout(world=8, micro_batch_size=1), Layout(world=8, micro_batch_size=1, offload_modules=("core_attn",))]
    t = LayoutTable.from_layouts(lays)
    mem = estimate_memory(m, w, c, t)
    lt = layer_tables(m)
    qkv = lt.act[:, P["attn_core"]].sum()  # per token, all layers (TP 1, CP 1)
    tokens = 8192
    frag = MemoryCoefficients().fragmentation
    freed = mem.terms["activations"][0, 0] - mem.terms["activations"][1, 0]
    assert freed == pytest.approx(qkv * (1 - 1 / m.num_layers) * tokens * (1 + frag), rel=1e-6)
    coef = TimeCoefficients()
    raw = raw_time(m, w, c, t, coef)
    moved = raw.mb[:, MB_TERMS.index("act_offload"), 0]
    assert moved[0] == 0.0
    assert moved[1] == pytest.approx(2 * qkv * tokens / (c.gpu.host_link_gbps * 1e9 * coef.host_link_eff), rel=1e-6)
    ev = evaluate(m, w, c, t)
    assert ev.time.step_time[1] >= ev.time.step_time[0]  # nothing is faster for it; it only frees memory


def test_what_selective_recompute_frees_is_neither_offloaded_nor_moved():
    """Selective layernorm recompute already frees the norms' inputs: offloading them as well frees no more memory and
    moves no bytes (memory and time read the same saved parts, memory.saved_parts)."""
    m, w = load_model("Llama-3.1-8B"), Workload(seq_len=8192, global_batch=64)
    c = ClusterSpec.of("H100", 8)
    rc = Recompute("selective", None, None, ("layernorm",))
    lays = [Layout(world=8, micro_batch_size=1, recompute=rc),
            Layout(world=8, micro_batch_size=1, recompute=rc, offload_modules=("attn_norm", "mlp_norm")),
            Layout(world=8, micro_batch_size=1, offload_modules=("attn_norm", "mlp_norm"))]
    t = LayoutTable.from_layouts(lays)
    act = estimate_memory(m, w, c, t).terms["activations"][:, 0]
    moved = raw_time(m, w, c, t, TimeCoefficients()).mb[:, MB_TERMS.index("act_offload"), 0]
    assert act[1] == pytest.approx(act[0]) and moved[1] == 0.0
    assert moved[2] > 0.0  # without the recompute the norms' inputs do go to the host


def test_published_rows_and_recipes_that_offload_are_read_with_their_modules():
    kept, skipped = published_measurements()
    rows = [r for r in kept if r.layout.offload_modules]
    # the moe_recipes README's DeepSeek-V3 on 256 GB200 (mxfp8_256GPU_TP1PP4EP64.yaml: offload_modules expert_fc1)
    assert [(r.model, r.gpu, r.layout.offload_modules) for r in rows] == [("DeepSeek-V3", "GB200", ("expert_fc1",))]
    ev = evaluate(rows[0].spec, rows[0].workload, rows[0].cluster, LayoutTable.from_layouts([rows[0].layout]))
    assert bool(ev.memory.fits[0])  # it ran
    no = LayoutTable.from_layouts([Layout(**{**rows[0].layout.__dict__, "offload_modules": ()})])
    assert estimate_memory(rows[0].spec, rows[0].workload, rows[0].cluster, no).peak[0] > ev.memory.peak[0] + 10 * GiB
    # Nemotron 3 Ultra's recipes offload the whole fused grouped MLP (a module of later megatron-cores, beside the
    # CuTe-DSL kernels without graphs): skipped, saying so
    ultra = [why for row, why in skipped if "Ultra" in (row.get("model") or "") and "Megatron-Bridge" in row["source"]]
    assert len(ultra) == 2 and all("fused_group_mlp" in why for why in ultra)


def test_a_space_searches_it_where_it_can_run(tmp_path):
    """A space that names offload modules enumerates them (the expert ones only for an MoE model) and drops them,
    saying why, on a cluster without Transformer Engine."""
    from autotune.space import explore, load_space

    path = tmp_path / "space.yaml"
    path.write_text("dimensions:\n  tp: [1]\n  pp: [1]\n  ep: [1, 8]\n  dispatcher: [alltoall]\n"
                    "  offload_modules: [none, expert_fc1, 'core_attn,attn_proj']\n")
    w = Workload(seq_len=4096, global_batch=64)
    for name, want in (("tiny-moe", {0, 0b1100, 0b100000}), ("Llama-3.1-8B", {0, 0b1100})):
        m = load_model(name)
        res = explore(load_space(str(path), m), m, w, ClusterSpec.of("H100", 8))
        assert set(np.unique(res.table.off_modules)) == want, name
    m = load_model("tiny-moe")
    res = explore(load_space(str(path), m), m, w, ClusterSpec.of("cpu", 8))
    assert not (res.table.off_modules > 0).any()
    assert any("fine-grained activation offloading dropped" in n for n in res.notes)
