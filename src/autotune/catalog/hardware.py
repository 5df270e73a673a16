"""GpuSpec and ClusterSpec: the hardware a layout runs on.

Peaks are dense BF16 (no sparsity); memory is what PyTorch can allocate on the device (slightly less
than the marketing number). Prices are on-demand $/GPU-hour implied by the seed page (AWS p5/p5en/p6).
The host fields matter only when the optimizer is offloaded (`--optimizer-cpu-offload`): the node's DRAM
bandwidth is what the CPU Adam step is bound by, and each GPU's PCIe link carries the gradients down and
the updated parameters back. They are the instances' nominal figures (channels x DDR rate x sockets; PCIe
generation x16); the time model applies achieved-fraction coefficients.
The `cpu` kind describes this machine, for local proxy trials and CI.
FP8 peaks are dense (no sparsity) and serve every FP8 recipe; `mxfp8` marks tensor cores with block-scaled
FP8 (Blackwell); `fp4_tflops` is the dense NVFP4 peak (Blackwell only; 0 on Hopper). `nvlink_domain` is how many GPUs share one NVLink fabric: the node on HGX boards, the
whole rack on NVL72 (GB200/GB300: 72 GPUs, 4 per compute tray, each tray one network node).
Sources of each number are in the comments; the NVIDIA datasheets print sparse peaks, halved here.
A user's own GPU comes from a YAML or JSON file (`load_gpu_file`, `--gpu path.yaml`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from ..errors import BadInput, ConfigError, UnknownName
from .registry import suggest

__all__ = ["GpuSpec", "ClusterSpec", "GPUS", "GPU_VARIANTS", "VARIANT_KINDS", "catalog_gpu", "get_gpu", "load_gpu_file",
           "custom_gpu", "MAX_GPUS"]

MAX_GPUS = 1_000_000  # a GPU count: far above any cluster, low enough that products of degrees stay exact

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
    fp8_tflops: float = 0.0  # dense FP8 peak (0: no FP8 tensor cores)
    mxfp8: bool = False  # block-scaled FP8 (MXFP8) tensor cores
    fp4_tflops: float = 0.0  # dense NVFP4 peak (0: no FP4 tensor cores)
    nvlink_domain: int = 0  # GPUs on one NVLink fabric (0: the node)
    # FP8 GEMMs take either operand layout, so per-tensor FP8 keeps no transpose (Transformer Engine's
    # nvte_is_non_tn_fp8_gemm_supported: sm100 to sm119 and sm130 on; not Hopper, not sm120 workstation Blackwell).
    # None: as `mxfp8` (every catalog GPU with MXFP8 tensor cores is sm100-class)
    fp8_any_layout: bool | None = None

    def __post_init__(self):
        if self.nvlink_domain == 0:
            object.__setattr__(self, "nvlink_domain", self.gpus_per_node)
        if self.fp8_any_layout is None:
            object.__setattr__(self, "fp8_any_layout", self.mxfp8)


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        # H100 SXM datasheet (nvidia.com/en-us/data-center/h100): BF16 1,979 / FP8 3,958 TF with sparsity, HBM3
        # 3.35 TB/s, NVLink 900 GB/s bidirectional. p5: 2 x AMD EPYC 7R13 (8 x DDR4-3200 each), PCIe Gen4, 2 TiB
        GpuSpec("H100", int(79.6 * GiB), 80, 989.4, 3350, 450, 6.9, 8, 400.0, "AWS p5.48xlarge",
                host_mem_gbps=409.6, host_link_gbps=32.0, host_mem_gib=2048.0, fp8_tflops=1978.9),
        # H200 datasheet (nvidia.com/en-us/data-center/h200): H100's compute, 141 GB HBM3e at 4.8 TB/s.
        # p5en: 2 x Xeon 8488C (8 x DDR5-4800 each), PCIe Gen5 to the host, 2 TiB
        GpuSpec("H200", int(139.8 * GiB), 141, 989.4, 4800, 450, 7.9, 8, 400.0, "AWS p5en.48xlarge",
                host_mem_gbps=614.4, host_link_gbps=64.0, host_mem_gib=2048.0, fp8_tflops=1978.9),
        # H800 SXM: H100's compute and HBM3 with NVLink cut to 400 GB/s bidirectional (the export part; DeepSeek-V3
        # report arXiv:2412.19437 sec. 3.1: 8 GPUs per node on NVLink/NVSwitch, 8 x 400 Gb/s InfiniBand per node).
        # No public price: H100's p5 rate is assumed.
        GpuSpec("H800", int(79.6 * GiB), 80, 989.4, 3350, 200, 6.9, 8, 400.0, "DGX/HGX H800 (DeepSeek-V3 cluster)",
                host_mem_gbps=409.6, host_link_gbps=64.0, host_mem_gib=2048.0, fp8_tflops=1978.9),
        # HGX B200 datasheet (nvidia.com/en-us/data-center/hgx): 8 GPUs 36 PF BF16 / 72 PF FP8 / 144 PF FP4 with
        # sparsity (FP4 72 PF dense), 1.44 TB HBM3e at 8 TB/s per GPU, NVLink 5 1.8 TB/s bidirectional.
        # p6-b200: 2 x Xeon 8570, PCIe Gen5
        GpuSpec("B200", int(178.4 * GiB), 180, 2250.0, 8000, 900, 14.2, 8, 400.0, "AWS p6-b200.48xlarge",
                host_mem_gbps=716.8, host_link_gbps=64.0, host_mem_gib=2048.0, fp8_tflops=4500.0, mxfp8=True,
                fp4_tflops=9000.0),
        # HGX B300 datasheet (nvidia.com/en-us/data-center/hgx): same BF16/FP8 peaks as B200 (72 PF FP8 sparse per
        # 8 GPUs), FP4 144 PF with sparsity / 105 PF dense per 8 GPUs, 2.3 TB HBM3e (288 GB per GPU) at 8 TB/s,
        # NVLink 5; 800 Gb/s ConnectX-8 per GPU. No public on-demand price: B200's p6-b200 rate is assumed.
        # Allocatable: ~277 GiB (288 GB less ECC/reserved, assumed).
        GpuSpec("B300", int(277.0 * GiB), 288, 2250.0, 8000, 900, 14.2, 8, 800.0, "HGX B300",
                host_mem_gbps=716.8, host_link_gbps=64.0, host_mem_gib=4096.0, fp8_tflops=4500.0, mxfp8=True,
                fp4_tflops=13125.0),
        # GB200 NVL72 datasheet (nvidia.com/en-us/data-center/gb200-nvl72): 72 GPUs 360 PF BF16 / 720 PF FP8 /
        # 1,440 PF FP4 with sparsity, 13.4 TB HBM3e (186 GB per GPU) at 8 TB/s, NVLink 5 1.8 TB/s per GPU across all 72; 4 GPUs per
        # compute tray with 4 x 400 Gb/s ConnectX-7 (200 GB/s per tray). Grace host: 480 GB LPDDR5X per 2 GPUs at
        # 512 GB/s, NVLink-C2C 900 GB/s (450 per direction, shared by 2 GPUs). Price: B200's rate assumed.
        GpuSpec("GB200", int(184.0 * GiB), 186, 2500.0, 8000, 900, 14.2, 4, 200.0, "GB200 NVL72 (4 GPUs per tray)",
                host_mem_gbps=1024.0, host_link_gbps=225.0, host_mem_gib=894.0, fp8_tflops=5000.0, mxfp8=True,
                nvlink_domain=72, fp4_tflops=10000.0),
        # GB300 NVL72 datasheet (nvidia.com/en-us/data-center/gb300-nvl72): 360 PF BF16 / 720 PF FP8 sparse per 72
        # GPUs (as GB200), FP4 1,440 PF with sparsity / 1,080 PF dense (Blackwell Ultra's 1.5x dense FP4), 288 GB
        # HBM3e per GPU at 8 TB/s, 800 Gb/s ConnectX-8 per GPU (400 GB/s per tray).
        GpuSpec("GB300", int(277.0 * GiB), 288, 2500.0, 8000, 900, 14.2, 4, 400.0, "GB300 NVL72 (4 GPUs per tray)",
                host_mem_gbps=1024.0, host_link_gbps=225.0, host_mem_gib=894.0, fp8_tflops=5000.0, mxfp8=True,
                nvlink_domain=72, fp4_tflops=15000.0),
        GpuSpec("cpu", int(24 * GiB), 24, 0.2, 20, 5, 0.0, 8, 1.0, "this machine (CPU, gloo)", False,
                host_mem_gbps=40.0, host_link_gbps=40.0, host_mem_gib=24.0),
    )
}


# Parts sold under a catalog kind's name whose memory, bandwidth or power differ: the same silicon and software stack,
# so they share that kind's calibration (Measurement.gpu names the kind, Measurement.gpu_variant the part), but the
# time and memory models read their own figures. `autotune gpus` lists GPUS only; `--gpu NAME` takes a variant too.
GPU_VARIANTS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        # Meta's Grand Teton H100 (torchtitan's benchmarks/llama3_h100_202412_torchtitan.md and
        # asyncTP_llama3_h100_2025-06_torchtitan.md, "Hardware"): "96GB HBM2e with 2.4 TB/sec peak memory bandwidth",
        # "the default 500W power limit"; footnote 2: "HBM2e-based SXM H100 with lower TDP, the actual peak TFLOPs
        # number is between SXM and NVL, and we don't know its exact value". Peaks: the midpoint of H100 SXM (989.4 /
        # 1,978.9 TF dense BF16 / FP8) and H100 NVL (datasheet 1,671 / 3,341 TF with sparsity: 835.5 / 1,670.5 dense).
        # NVLink 4 as the SXM part; 400 Gb/s RDMA per GPU (400 GB/s per node). Allocatable memory in H100's ratio.
        GpuSpec("H100-HBM2e-500W", int(95.5 * GiB), 96, 912.45, 2400, 450, 6.9, 8, 400.0,
                "Grand Teton H100 (96 GB HBM2e, 500 W)", host_mem_gbps=409.6, host_link_gbps=32.0,
                host_mem_gib=2048.0, fp8_tflops=1824.7),
    )
}
# the catalog kind each variant is sold as (its calibration: cost.load_calibration)
VARIANT_KINDS: dict[str, str] = {"H100-HBM2e-500W": "H100"}


def catalog_gpu(name: str) -> GpuSpec | None:
    """The catalog's GPU (or variant) of that name, any case; None when it has none (never read as a file)."""
    return next((spec for key, spec in {**GPUS, **GPU_VARIANTS}.items() if key.lower() == name.lower()), None)


