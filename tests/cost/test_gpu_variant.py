"""A part sold under a catalog kind's name whose figures differ (catalog.GPU_VARIANTS): torchtitan's Grand Teton H100,
"96GB HBM2e with 2.4 TB/sec peak memory bandwidth" at "the default 500W power limit", peaks "between SXM and NVL"
(benchmarks/llama3_h100_202412_torchtitan.md, Hardware and footnote 2). Its rows run on its figures under H100's
calibration."""

from __future__ import annotations

from autotune.catalog import GPUS, ClusterSpec, Workload, load_model
from autotune.catalog.hardware import GPU_VARIANTS
from autotune.cost import Calibration, evaluate
from autotune.cost._published import gpu_kind, gpu_variant, map_row
from autotune.cost.measurements import Measurement, published_measurements
from autotune.layout import Layout, LayoutTable, Recompute

GT = "H100 (Grand Teton, 96GB HBM2e, 500W power limit)"


def test_the_grand_teton_h100_is_read_as_its_variant_of_h100():
    assert gpu_kind(GT) == ("H100", None) and gpu_variant(GT, "H100") == "H100-HBM2e-500W"
    assert gpu_variant("H100 (700W, 80GB HBM3)", "H100") == "" and gpu_variant("H200", "H200") == ""
    g, sxm = GPU_VARIANTS["H100-HBM2e-500W"], GPUS["H100"]
    assert g.hbm_gbps == 2400 and g.memory_gb_nominal == 96 and g.memory_bytes > sxm.memory_bytes
    assert 835.5 < g.bf16_tflops < sxm.bf16_tflops and 1670.5 < g.fp8_tflops < sxm.fp8_tflops  # between NVL and SXM
    assert "H100-HBM2e-500W" not in GPUS  # not offered to the search


def test_published_grand_teton_rows_run_on_its_figures_under_h100s_calibration():
    row = {"source": "torchtitan benchmarks llama3_h100_202412 (Table 1)", "model": "Llama 3.1 8B", "gpu": GT,
           "num_gpus": "8", "seq_len": "8192", "global_batch": "16", "micro_batch": "2", "tp": "1", "pp": "1",
           "cp": "1", "vp": "1", "precision": "BF16", "recompute": "selective AC", "tokens_per_s_per_gpu": "5762",
           "notes": "FSDP=8; FSDP"}
    got = map_row(row)["measurement"]
    assert got["gpu"] == "H100" and got["gpu_variant"] == "H100-HBM2e-500W"
    kept, _ = published_measurements()
    titan = [m for m in kept if m.source.startswith("torchtitan") and m.gpu == "H100"]
    assert titan and all(m.gpu_variant == "H100-HBM2e-500W" for m in titan)
    assert all(m.cluster.gpu.hbm_gbps == 2400 for m in titan)
    assert not any(m.gpu_variant for m in kept if not m.source.startswith("torchtitan"))


def test_the_variant_is_slower_than_the_sxm_part_at_the_same_factors():
    lay = Layout(world=8, fsdp=True, micro_batch_size=2, recompute=Recompute.parse("selective"))
    w = Workload(seq_len=8192, global_batch=16, framework="torchtitan")
    m, t = load_model("Llama-3.1-8B"), LayoutTable.from_layouts([lay])
    cal = Calibration("H100")
    tps = {g: float(evaluate(m, w, ClusterSpec.of(g, 8), t, cal).time.tokens_per_s_per_gpu[0])
           for g in ("H100", "H100-HBM2e-500W")}
    assert tps["H100-HBM2e-500W"] < 0.95 * tps["H100"]
    meas = Measurement(model="Llama-3.1-8B", gpu="H100", gpu_variant="H100-HBM2e-500W", count=8, layout=lay,
                       tokens_per_s_per_gpu=5762.0, seq_len=8192, global_batch=16, framework="torchtitan")
    assert meas.cluster.gpu.name == "H100-HBM2e-500W" and Measurement.from_dict(meas.to_dict()) == meas


def test_a_variant_named_on_the_command_line_uses_its_kinds_calibration():
    from autotune.cost import load_calibration
    own, kind = load_calibration("H100-HBM2e-500W"), load_calibration("H100")
    assert own.gpu == "H100-HBM2e-500W" and "H100's calibration" in own.provenance
    assert own.time.scale == kind.time.scale and own.time.scale  # fitted factors, not the defaults
