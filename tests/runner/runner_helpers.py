"""Helpers for the runner tests: tiny-moe TrialSpecs on CPU ranks, run through the local backend."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from autotune.catalog import Workload
from autotune.layout import Layout
from autotune.trials.spec import TrialResult, TrialSpec

STEPS = 6
# lr 1e-3 (not the seed's 1e-5) so that six steps show the loss falling on the synthetic rows.
WORKLOAD = dict(seq_len=128, global_batch=4, steps=STEPS, window=(2, STEPS - 1), lr=1e-3, min_lr=1e-4)


def cpu_spec(layout: Layout, number: int = 0, model: str = "tiny-moe", seed: int = 1234, **fields) -> TrialSpec:
    workload = dataclasses.asdict(Workload(**{**WORKLOAD, **fields.pop("workload", {})}))
    base = dict(study="runner", number=number, model=model, gpu="cpu", count=layout.world, gpus_per_node=2,
                layout=layout.to_dict(), workload=workload, steps=STEPS, warmup_steps=2, seed=seed, timeout_s=240.0)
    base.update(fields)
    return TrialSpec(**base)


def run_local(spec: TrialSpec, trial_dir: Path) -> TrialResult:
    """Run the trial; once more (in a fresh directory, the failed one kept beside it) if a rank died of a signal in
    native code: gloo's own runloop thread has segfaulted in libc on this machine (once in some hundreds of CPU
    trials, torch 2.13), which says nothing about the layout under test. Any other failure is returned as it is."""
    from autotune.trials.backends.local import LocalBackend

    backend = LocalBackend(grace_s=5.0)
    res = backend.wait(backend.submit(spec, trial_dir))
    if res.status == "crash" and "in native code" in (res.reason or ""):
        trial_dir.rename(trial_dir.with_name(trial_dir.name + "-native-crash"))
        trial_dir.mkdir()
        res = backend.wait(backend.submit(spec, trial_dir))
    return res


def losses(result: TrialResult) -> list[float]:
    return [s.lm_loss for s in result.steps]


def uneven_collectives_check(rank: int, world: int, port: int) -> None:
    """One rank of test_cpu_patches' gloo check of uneven all-gather and reduce-scatter (spawned)."""
    import torch
    import torch.distributed as dist

    from autotune.runner import cpu_patches as cp

    cp.apply()
    from megatron.core.tensor_parallel import mappings

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group, sizes = dist.group.WORLD, [3, 5]
    mine = torch.full((sizes[rank], 2), float(rank + 1))
    try:
        cp.UPSTREAM["megatron.core.tensor_parallel.mappings:_gather_along_first_dim"](mine, group, sizes)
    except RuntimeError as exc:
        assert "invalid tensor size" in str(exc)  # gloo refuses blocks of different sizes
    else:
        raise AssertionError("upstream uneven all-gather now works on gloo: drop the patch")
    gathered = mappings._gather_along_first_dim(mine, group, sizes)
    assert torch.equal(gathered, torch.cat([torch.full((3, 2), 1.0), torch.full((5, 2), 2.0)]))
    # Its reverse, the uneven reduce-scatter, needs no patch: gloo does it.
    scattered = mappings._reduce_scatter_along_first_dim(torch.ones(8, 2) * (rank + 1), group, sizes)
    assert torch.equal(scattered, torch.full((sizes[rank], 2), 3.0))
    dist.destroy_process_group()
