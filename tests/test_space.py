"""The space funnel's memory stage: GPU memory (with the margin) and, for offloaded optimizers, host memory."""

from dataclasses import replace

import numpy as np

from autotune.catalog import ClusterSpec, Workload, get_gpu, load_model
from autotune.space import explore, load_space

HOST_OOM = "predicted host OOM (offloaded optimizer)"


def test_host_memory_limits_how_much_optimizer_can_be_offloaded():
    m, w = load_model("Qwen3.5-122B-A10B"), Workload()
    space = load_space(None, m)
    space.prune.keep_within = 0.0  # keep every layout that fits
    roomy = explore(space, m, w, ClusterSpec.of("B200", 16))
    assert HOST_OOM not in roomy.reasons and len(roomy.kept)
    small = ClusterSpec.of(replace(get_gpu("B200"), host_mem_gib=512), 16)
    res = explore(space, m, w, small)
    assert res.reasons.get(HOST_OOM, 0) > 0  # full offload needs ~0.9 TiB per node here, half ~0.45
    mem = res.evaluation.memory
    assert len(res.kept) and np.all(mem.host_bytes[res.kept] <= mem.host_capacity_bytes)
    assert len(res.kept) < len(roomy.kept)
