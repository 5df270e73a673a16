"""HybridEP as the flex dispatcher's own backend (`dispatcher="hybridep"`): its Megatron arguments, rules, NVLink
throughput, buffers, availability and the published rows that name it. Uncalibrated coefficients, so a fit cannot
hide a wrong direction."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import TimeCoefficients, estimate_memory, estimate_time
from autotune.cost.memory import hybridep_buffer
from autotune.errors import BadInput
from autotune.gates.component import ComponentSpec, component_gate
from autotune.layout import Layout, LayoutTable, layout_args, layout_from_args, violations
from autotune.layout.core import dispatcher_config
from autotune.trials.plan import flex_backend_missing

C = TimeCoefficients()
QWEN = load_model("Qwen3-30B-A3B")
WL = Workload(seq_len=4096, global_batch=256)


def _flags(lay: Layout) -> list[str]:
    return [x for pair in layout_args(lay, "megatron") for x in pair if x is not None]


def test_hybridep_is_the_flex_dispatcher_on_its_hybridep_backend_both_ways():
    lay = Layout(world=16, ep=8, dispatcher="hybridep")
    flags = _flags(lay)
    i = flags.index("--moe-token-dispatcher-type")
    assert flags[i + 1] == "flex" and flags[flags.index("--moe-flex-dispatcher-backend") + 1] == "hybridep"
    assert layout_from_args(flags, world=16).dispatcher == "hybridep"
    # DeepEP is megatron-core's default backend: the seed's flex recipe names none, and reads back as flex
    flex = _flags(Layout(world=16, ep=8, dispatcher="flex"))
    assert "--moe-flex-dispatcher-backend" not in flex and layout_from_args(flex, world=16).dispatcher == "flex"
    assert layout_from_args(flex + ["--moe-flex-dispatcher-backend", "deepep"], world=16).dispatcher == "flex"
    with pytest.raises(BadInput, match="--moe-flex-dispatcher-backend 'nccl'"):
        layout_from_args(flex + ["--moe-flex-dispatcher-backend", "nccl"], world=16)
    assert dispatcher_config("hybridep") == {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"}
    assert dispatcher_config("flex")["moe_flex_dispatcher_backend"] == "deepep"
    assert dispatcher_config("alltoall") == {"moe_token_dispatcher_type": "alltoall"}


def test_megatron_rules_tell_the_backends_apart():
    """Padding to capacity is refused on the deepep backend only; both backends need TP x EP > 1."""
    drop = dict(world=16, ep=8, moe_capacity_factor=1.0, micro_batch_size=1)
    assert any(v.code == "capacity_dispatcher" for v in violations(QWEN, WL, Layout(**drop, dispatcher="flex")))
    assert not any(v.code == "capacity_dispatcher" for v in violations(QWEN, WL, Layout(**drop, dispatcher="hybridep")))
    one = [v.code for v in violations(QWEN, WL, Layout(world=16, ep=1, dispatcher="hybridep", micro_batch_size=1))]
    assert "flex_needs_tp_ep" in one


def test_hybridep_moves_nvlink_bytes_faster_than_deepep_and_network_bytes_alike():
    inside = ClusterSpec.of("H100", 16)
    lays = [Layout(world=16, ep=8, micro_batch_size=1, dispatcher=d) for d in ("flex", "hybridep")]
    flex, hyb = estimate_time(QWEN, WL, inside, LayoutTable.from_layouts(lays), C).mb_terms["ep_comm"][:, 0]
    assert flex / hyb == pytest.approx(C.hybridep_nvl_gain, rel=1e-9)  # all NVLink inside one node
    # across nodes the RDMA leg is the same path: the gain shrinks toward 1 as the network share grows
    across = [Layout(world=64, ep=64, micro_batch_size=1, dispatcher=d) for d in ("flex", "hybridep")]
    f64, h64 = estimate_time(QWEN, WL, ClusterSpec.of("H100", 64), LayoutTable.from_layouts(across),
                             C).mb_terms["ep_comm"][:, 0]
    assert 1.0 < f64 / h64 < C.hybridep_nvl_gain


def test_hybridep_buffers_follow_the_groups_worst_case_once_for_all_micro_batches():
    cl = ClusterSpec.of("H100", 64)
    t = LayoutTable.from_layouts([Layout(world=64, ep=e, micro_batch_size=1, dispatcher="hybridep") for e in (8, 16)])
    (b8, b16), (b8_half, _) = (hybridep_buffer(QWEN, cl, t, np.full((2, 1), n))[:, 0] for n in (4096.0, 2048.0))
    token_bytes = 8 * 4096 * 2 * QWEN.hidden_size  # every token of the 8-rank group could land on one rank (BF16)
    assert token_bytes < b8 < 1.5 * token_bytes  # plus routing probabilities and scales, far less than the tokens
    assert b8 == pytest.approx(2 * b8_half)  # sized by the micro-batch's tokens
    assert b16 > 2 * b8  # twice the group, plus RDMA staging across the two nodes
    mem = estimate_memory(QWEN, WL, cl, LayoutTable.from_layouts(
        [Layout(world=64, ep=8, vpp=2, pp=2, micro_batch_size=1, dispatcher="hybridep", ep_overlap=o) for o in (False, True)]))
    assert mem.terms["dispatcher"][0].max() == pytest.approx(mem.terms["dispatcher"][1].max())  # one buffer, shared


def test_availability_is_found_without_importing_deepep(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "deep_ep" or m.startswith("deep_ep.")]:
        monkeypatch.delitem(sys.modules, name)
    if flex_backend_missing("flex") is None:
        pytest.skip("a real deep_ep is installed here")
    assert "DeepEP" in flex_backend_missing("flex") and "DeepEP" in flex_backend_missing("hybridep")
    pkg = tmp_path / "deep_ep"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('importing deep_ep initialises CUDA')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert flex_backend_missing("flex") is None  # found, never imported
    assert "HybridEP" in flex_backend_missing("hybridep")  # a main-branch DeepEP has no HybridEPBuffer
    (pkg / "hybrid_ep_buffer.py").write_text("")
    assert flex_backend_missing("hybridep") is None and flex_backend_missing("alltoall") is None
    assert "deep_ep" not in sys.modules


def test_component_gate_says_why_hybridep_cannot_run_here():
    res = component_gate(ComponentSpec(dispatcher="hybridep"), run=lambda spec: pytest.fail("must not run"))
    assert res.status == "not_run" and "hybridep" in res.summary


def test_space_drops_hybridep_where_the_cluster_lacks_it():
    from autotune.space import explore, load_space
    space = load_space(None, QWEN)
    res = explore(space, QWEN, WL, ClusterSpec.of("H100", 16, has_hybridep=False))
    assert 3 not in set(res.table.dispatcher.tolist())
    assert any("HybridEP" in k for k in res.reasons) and any("hybridep dispatcher dropped" in n for n in res.notes)
    assert 3 in set(explore(space, QWEN, WL, ClusterSpec.of("H100", 16)).table.dispatcher.tolist())
    # HybridEP ships in DeepEP's hybrid-ep branch: a cluster without DeepEP has neither flex backend
    bare = explore(space, QWEN, WL, ClusterSpec.of("H100", 16, has_deepep=False))
    assert not {2, 3} & set(bare.table.dispatcher.tolist())
    assert any("hybridep dispatcher dropped" in n for n in bare.notes)


def test_published_rows_read_their_backend():
    """The DeepSeek-V3 GB200 discussion page measures DeepEP (829.93 TFLOP/s) and HybridEP (970.01) side by side;
    Megatron-Bridge recipes name moe_flex_dispatcher_backend."""
    from autotune.cost.measurements import published_measurements
    kept, _ = published_measurements()
    page = [m for m in kept if "DeepSeek-V3 GB200 optimization" in m.source]
    by = {m.layout.dispatcher for m in page}
    assert {"flex", "hybridep", "alltoall"} <= by
    assert any(m.layout.dispatcher == "hybridep" and m.source.startswith("Megatron-Bridge perf") for m in kept)
