"""The rank's environment: torchrun's variables, the process groups, the device, the software stack,
and the watchdog that ends a rank whose driver has gone."""

from __future__ import annotations

import os
import platform
import signal
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from ..errors import ConfigError

__all__ = ["RankEnv", "rank_env", "init_distributed", "detect_stack", "free_port", "watch_parent"]

_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def watch_parent(environ: dict | None = None, interval_s: float = 0.5) -> threading.Thread | None:
    """If a backend named its pid in AUTOTUNE_WATCH_PARENT, start a daemon thread that kills this
    rank (and its trial's process group, when the rank is not in its parent's group) once the parent
    pid changes: the driver died without stopping us (kill -9, or a parent-death signal not armed)."""
    env = os.environ if environ is None else environ
    value = env.get("AUTOTUNE_WATCH_PARENT", "")
    if not value.isdigit():
        return None
    parent = int(value)
    if os.getppid() != parent:  # gone before we got here
        os._exit(1)
    try:
        own_group = os.getpgrp() != os.getpgid(parent)
    except ProcessLookupError:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        if own_group:  # every rank of the trial and anything they started
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(1)

    thread = threading.Thread(target=watch, name="autotune-parent-watchdog", daemon=True)
    thread.start()
    return thread


def rank_env(count: int, environ: dict | None = None) -> RankEnv:
    """Read RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. A one-rank trial may omit them."""
    env = os.environ if environ is None else environ
    missing = [v for v in _VARS if v not in env]
    if missing and count == 1 and len(missing) == len(_VARS):
        env = {**env, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        os.environ.update({k: env[k] for k in _VARS})
    elif missing:
        raise ConfigError(
            f"missing {', '.join(missing)}: start one runner per rank with torchrun's variables "
            f"(`autotune trial run SPEC.json` does this), or use a one-rank trial")
    try:
        world = int(env["WORLD_SIZE"])
        rank = int(env["RANK"])
        out = RankEnv(rank=rank, world_size=world, local_rank=int(env.get("LOCAL_RANK", rank)),
                      local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)),
                      master_addr=env["MASTER_ADDR"], master_port=int(env["MASTER_PORT"]))
    except ValueError as exc:
        raise ConfigError(f"torchrun variables must be integers: {exc}") from None
    if not 0 <= out.rank < out.world_size:
        raise ConfigError(f"RANK {out.rank} is outside WORLD_SIZE {out.world_size}")
    return out


def init_distributed(env: RankEnv, plan, timeout_s: float) -> bool:
    """Start the process group (nccl on CUDA, gloo on CPU) and megatron's parallel state.
    Returns whether CUDA is in use."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    else:
        from . import cpu_patches

        cpu_patches.apply()
        # One core's worth of threads per rank: oversubscribed gloo ranks run several times slower.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, env.local_world_size)))
    timeout = timedelta(seconds=max(60.0, min(timeout_s, 1800.0)))
    torch.distributed.init_process_group(
        backend="nccl" if cuda else "gloo", init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank, world_size=env.world_size, timeout=timeout)
    lay = plan.layout
    ps.initialize_model_parallel(
        tensor_model_parallel_size=lay.tp, pipeline_model_parallel_size=lay.pp,
        virtual_pipeline_model_parallel_size=lay.vpp if lay.vpp > 1 else None, context_parallel_size=lay.cp,
        expert_model_parallel_size=lay.ep, expert_tensor_parallel_size=lay.etp,
        distributed_timeout_minutes=max(1, int(timeout.total_seconds() // 60)))
    # The same seed everywhere: megatron derives the TP/EP streams from it; CPU init uses torch's.
    torch.manual_seed(plan.spec.seed)
    tensor_parallel.model_parallel_cuda_manual_seed(plan.spec.seed)
    return cuda


def _version(module: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return "none"


def detect_stack(cuda: bool) -> dict[str, str]:
    """The software stack the trial ran on, as the recipes' `stack:` block records it."""
    import torch

    nccl = "none"
    if cuda:
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - a build without NCCL
            nccl = "none"
    te = _version("transformer-engine")
    if te == "none":
        te = _version("transformer_engine")
    return {
        "torch": torch.__version__.split("+")[0], "megatron_core": _version("megatron-core"),
        "transformer_engine": te, "nccl": nccl, "cuda": torch.version.cuda or "none",
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name() if cuda else f"cpu ({platform.machine()}, gloo)",
    }
