"""GpuSpec and ClusterSpec: the hardware a layout runs on.

Peaks are dense BF16 (no sparsity); memory is what PyTorch can allocate on the device (slightly less
than the marketing number). Prices are on-demand $/GPU-hour implied by the seed page (AWS p5/p5en/p6).
The host fields matter only when the optimizer is offloaded (`--optimizer-cpu-offload`): the node's DRAM
bandwidth is what the CPU Adam step is bound by, and each GPU's PCIe link carries the gradients down and
the updated parameters back. They are the instances' nominal figures (channels x DDR rate x sockets; PCIe
generation x16); the time model applies achieved-fraction coefficients.
The `cpu` kind describes this machine, for local proxy trials and CI.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BadInput, UnknownName
from .registry import suggest

__all__ = ["GpuSpec", "ClusterSpec", "GPUS", "get_gpu"]

GB = 1e9
GiB = 1024**3


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int  # allocatable device memory
    memory_gb_nominal: int  # as vendors and recipes print it (H200: 141)
    bf16_tflops: float  # dense BF16 peak
    hbm_gbps: float  # HBM bandwidth, GB/s
    nvlink_gbps: float  # unidirectional NVLink bandwidth per GPU, GB/s
    usd_per_hour: float  # on-demand price per GPU-hour
    gpus_per_node: int = 8
    network_gbps: float = 400.0  # inter-node bandwidth per node, GB/s (3.2 Tb/s EFA = 400 GB/s)
    instance: str = ""
    is_accelerator: bool = True
    host_mem_gbps: float = 400.0  # host DRAM bandwidth per node, GB/s (all sockets)
    host_link_gbps: float = 32.0  # PCIe bandwidth between one GPU and the host, GB/s per direction
    host_mem_gib: float = 2048.0  # host memory per node, GiB


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        # p5: 2 x AMD EPYC 7R13 (8 x DDR4-3200 each), PCIe Gen4 to the host, 2 TiB
        GpuSpec("H100", int(79.6 * GiB), 80, 989.4, 3350, 450, 6.9, 8, 400.0, "AWS p5.48xlarge",
                host_mem_gbps=409.6, host_link_gbps=32.0, host_mem_gib=2048.0),
        # p5en: 2 x Xeon 8488C (8 x DDR5-4800 each), PCIe Gen5 to the host, 2 TiB
        GpuSpec("H200", int(139.8 * GiB), 141, 989.4, 4800, 450, 7.9, 8, 400.0, "AWS p5en.48xlarge",
                host_mem_gbps=614.4, host_link_gbps=64.0, host_mem_gib=2048.0),
        # p6-b200: 2 x Xeon 8570 (8 x DDR5-5600 each), PCIe Gen5 to the host, 2 TiB
        GpuSpec("B200", int(178.4 * GiB), 180, 2250.0, 8000, 900, 14.2, 8, 400.0, "AWS p6-b200.48xlarge",
                host_mem_gbps=716.8, host_link_gbps=64.0, host_mem_gib=2048.0),
        GpuSpec("cpu", int(24 * GiB), 24, 0.2, 20, 5, 0.0, 8, 1.0, "this machine (CPU, gloo)", False,
                host_mem_gbps=40.0, host_link_gbps=40.0, host_mem_gib=24.0),
    )
}


def get_gpu(name: str) -> GpuSpec:
    for key, spec in GPUS.items():
        if key.lower() == name.lower():
            return spec
    hint = suggest(name, list(GPUS))
    hint = f" (did you mean {hint}?)" if hint else ""
    raise UnknownName(f"unknown GPU {name!r}{hint}: choose one of {', '.join(GPUS)}; `autotune gpus` lists them")


@dataclass(frozen=True)
class ClusterSpec:
    gpu: GpuSpec
    count: int
    gpus_per_node: int
    network_gbps: float  # per node, GB/s
    has_deepep: bool = True  # flex dispatcher available (DeepEP installed on the cluster)
    has_te: bool = True  # Transformer Engine available

    def __post_init__(self):
        if self.count <= 0:
            raise BadInput(f"--count {self.count}: the GPU count must be positive")
        if self.gpus_per_node <= 0:
            raise BadInput(f"--gpus-per-node {self.gpus_per_node}: must be positive")
        if self.count > self.gpus_per_node and self.count % self.gpus_per_node:
            raise BadInput(
                f"--count {self.count} does not divide into nodes of {self.gpus_per_node} GPUs; "
                f"use a multiple of {self.gpus_per_node} (e.g. {self.count - self.count % self.gpus_per_node or self.gpus_per_node}) "
                f"or set --gpus-per-node"
            )

    @property
    def nodes(self) -> int:
        return max(1, self.count // self.gpus_per_node)

    @property
    def node_size(self) -> int:
        return min(self.count, self.gpus_per_node)

    @classmethod
    def of(cls, gpu: str | GpuSpec, count: int, gpus_per_node: int | None = None, **kw) -> "ClusterSpec":
        g = get_gpu(gpu) if isinstance(gpu, str) else gpu
        if not g.is_accelerator:
            kw.setdefault("has_deepep", False)
            kw.setdefault("has_te", False)
        return cls(g, count, gpus_per_node or g.gpus_per_node, kw.pop("network_gbps", g.network_gbps), **kw)
