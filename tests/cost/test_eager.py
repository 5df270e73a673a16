"""torchtitan without torch.compile (Workload.eager): its Llama's elementwise code op by op in eager PyTorch."""

from __future__ import annotations

import pytest

from autotune.catalog import GPUS, ClusterSpec, Workload, load_model
from autotune.cost import Calibration, evaluate
from autotune.cost.measurements import published_measurements
from autotune.layout import Layout, LayoutTable, Recompute


def test_torchtitan_without_torch_compile_pays_its_eager_norms_rope_and_swiglu():
    """The 2024-12 page's "FSDP" rows (beside "FSDP + torch.compile"; llama3_8b.toml compile = false at 9dec370) run
    torchtitan's Llama op by op: RMSNorm in fp32 (models/norms.py), complex rotary embedding, SwiGLU as silu then mul.
    The extra HBM bytes per token per layer are cost/_terms.py's EAGER_* counts on the hidden, q + k and FFN widths."""
    from autotune.cost._terms import EAGER_NORM_BYTES, EAGER_ROPE_BYTES, EAGER_SWIGLU_BYTES
    kept, _ = published_measurements()
    eager = [m for m in kept if m.eager]
    assert {(m.layout.world, m.tokens_per_s_per_gpu) for m in eager} == {(8, 5762.0), (128, 5605.0)}
    assert all(m.workload.eager for m in eager)
    lay = Layout(world=8, fsdp=True, micro_batch_size=2, recompute=Recompute.parse("selective"))
    m, t = load_model("Llama-3.1-8B"), LayoutTable.from_layouts([lay])
    ev = {e: evaluate(m, Workload(seq_len=8192, global_batch=16, framework="torchtitan", eager=e),
                      ClusterSpec.of("H100", 8), t, Calibration("H100")) for e in (False, True)}
    h, q, kv, f = m.hidden_size, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.ffn_hidden_size
    per_token = m.num_layers * (2 * EAGER_NORM_BYTES * h + EAGER_ROPE_BYTES * (q + kv) + EAGER_SWIGLU_BYTES * f)
    extra = per_token * 2 * 8192 / (GPUS["H100"].hbm_gbps * 1e9)  # one micro-batch of 2 rows
    got = ev[True].time.mb_terms["memory_bound"][0, 0] - ev[False].time.mb_terms["memory_bound"][0, 0]
    assert got == pytest.approx(extra, rel=1e-6)
    assert ev[True].time.tokens_per_s_per_gpu[0] < ev[False].time.tokens_per_s_per_gpu[0]
