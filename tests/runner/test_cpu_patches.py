"""Each CPU patch: the upstream code still fails on CPU the way the patch assumes (so the patch is still
needed: if megatron-core fixes it, the test says so), and the patched code does the right thing.

In-process, with the patches applied once for the module; the upstream objects come from
cpu_patches.UPSTREAM. The multi-rank trials in test_trials_cpu.py exercise them end to end.
"""

from __future__ import annotations

import inspect
import re
import socket
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from autotune.runner import cpu_patches as cp  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU patches apply only without CUDA")
CUDA_LITERAL = re.compile(r"""device\s*=\s*["']cuda["']""")


@pytest.fixture(scope="module", autouse=True)
def patched():
    names = cp.apply()
    assert names == list(cp.PATCHES) and cp.apply() == names  # all of them, once
    yield


@pytest.fixture(scope="module")
def gloo_world_of_one():
    dist = torch.distributed
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_rng_tracker_keeps_named_seeded_streams_on_the_cpu_generator():
    from megatron.core.tensor_parallel import random as mrandom

    upstream = cp.UPSTREAM["megatron.core.tensor_parallel.random:CudaRNGStatesTracker"]
    with pytest.raises((AssertionError, RuntimeError), match="CUDA"):
        upstream().add("x", 7)  # torch.cuda.get_rng_state on a CPU build
    with pytest.raises((AssertionError, RuntimeError), match="CUDA"):
        cp.UPSTREAM["megatron.core.tensor_parallel.random:_get_cuda_rng_state"]()  # checkpoint saves it

    def draws():
        mrandom.model_parallel_cuda_manual_seed(123, tp_rank=0, ep_rank=0, etp_rank=0)
        tracker = mrandom.get_cuda_rng_tracker()
        before = torch.get_rng_state()
        with tracker.fork():
            a = torch.rand(4)
        with tracker.fork():
            b = torch.rand(4)
        with tracker.fork(mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME):
            e = torch.rand(4)
        assert torch.equal(torch.get_rng_state(), before)  # forks leave the default stream alone
        return a, b, e

    a, b, e = draws()
    assert not torch.equal(a, b) and not torch.equal(a, e)  # a stream advances; streams differ
    a2, b2, e2 = draws()
    assert torch.equal(a, a2) and torch.equal(b, b2) and torch.equal(e, e2)  # seeded


def test_full_recompute_replays_the_forward_random_numbers():
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel import random as mrandom

    mrandom.model_parallel_cuda_manual_seed(5, tp_rank=0, ep_rank=0, etp_rank=0)

    def block(x):
        with mrandom.get_cuda_rng_tracker().fork():
            return torch.nn.functional.dropout(x * 2, p=0.5, training=True)

    x = torch.ones(64, requires_grad=True)
    y = tensor_parallel.checkpoint(block, False, x)
    y.sum().backward()
    kept = (y != 0).float()
    assert 0 < kept.sum() < 64
    assert torch.equal(x.grad, kept * 4.0)  # the recomputed dropout mask is the forward's


def test_cuda_device_sync_and_stream_map_to_the_one_cpu_device():
    from megatron.core.pipeline_parallel import p2p_communication

    for name in ("current_device", "synchronize", "current_stream"):
        with pytest.raises((AssertionError, RuntimeError)):
            cp.UPSTREAM[f"torch.cuda:{name}"]()
    assert "torch.cuda.synchronize()" in inspect.getsource(p2p_communication)  # batch_p2p_sync
    assert torch.empty(2, device=torch.cuda.current_device()).device.type == "cpu"
    assert torch.cuda.synchronize() is None
    stream = torch.cuda.current_stream()
    assert stream.record_event().synchronize() is None and stream.wait_stream(stream) is None


def test_alltoall_dispatcher_needs_a_stream_and_list_split_sizes(gloo_world_of_one):
    from megatron.core.transformer.moe import token_dispatcher as td
    from megatron.core.transformer.moe.moe_utils import maybe_move_tensor_to_cpu

    assert "torch.cuda.Stream()" in inspect.getsource(td.MoEAlltoAllTokenDispatcher.__init__)
    assert cp.UPSTREAM["MoEAlltoAllTokenDispatcher:cuda_dtoh_stream"] is None
    with pytest.raises(RuntimeError):
        torch.cuda.Stream()
    # On CPU the split sizes stay tensors (only CUDA tensors become numpy), and gloo's binding
    # takes lists of ints only.
    splits = maybe_move_tensor_to_cpu(torch.tensor([2]), as_numpy=True)
    assert torch.is_tensor(splits)
    out, inp = torch.empty(2), torch.arange(2.0)
    with pytest.raises(TypeError):
        torch.distributed.all_to_all_single(out, inp, output_split_sizes=splits, input_split_sizes=splits)
    torch.distributed.all_to_all_single(out, inp, output_split_sizes=cp._as_list(splits), input_split_sizes=[2])
    assert torch.equal(out, inp)
    assert td.MoEAlltoAllTokenDispatcher.cuda_dtoh_stream is cp.NULL_STREAM


def test_router_gating_without_te(monkeypatch):
    from megatron.core.transformer.moe import moe_utils

    assert cp.UPSTREAM["megatron.core.transformer.moe.moe_utils:te_general_gemm"] is None  # never bound
    inp = torch.randn(6, 8, requires_grad=True)
    weight = torch.randn(4, 8, requires_grad=True)
    with monkeypatch.context() as m:
        m.delattr(moe_utils, "te_general_gemm")
        with pytest.raises(NameError, match="te_general_gemm"):
            moe_utils.router_gating_linear(inp, weight, None, torch.float32)
    logits = moe_utils.router_gating_linear(inp, weight, None, torch.float32)
    assert torch.allclose(logits, inp @ weight.t())
    logits.sum().backward()
    assert torch.allclose(weight.grad, torch.ones(6, 4).t() @ inp)


