"""`python -m autotune.runner.component ...`: one rank of the MoE-layer component test.

Every rank builds the same full weights from a seed (router, and each global expert's fc1/fc2), loads
its local experts' slices into megatron-core MoE layers, and pushes its own tokens through them:
- an FP32 reference computed here from the full weights (softmax top-k routing, SwiGLU experts,
  probability-weighted sum; no dispatcher, no communication), with autograd for the input gradient;
- the default dispatcher and the candidate dispatcher in the test's dtype (bf16 as on GPUs);
- the candidate again (a rerun must be bitwise identical);
- two negative controls with the candidate: one expert's weight perturbed, one token dropped from
  routing. A test that cannot see these is not a test.
The ranks all-reduce squared errors and norms, so the errors are relative L2 over every rank's tokens;
rank 0 writes the numbers as JSON (--out). Deciding pass or fail is gates/component.py's job.

`layout_invariant_init` gives a trial's model the same initial weights at every TP/PP/EP/ETP degree
(megatron's CPU initialisation does not at EP > 1 or PP > 1), so the convergence gate can compare any
two layouts step for step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch

from ..layout.core import DISPATCHERS, dispatcher_config

__all__ = ["global_expert_weights", "load_global_experts", "layout_invariant_init", "reference_moe", "main"]


def global_expert_weights(hidden: int, experts: int, ffn: int, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """Full fp32 weights: router [E, H], fc1 [E, 2F, H] (gate rows then up rows), fc2 [E, H, F]."""
    g = torch.Generator().manual_seed(seed)
    return {
        "router": torch.randn(experts, hidden, generator=g) * std * 10,  # spread the logits: clear top-k
        "fc1": torch.randn(experts, 2 * ffn, hidden, generator=g) * std,
        "fc2": torch.randn(experts, hidden, ffn, generator=g) * std,
    }


def load_global_experts(layer, weights: dict[str, torch.Tensor], ep_rank: int, router: bool = True) -> None:
    """Copy the router (unless router=False) and this EP rank's slice of the global experts into a
    megatron MoELayer (SequentialMLP or TEGroupedMLP local experts, ETP 1)."""
    with torch.no_grad():
        if router:
            layer.router.weight.copy_(weights["router"].to(layer.router.weight.dtype))
        n_local = layer.num_local_experts
        for i in range(n_local):
            e = ep_rank * n_local + i
            experts = layer.experts
            if hasattr(experts, "local_experts"):
                mlp = experts.local_experts[i]
                mlp.linear_fc1.weight.copy_(weights["fc1"][e].to(mlp.linear_fc1.weight.dtype))
                mlp.linear_fc2.weight.copy_(weights["fc2"][e].to(mlp.linear_fc2.weight.dtype))
            else:  # TEGroupedMLP: weight0, weight1, ... per local expert
                getattr(experts.linear_fc1, f"weight{i}").copy_(weights["fc1"][e])
                getattr(experts.linear_fc2, f"weight{i}").copy_(weights["fc2"][e])


def _canonical_names(chunk, ep_rank: int) -> dict[int, str]:
    """param id -> a name that does not depend on the layout: decoder layers by their global layer
    number (megatron numbers a pipeline stage's layers from 0) and routed experts by their global index."""
    import re

    from megatron.core.transformer.moe.moe_layer import MoELayer

    out: dict[int, str] = {}
    for mname, module in chunk.named_modules():
        if re.search(r"decoder\.layers\.\d+$", mname) and getattr(module, "layer_number", None) is not None:
            for pname, p in module.named_parameters():
                out[id(p)] = f"decoder.layers.{module.layer_number}.{pname}"
    for module in chunk.modules():
        if isinstance(module, MoELayer):
            n_local = module.num_local_experts
            for pname, p in module.experts.named_parameters():
                glob = re.sub(r"local_experts\.(\d+)", lambda m: f"expert{ep_rank * n_local + int(m.group(1))}", pname)
                glob = re.sub(r"weight(\d+)$", lambda m: f"expert{ep_rank * n_local + int(m.group(1))}.weight", glob)
                out[id(p)] = out.get(id(p), "").rsplit(".experts.", 1)[0] + f".experts.{glob}"
    for pname, p in chunk.named_parameters():
        out.setdefault(id(p), pname.replace("module.", ""))
    return out


def _master(name: str, shape: list[int], seed: int, std: float = 0.02) -> torch.Tensor:
    """The full tensor of one parameter from (seed, name), drawn in blocks of 128 rows so that a vocabulary
    padded further (a larger TP pads more) keeps the same real rows."""
    import zlib

    rows = []
    for b in range(0, shape[0], 128):
        g = torch.Generator().manual_seed(seed * 7919 + zlib.crc32(f"{name}#{b}".encode()))
        rows.append(torch.randn([min(128, shape[0] - b), *shape[1:]], generator=g) * std)
    return torch.cat(rows)


def layout_invariant_init(chunks, seed: int) -> int:
    """Re-initialise a trial's matrices so that every layout of the same model starts from the same
    weights: each parameter's full tensor comes from (seed, its layout-free name) and each rank keeps
    its shard exactly as megatron's CPU initialisation cuts a master weight (partition_dim, and the
    stride 2 of GLU's interleaved [gate, up]), over TP or, for routed experts, expert TP.

    Megatron's CPU initialisation draws every parameter from one RNG in build order: an EP2 rank builds
    half the experts (rank 1 then holds copies of rank 0's) and a PP stage only its layers, so all later
    draws differ from EP1 PP1's. Norm weights and biases (1-D, constant at init) are kept. Call it on
    the GPTModel chunks before DDP and the optimizer wrap them. Returns the number of tensors set."""
    from megatron.core import parallel_state as ps

    tp = (ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size())
    etp = (ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size())
    n = 0
    with torch.no_grad():
        for chunk in chunks:
            names = _canonical_names(chunk, ps.get_expert_model_parallel_rank())
            for _, p in chunk.named_parameters():
                if p.dim() < 2:
                    continue
                name = names[id(p)]
                rank, world = etp if ".experts." in name else tp
                if not getattr(p, "tensor_model_parallel", False) or world == 1:
                    p.copy_(_master(name, list(p.shape), seed).to(p.dtype))
                else:
                    dim, stride = p.partition_dim, getattr(p, "partition_stride", 1)
                    full = list(p.shape)
                    full[dim] *= world
                    parts = torch.split(_master(name, full, seed), p.shape[dim] // stride, dim=dim)
                    p.copy_(torch.cat(parts[rank::world], dim=dim).to(p.dtype))
                n += 1
    return n


def reference_moe(x: torch.Tensor, w: dict[str, torch.Tensor], topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's math in fp32: top-k of the router logits, softmax over them, SwiGLU experts.
    Returns (output [T, H], the top-k expert indices [T, k], sorted)."""
    logits = x.float() @ w["router"].t()
    scores, idx = torch.topk(logits, topk, dim=-1)
    probs = torch.softmax(scores, dim=-1)
    out = torch.zeros_like(x, dtype=torch.float32)
    for e in range(w["router"].shape[0]):
        hit = (idx == e)
        rows = hit.any(-1).nonzero(as_tuple=True)[0]
        if rows.numel() == 0:
            continue
        h = x[rows].float() @ w["fc1"][e].t()
        gate, up = h.chunk(2, dim=-1)
        y = (torch.nn.functional.silu(gate) * up) @ w["fc2"][e].t()
        out = out.index_add(0, rows, y * (probs[rows] * hit[rows]).sum(-1, keepdim=True))
    return out, idx.sort(-1).values


def _config(a, dispatcher: str, dtype: torch.dtype, cuda: bool):
    from megatron.core.transformer.transformer_config import TransformerConfig

    kw = dict(num_layers=1, hidden_size=a.hidden, num_attention_heads=1, ffn_hidden_size=a.ffn,
              moe_ffn_hidden_size=a.ffn, num_moe_experts=a.experts, moe_router_topk=a.topk,
              gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False,
              moe_router_dtype="fp32", moe_aux_loss_coeff=0.0, moe_router_load_balancing_type="none",
              **dispatcher_config(dispatcher), expert_model_parallel_size=a.ep, moe_grouped_gemm=False,
              moe_permute_fusion=False, params_dtype=dtype, bf16=dtype == torch.bfloat16,
              use_cpu_initialization=not cuda, hidden_dropout=0.0, attention_dropout=0.0,
              bias_activation_fusion=False, bias_dropout_fusion=False)
    return TransformerConfig(**kw)


def _run(a, dispatcher, dtype, weights, x, g, ep_rank, cuda, *, perturb=False, drop_token=None):
    """One forward/backward of a megatron MoE layer: (output, input grad, sorted top-k indices)."""
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.spec_utils import build_module

    layer = build_module(get_moe_module_spec(use_te=False, num_experts=a.experts, moe_grouped_gemm=False),
                         config=_config(a, dispatcher, dtype, cuda))
    w = weights
    if perturb:  # negative control: global expert 0's fc2 off by 10%
        w = dict(weights, fc2=weights["fc2"].clone())
        w["fc2"][0] *= 1.10
    load_global_experts(layer, w, ep_rank)
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    layer.to(dev)
    seen = {}

    def hook(_mod, _inp, out):
        probs, rmap = out
        if drop_token is not None:  # negative control: this token reaches no expert
            probs, rmap = probs.clone(), rmap.clone()
            probs[drop_token] = 0
            rmap[drop_token] = False
        seen["idx"] = torch.topk(rmap.float() + probs.float() * 1e-3, a.topk, -1).indices.sort(-1).values.cpu()
        seen["dropped"] = int((~rmap.any(-1)).sum())
        return probs, rmap

    layer.router.register_forward_hook(hook)
    xin = x.to(dev, dtype).reshape(a.tokens, 1, a.hidden).requires_grad_()
    out, _ = layer(xin)
    (out.float().reshape(a.tokens, a.hidden) * g.to(dev)).sum().backward()
    return out.detach().float().reshape(a.tokens, a.hidden).cpu(), xin.grad.float().reshape(a.tokens, a.hidden).cpu(), seen


def _sum(values: list[float], device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t)
    return t.tolist()


def _rel(pairs, device) -> list[float]:
    """Relative L2 errors over every rank's tokens, for [(value, reference), ...]."""
    sums = _sum([v for a, b in pairs for v in (float((a - b).double().pow(2).sum()), float(b.double().pow(2).sum()))], device)
    return [(sums[2 * i] / sums[2 * i + 1]) ** 0.5 if sums[2 * i + 1] > 0 else 0.0 for i in range(len(pairs))]


def run_test(a) -> dict:
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available() and not a.cpu
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    else:
        from . import cpu_patches

        cpu_patches.apply()
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    torch.distributed.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                                         init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                                         timeout=timedelta(seconds=a.timeout))
    ps.initialize_model_parallel(expert_model_parallel_size=a.ep)
    torch.manual_seed(a.seed)
    tensor_parallel.model_parallel_cuda_manual_seed(a.seed)
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    ep_rank = ps.get_expert_model_parallel_rank()
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    weights = {k: v.to(dev) for k, v in global_expert_weights(a.hidden, a.experts, a.ffn, a.seed).items()}
    gen = torch.Generator().manual_seed(a.seed * 1000 + rank + 1)
    x = torch.randn(a.tokens, a.hidden, generator=gen)
    g = torch.randn(a.tokens, a.hidden, generator=gen)
    x_ref = x.to(dtype).float().to(dev).requires_grad_()  # the reference sees the inputs the layer sees
    ref_out, ref_idx = reference_moe(x_ref, weights, a.topk)
    (ref_out * g.to(dev)).sum().backward()
    ref_out, ref_idx, ref_grad = ref_out.detach().cpu(), ref_idx.cpu(), x_ref.grad.cpu()

    started = time.monotonic()
    runs = {"default": _run(a, a.reference_dispatcher, dtype, weights, x, g, ep_rank, cuda),
            "candidate": _run(a, a.dispatcher, dtype, weights, x, g, ep_rank, cuda)}
    rerun = _run(a, a.dispatcher, dtype, weights, x, g, ep_rank, cuda)
    runs["perturbed_weight"] = _run(a, a.dispatcher, dtype, weights, x, g, ep_rank, cuda, perturb=True)
    runs["dropped_token"] = _run(a, a.dispatcher, dtype, weights, x, g, ep_rank, cuda,
                                 drop_token=a.tokens // 2 if rank == 0 else None)
    names = list(runs)
    errs = _rel([p for n in names for p in ((runs[n][0], ref_out), (runs[n][1], ref_grad))], dev)
    mism = _sum([float((runs[n][2]["idx"] != runs["default"][2]["idx"]).any(-1).sum()) for n in names]
                + [float((runs[n][2]["idx"] != ref_idx).any(-1).sum()) for n in names]
                + [float(runs[n][2]["dropped"]) for n in names], dev)
    same = torch.equal(rerun[0], runs["candidate"][0]) and torch.equal(rerun[1], runs["candidate"][1])
    same = _sum([0.0 if same else 1.0], dev)[0] == 0
    k = len(names)
    result = {
        "dispatcher": a.dispatcher, "reference_dispatcher": a.reference_dispatcher, "dtype": a.dtype,
        "shape": {"hidden": a.hidden, "experts": a.experts, "topk": a.topk, "ffn": a.ffn, "tokens_per_rank": a.tokens,
                  "ep": a.ep, "etp": 1, "tp": 1, "world": world},
        "device": torch.cuda.get_device_name() if cuda else "cpu (gloo)",
        "runs": {n: {"output_error": errs[2 * i], "input_grad_error": errs[2 * i + 1],
                     "routing_mismatch_vs_default": int(mism[i]), "routing_mismatch_vs_reference": int(mism[k + i]),
                     "dropped_tokens": int(mism[2 * k + i])} for i, n in enumerate(names)},
        "rerun_bitwise_identical": same, "tokens_total": a.tokens * world,
        "seconds": round(time.monotonic() - started, 3),
    }
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m autotune.runner.component", description=__doc__.splitlines()[0])
    for name in ("--dispatcher", "--reference-dispatcher"):
        p.add_argument(name, default="allgather" if name == "--dispatcher" else "alltoall",
                       choices=list(DISPATCHERS))
    for name, default in (("--hidden", 128), ("--experts", 8), ("--topk", 2), ("--ffn", 64), ("--tokens", 256),
                          ("--ep", 2), ("--seed", 1234)):
        p.add_argument(name, type=int, default=default)  # --tokens: per rank
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--cpu", action="store_true", help="stay on CPU (gloo) even where CUDA exists")
    p.add_argument("--out", type=Path, required=True, help="rank 0 writes the result JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    result = run_test(a)
    if int(os.environ["RANK"]) == 0:
        tmp = a.out.with_name(a.out.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=2))
        os.replace(tmp, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