def get_gpu(name: str) -> GpuSpec:
    """A catalog GPU by name (any case), or a user's GPU from a .yaml/.yml/.json file."""
    if name.lower().endswith((".yaml", ".yml", ".json")):
        return load_gpu_file(name)
    spec = catalog_gpu(name)
    if spec is not None:
        return spec
    hint = suggest(name, list(GPUS))
    hint = f" (did you mean {hint}?)" if hint else ""
    raise UnknownName(f"unknown GPU {name!r}{hint}: choose one of {', '.join(GPUS)}; `autotune gpus` lists them")


def custom_gpu(g: GpuSpec) -> GpuSpec | None:
    """`g` itself when its name does not stand for it (a user's file, even under a catalog name), so that trial specs
    and calibration rows carry it whole; None for a catalog GPU as the catalog has it."""
    return None if {**GPUS, **GPU_VARIANTS}.get(g.name) == g else g


@dataclass(frozen=True)
class ClusterSpec:
    gpu: GpuSpec
    count: int
    gpus_per_node: int
    network_gbps: float  # per node, GB/s
    has_deepep: bool = True  # flex dispatcher available (DeepEP installed on the cluster)
    has_hybridep: bool = True  # the flex dispatcher's HybridEP backend available (DeepEP's hybrid-ep branch)
    has_te: bool = True  # Transformer Engine available
    # megatron-core's paged stash (--moe-paged-stash, after 0.16): full-iteration CUDA graphs of dropless MoE models
    has_paged_stash: bool = True

    def __post_init__(self):
        if self.has_hybridep and not self.has_deepep:  # HybridEP ships in DeepEP's hybrid-ep branch
            object.__setattr__(self, "has_hybridep", False)
        if self.count <= 0:
            raise BadInput(f"--count {self.count}: the GPU count must be positive")
        if self.gpus_per_node <= 0:
            raise BadInput(f"--gpus-per-node {self.gpus_per_node}: must be positive")
        if self.count > self.gpus_per_node and self.count % self.gpus_per_node:
            raise BadInput(
                f"--count {self.count} does not divide into nodes of {self.gpus_per_node} GPUs; "
                f"use a multiple of {self.gpus_per_node} ({self.count - self.count % self.gpus_per_node} or "
                f"{self.count - self.count % self.gpus_per_node + self.gpus_per_node}) or "
                + ("set --gpus-per-node" if self.gpus_per_node == self.gpu.gpus_per_node else
                   f"a --gpus-per-node that divides {self.count} (the {self.gpu.name} default: {self.gpu.gpus_per_node})")
            )

    @property
    def nodes(self) -> int:
        return max(1, self.count // self.gpus_per_node)

    @property
    def node_size(self) -> int:
        return min(self.count, self.gpus_per_node)

    @property
    def nvlink_size(self) -> int:
        """GPUs that reach each other over NVLink: the node, or the NVL72 rack its trays share."""
        return min(self.count, max(self.node_size, self.gpu.nvlink_domain))

    @classmethod
    def of(cls, gpu: str | GpuSpec, count: int, gpus_per_node: int | None = None, **kw) -> "ClusterSpec":
        g = get_gpu(gpu) if isinstance(gpu, str) else gpu
        if not g.is_accelerator:
            kw.setdefault("has_deepep", False)
            kw.setdefault("has_hybridep", False)
            kw.setdefault("has_te", False)
            kw.setdefault("has_paged_stash", False)
        return cls(g, count, gpus_per_node or g.gpus_per_node, kw.pop("network_gbps", g.network_gbps), **kw)


def load_gpu_file(path: str | Path) -> GpuSpec:
    """A user's GPU from YAML or JSON, with GpuSpec's fields (name, memory_gb_nominal, bf16_tflops, hbm_gbps,
    nvlink_gbps required; memory_bytes defaults to 0.97 x memory_gb_nominal GiB)."""
    from ._gpu_file import parse_gpu_file

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"--gpu {str(p)!r}: cannot read ({exc.strerror}); "
                          "give a GPU name or a readable file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--gpu {str(p)!r}: not UTF-8 text (a binary file?); give a GPU name or a YAML/JSON file") from None
    kw = parse_gpu_file(text, str(p), {f.name for f in fields(GpuSpec)})
    return GpuSpec(**kw)