def _norm_config(sp: bool):
    return SimpleNamespace(layernorm_zero_centered_gamma=False, persist_layer_norm=False, sequence_parallel=sp,
                           memory_efficient_layer_norm=False, normalization="RMSNorm")


def test_torch_norm_under_sequence_parallel_is_marked_for_the_tp_grad_sum():
    import importlib

    fmg = importlib.import_module("megatron.core.distributed.finalize_model_grads")
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    upstream = cp.UPSTREAM["megatron.core.transformer.torch_norm:__new__"]
    with pytest.raises(AssertionError, match="sequence parallel"):
        upstream(WrappedTorchNorm, _norm_config(True), 8)
    norm = WrappedTorchNorm(_norm_config(True), 8, eps=1e-6)
    assert isinstance(norm, torch.nn.RMSNorm) and norm.weight.sequence_parallel is True
    plain = WrappedTorchNorm(_norm_config(False), 8)
    assert not hasattr(plain.weight, "sequence_parallel")
    # The mark is what finalize_model_grads reads to sum these grads over TP ranks.
    src = inspect.getsource(fmg._allreduce_non_tensor_model_parallel_grads)
    assert 'getattr(param, "sequence_parallel", False)' in src


@pytest.mark.parametrize("modname", cp.CUDA_LITERAL_MODULES)
def test_cuda_literals_are_rewritten_in_those_modules_only(modname):
    import importlib

    module = importlib.import_module(modname)
    assert CUDA_LITERAL.search(inspect.getsource(module)), f"{modname} no longer has a device='cuda' literal"
    assert module.torch.zeros(1, device="cuda").device.type == "cpu"
    assert module.torch.tensor([1.0], dtype=torch.float, device="cuda").device.type == "cpu"
    assert module.torch.Tensor is torch.Tensor  # everything else is the real torch
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1, device="cuda")  # the real torch is untouched


def test_optimizer_type_checks_see_cpu_tensors_as_cuda():
    from megatron.core.optimizer import clip_grads, distrib_optimizer
    from megatron.core.optimizer import optimizer as mopt

    for fn in (distrib_optimizer.DistributedOptimizer._build_model_and_main_param_groups,
               mopt.Float16OptimizerWithFloat16Params.__init__, clip_grads.clip_grad_by_total_norm_fp32):
        assert "torch.cuda.FloatTensor" in inspect.getsource(inspect.unwrap(fn))
    param = torch.nn.Parameter(torch.zeros(3))
    param.grad = torch.full((3,), 2.0)
    with pytest.raises(AssertionError):
        cp.UPSTREAM["megatron.core.optimizer.clip_grads:clip_grad_by_total_norm_fp32"]([param], 1.0, 4.0)
    clip_grads.clip_grad_by_total_norm_fp32([param], max_norm=1.0, total_norm=4.0)
    assert torch.allclose(param.grad, torch.full((3,), 0.5), atol=1e-6)
    with cp.cuda_type_names():
        assert torch.zeros(1).type() == "torch.cuda.FloatTensor"
        assert torch.zeros(1).type(torch.float64).dtype == torch.float64  # conversions still convert
    assert torch.zeros(1).type() == "torch.FloatTensor"


def test_selective_recompute_without_te_has_no_fp8():
    from megatron.core.tensor_parallel import random as mrandom

    upstream_init = cp.UPSTREAM["CheckpointWithoutOutput:__init__"]
    obj = object.__new__(mrandom.CheckpointWithoutOutput)
    upstream_init(obj)
    assert obj.fp8 is True and not hasattr(mrandom, "FP8GlobalStateManager")  # `fp8 is not None` bug
    ckpt = mrandom.CheckpointWithoutOutput()
    assert ckpt.fp8 is False
    x = torch.randn(5, requires_grad=True)
    y = ckpt.checkpoint(torch.sin, x)
    z = y * 3
    ckpt.discard_output_and_register_recompute(z)
    z.sum().backward()
    assert torch.allclose(x.grad, 3 * torch.cos(x.detach()))


def test_uneven_all_gather_on_gloo_and_the_reduce_scatter_that_needs_no_patch():
    import torch.multiprocessing as mp
    from runner_helpers import uneven_collectives_check

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(uneven_collectives_check, args=(2, port), nprocs=2, join=True)  # a failed assert raises here


def test_tied_embeddings_at_pp2_sync_the_copy_on_cpu(tmp_path):
    from megatron.core.models.common.language_module.language_module import LanguageModule

    upstream = cp.UPSTREAM["LanguageModule:setup_embeddings_and_output_layer"]
    assert "weight.data.cuda()" in inspect.getsource(upstream)  # still moves the tied copy to CUDA
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1).cuda()  # which fails without CUDA
    assert LanguageModule.setup_embeddings_and_output_layer is not upstream

    from runner_helpers import cpu_spec, losses, run_local

    from autotune.catalog import load_model
    from autotune.layout import Layout
    from autotune.trials.proxy import make_proxy

    layout = Layout(world=2, pp=2, micro_batch_size=1)
    model = load_model("Qwen3.5-0.8B")
    assert model.tie_embeddings
    _, proxy = make_proxy(model, layout, "cpu")
    res = run_local(cpu_spec(layout, number=31, model="Qwen3.5-0.8B", proxy=proxy), tmp_path / "trial")
    assert res.status == "ok", (res.reason, res.log_tail)
    assert all(x == x for x in losses(res)) and losses(res)[-1] < losses(res)[0]
