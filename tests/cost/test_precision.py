"""Precision as a workload setting and the GPUs it runs on: FP8 recipes in time, memory and arguments;
NVL72 racks; a user's GPU file."""

import pytest

from autotune.catalog import GPUS, ClusterSpec, Workload, get_gpu, load_model
from autotune.cli.main import main
from autotune.cost import evaluate
from autotune.cost._published import precision_of
from autotune.cost._coefficients import TimeCoefficients
from autotune.cost._raw import step_pieces
from autotune.cost.calibrate import Calibration
from autotune.cost.memory import embedding_params, stage_params
from autotune.errors import BadInput, ConfigError
from autotune.layout import Layout, LayoutTable, Recompute, format_args
from autotune.layout.args import precision_args, precision_from_args
from autotune.recipes.convert import run_flags

QWEN = "Qwen3.5-122B-A10B"
SEED = Layout(world=32, tp=1, pp=4, ep=8, recompute=Recompute("full", "uniform", 2), max_tokens_per_gpu=8192)


def ev(precision="bf16", gpu="H200", lay=SEED, pg=False, model=QWEN, count=32, **coef):
    c = ClusterSpec.of(gpu, count)
    w = Workload(precision=precision, fp8_param_gather=pg)
    cal = Calibration(c.gpu.name, TimeCoefficients(**coef))
    return evaluate(load_model(model), w, c, LayoutTable.from_layouts([lay]), cal)


def test_precision_is_validated_against_the_workload_and_the_gpu():
    with pytest.raises(BadInput, match="choose one of bf16, fp8-delayed"):
        Workload(precision="fp16")
    with pytest.raises(BadInput, match="needs an FP8 precision"):
        Workload(fp8_param_gather=True)
    with pytest.raises(BadInput, match="Blackwell only"):
        Workload(precision="mxfp8").check_gpu(get_gpu("H100"))
    Workload(precision="mxfp8").check_gpu(get_gpu("GB200"))
    with pytest.raises(BadInput, match="no FP8"):
        Workload(precision="fp8-tensorwise").check_gpu(get_gpu("cpu"))


def test_fp8_runs_linears_at_the_fp8_peak_and_pays_for_the_casts():
    b, f, d = ev(), ev("fp8-tensorwise"), ev("fp8-delayed")
    bt, ft, dt = b.time.step_terms, f.time.step_terms, d.time.step_terms
    assert ft["compute_dense"][0] < 0.6 * bt["compute_dense"][0]  # 2x peak at 0.9 of BF16's efficiency
    assert ft["compute_output"][0] == pytest.approx(bt["compute_output"][0])  # the output layer stays BF16
    assert ft["compute_attention"][0] == pytest.approx(bt["compute_attention"][0])
    assert bt["quantize"][0] == 0 and ft["quantize"][0] > dt["quantize"][0] > 0  # current scaling's amax pass
    assert b.time.tokens_per_s_per_gpu[0] < f.time.tokens_per_s_per_gpu[0] < 2 * b.time.tokens_per_s_per_gpu[0]
    blk = ev("fp8-blockwise").time.step_terms
    assert ft["compute_dense"][0] < blk["compute_dense"][0] < bt["compute_dense"][0]


def test_mxfp8_gemms_pay_for_their_block_scales_and_skip_the_amax_pass():
    """On Blackwell, MXFP8's block-scaled GEMMs run slower than per-tensor FP8's (the E8M0 scale loads, TE's GEMM
    profiling guide) while its quantisation reads each tensor once (no separate amax pass)."""
    cs, mx = ev("fp8-tensorwise", gpu="B200").time.step_terms, ev("mxfp8", gpu="B200").time.step_terms
    assert mx["compute_dense"][0] > cs["compute_dense"][0]
    assert mx["compute_experts"][0] > cs["compute_experts"][0]
    assert mx["quantize"][0] < cs["quantize"][0]
    assert mx["compute_attention"][0] == pytest.approx(cs["compute_attention"][0])  # attention stays BF16


def test_mxfp8_gathers_parameters_in_bf16_and_every_recipe_pays_its_weight_cast():
    """Megatron gathers MXFP8 parameters in BF16 (into the gradient buffer) and casts the stage's weights after
    the gather; recipes without --fp8-param-gather cast on the first micro-batch; gathered per-tensor FP8 weights
    need a transpose on Hopper and nothing on Blackwell (its FP8 GEMMs take any layout)."""
    t = LayoutTable.from_layouts([SEED])
    model = load_model(QWEN)
    co = TimeCoefficients()

    def pieces(precision="bf16", pg=False, gpu="B200"):
        c = ClusterSpec.of(gpu, 32)
        return step_pieces(model, Workload(precision=precision, fp8_param_gather=pg), c, t, co, 4)

    bf, cs_pg, cs, mx = pieces(), pieces("fp8-tensorwise", True), pieces("fp8-tensorwise"), pieces("mxfp8", True)
    assert mx["dp_comm"][0] == pytest.approx(bf["dp_comm"][0])  # BF16 on the wire
    assert cs_pg["dp_comm"][0] == pytest.approx(bf["dp_comm"][0] * 5 / 6)  # fp32 grads (4 B) + FP8 params (1 B)
    assert cs_pg["optimizer"][0] == pytest.approx(bf["optimizer"][0])
    mx_cast, cs_cast = mx["optimizer"][0] - bf["optimizer"][0], cs["optimizer"][0] - bf["optimizer"][0]
    # MXFP8 writes row- and column-wise copies (2 + 2 B); per-tensor FP8 on Blackwell one copy, with an amax read
    assert mx_cast > 0 and cs_cast == pytest.approx(mx_cast * 5 / 4)
    # the stage's linear weights (no embedding, no output layer) once at full HBM bandwidth
    dense, expert = stage_params(model, t, 4)
    linear = (dense + expert - embedding_params(model, t, 4)).max()
    assert mx_cast == pytest.approx(linear * co.quant_bytes / (get_gpu("B200").hbm_gbps * 1e9))
    # Hopper: the same gathered FP8 weights get their transpose (1 B read, 1 B written) every step
    h_bf, h_pg = pieces(gpu="H200"), pieces("fp8-tensorwise", True, gpu="H200")
    assert h_pg["optimizer"][0] - h_bf["optimizer"][0] == pytest.approx(linear * 2 / (get_gpu("H200").hbm_gbps * 1e9))


def test_grouped_casts_pay_one_kernel_per_local_expert():
    """Transformer Engine 2.x quantizes a grouped linear's input one expert at a time (three kernels under current
    scaling, one blockwise or MXFP8) except under delayed scaling and NVFP4, whose grouped casts it fuses: fewer
    local experts, less time; a dense model pays none."""
    def q(precision, lay=SEED, model=QWEN, gpu="H200", **coef):
        return ev(precision, gpu=gpu, lay=lay, model=model, **coef).time.step_terms["quantize"][0]

    kernels = {p: q(p) - q(p, quant_kernel_s=0.0) for p in ("fp8-delayed", "fp8-tensorwise", "fp8-blockwise")}
    assert kernels["fp8-delayed"] == pytest.approx(0.0, abs=1e-12)
    assert kernels["fp8-blockwise"] > 0 and kernels["fp8-tensorwise"] == pytest.approx(3 * kernels["fp8-blockwise"])
    ep16 = Layout(world=32, tp=1, pp=4, ep=16, recompute=Recompute("full", "uniform", 2), max_tokens_per_gpu=8192)
    per16 = q("fp8-blockwise", lay=ep16) - q("fp8-blockwise", lay=ep16, quant_kernel_s=0.0)
    assert per16 == pytest.approx(kernels["fp8-blockwise"] / 2)  # 16 local experts instead of 32
    assert q("nvfp4", gpu="B200") == pytest.approx(q("nvfp4", gpu="B200", quant_kernel_s=0.0))
    assert q("mxfp8", gpu="B200") > q("mxfp8", gpu="B200", quant_kernel_s=0.0)
    dense = Layout(world=32, tp=8, pp=4, max_tokens_per_gpu=8192)
    llama = "Llama-3.1-70B"
    assert q("fp8-tensorwise", lay=dense, model=llama) == pytest.approx(
        q("fp8-tensorwise", lay=dense, model=llama, quant_kernel_s=0.0))


def test_low_precision_speeds_up_only_part_of_a_narrow_gemms_loss():
    """An FP8 GEMM's large-shape math runs at the FP8 peak, but of what a narrow shape loses only the operand
    traffic shrinks (with the format's bytes); BF16 results and FP32 weight-gradient accumulation do not: small
    experts (Qwen3-30B-A3B, FFN 768) gain less from FP8 than a large dense model's GEMMs do, and less than they
    would if the whole loss were operand traffic (share 1)."""
    def gain(model, lay, **coef):  # the GEMMs alone: no fixed per-expert kernel time
        coef = {"expert_gemm_s": 0.0, **coef}
        b = ev("bf16", gpu="H100", lay=lay, model=model, **coef).time.step_terms
        f = ev("fp8-delayed", gpu="H100", lay=lay, model=model, **coef).time.step_terms
        key = "compute_experts" if b["compute_experts"][0] > 0 else "compute_dense"
        return b[key][0] / f[key][0]

    small = ("Qwen3-30B-A3B", Layout(world=32, ep=8, max_tokens_per_gpu=4096))
    large = ("Llama-3.1-70B", Layout(world=32, tp=8, pp=4, max_tokens_per_gpu=8192))
    co = TimeCoefficients()
    ideal = get_gpu("H100").fp8_tflops / get_gpu("H100").bf16_tflops * co.fp8_gemm
    assert gain(*small) < gain(*large) < ideal
    no_loss = {"gemm_width": 1e-9, "gemm_rows": 1e-9, "grouped": 1.0}
    assert gain(*small, **no_loss) == pytest.approx(ideal)  # no shape loss: the peak ratio alone
    assert gain(*small, lowp_overhead_share=1.0) > gain(*small, lowp_overhead_share=0.0)
    assert gain(*small) < 0.95 * gain(*small, lowp_overhead_share=1.0)  # 1.68x against 1.84x


def test_per_tensor_fp8_casts_write_no_transpose_on_blackwell():
    """The activation casts: per-tensor FP8 writes a transposed copy where GEMMs must be TN (Hopper), not on
    Blackwell."""
    bytes_only = {"quant_kernel_s": 0.0}  # the casts' bytes alone, not their per-expert kernels
    cs = ev("fp8-tensorwise", gpu="B200", **bytes_only).time.step_terms["quantize"][0]
    mx = ev("mxfp8", gpu="B200", **bytes_only).time.step_terms["quantize"][0]
    assert cs == pytest.approx(mx * 5 / 4)  # 2 B read + 1 B written + 2 B amax read, against 2 + 2
    co = TimeCoefficients()
    h = ev("fp8-tensorwise", gpu="H200", **bytes_only).time.step_terms["quantize"][0]
    hbm = get_gpu("H200").hbm_gbps / get_gpu("B200").hbm_gbps
    assert h * hbm == pytest.approx(cs * (co.quant_bytes + co.amax_bytes) / (co.quant_bytes - 1 + co.amax_bytes))


def test_fp8_memory_saves_activations_and_the_param_gather_saves_weights():
    none = Layout(world=32, tp=1, pp=4, ep=8, max_tokens_per_gpu=8192)
    b, f, g = ev(lay=none), ev("fp8-tensorwise", lay=none), ev("fp8-tensorwise", lay=none, pg=True)
    bm, fm, gm = b.memory.terms, f.memory.terms, g.memory.terms
    assert fm["activations"][0, 0] < 0.9 * bm["activations"][0, 0]  # linear inputs halve, the rest stays
    assert fm["weights"][0, 1] == pytest.approx(2 * bm["weights"][0, 1], rel=0.01)  # BF16 + FP8 copy + transpose
    assert gm["weights"][0, 1] == pytest.approx(bm["weights"][0, 1], rel=0.01)  # FP8 param + its transpose
    assert g.time.step_terms["dp_comm"][0] <= f.time.step_terms["dp_comm"][0]
    # Blackwell: per-tensor FP8 keeps no transpose (its GEMMs take any layout); MXFP8 keeps both block-scaled copies
    bb = ev(lay=none, gpu="B200").memory.terms["weights"][0, 1]
    def weights(precision, pg):
        return ev(precision, lay=none, pg=pg, gpu="B200").memory.terms["weights"][0, 1]

    assert weights("fp8-tensorwise", True) == pytest.approx(bb / 2, rel=0.01)
    assert weights("fp8-tensorwise", False) == pytest.approx(1.5 * bb, rel=0.01)
    assert weights("mxfp8", True) == pytest.approx(bb, rel=0.01)


def test_precision_flags_round_trip_through_a_run_block():
    assert precision_args("bf16") == []
    for prec in ("fp8-delayed", "fp8-tensorwise", "fp8-blockwise", "mxfp8"):
        for pg in (False, True):
            line = " ".join(["train.py"] + format_args(precision_args(prec, pg)))
            assert precision_from_args(run_flags(line)) == (prec, pg)
    assert precision_args("mxfp8")[:2] == [("--fp8-format", "e4m3"), ("--fp8-recipe", "mxfp8")]


def test_nvl72_keeps_a_64_way_all_to_all_on_nvlink():
    lay = Layout(world=64, tp=1, pp=1, ep=64, max_tokens_per_gpu=4096)
    rack = ClusterSpec.of("GB200", 64)
    assert rack.node_size == 4 and rack.nvlink_size == 64 and rack.nodes == 16
    gb = ev(gpu="GB200", lay=lay, model="Qwen3-30B-A3B", count=64).time.step_terms["ep_comm"][0]
    b2 = ev(gpu="B200", lay=lay, model="Qwen3-30B-A3B", count=64).time.step_terms["ep_comm"][0]
    assert gb < 0.5 * b2  # 8 HGX nodes send 7/8 of the tokens over the network; the rack does not


def test_catalog_gpus_have_fp8_peaks_and_h800_its_cut_nvlink():
    for name in ("H100", "H200", "H800", "B200", "B300", "GB200", "GB300"):
        g = GPUS[name]
        assert g.fp8_tflops == pytest.approx(2 * g.bf16_tflops, rel=0.01)
    assert GPUS["H800"].nvlink_gbps < GPUS["H100"].nvlink_gbps and GPUS["GB300"].nvlink_domain == 72


def test_published_precision_names_are_read_or_skipped_with_a_reason():
    assert precision_of("BF16", "x") == ("bf16", "")
    assert precision_of("FP8-MX", "Megatron-Bridge perf archive:25.11")[0] == "mxfp8"
    assert precision_of("FP8 32x32 granularity (MX-style, per page footnote)", "")[0] == "mxfp8"
    assert precision_of("FP8-CS", "")[0] == "fp8-tensorwise"
    assert precision_of("FP8", "Megatron-Bridge perf archive:26.06")[0] == "fp8-tensorwise"
    assert precision_of("FP8", "NeMo 24.07 performance summary")[0] == "fp8-delayed"
    assert precision_of("FP8 blockwise", "")[0] == "fp8-blockwise"
    assert precision_of("NVFP4", "")[0] == "nvfp4" and "bf16_with_nvfp4_mixed" in precision_of("NVFP4", "")[1]
    assert precision_of("FP8 rowwise", "")[0] is None
    # other spellings: MX written apart, blocks by their shape, FP8 with its format or beside BF16 read as plain FP8
    # (the source's default recipe), per-tensor as plain FP8 too (delayed and current scaling are both per-tensor)
    for text, want in (("MX-FP8", "mxfp8"), ("FP8 block scaling", "fp8-blockwise"), ("FP8 1x128", "fp8-blockwise"),
                       ("fp8 tensor-wise", "fp8-tensorwise"), ("FP8 (E4M3)", "fp8-tensorwise"),
                       ("BF16 + FP8", "fp8-tensorwise"), ("FP8 per-tensor", "fp8-tensorwise")):
        assert precision_of(text, "Megatron-Bridge perf archive:26.06")[0] == want, text
    assert precision_of("FP8 per-tensor", "NeMo 24.07 performance summary")[0] == "fp8-delayed"
    assert precision_of("FP16", "")[0] is None and precision_of("FP8 alternate granularity", "")[0] is None


def test_a_user_gpu_file_is_validated_in_one_line(tmp_path, capsys):
    good = tmp_path / "mi.yaml"
    good.write_text("name: MyGPU\nmemory_gb_nominal: 192\nbf16_tflops: 1300\nfp8_tflops: 2600\n"
                    "hbm_gbps: 5300\nnvlink_gbps: 448\nusd_per_hour: 5\n")
    g = get_gpu(str(good))
    assert g.name == "MyGPU" and g.fp8_tflops == 2600 and g.nvlink_domain == 8
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: X\nmemory_gb_nominal: 80\nbf16_tflops: -1\nhbm_gbps: 1\nnvlink_gbps: 1\n")
    with pytest.raises(ConfigError, match="field bf16_tflops"):
        get_gpu(str(bad))
    capsys.readouterr()
    args = ["estimate", "-m", QWEN, "-n", "32", "-l", "TP1 PP4 EP8 DP8", "--recompute", "full:uniform:2", "--json"]
    assert main(args + ["-g", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "bf16_tflops" in err and len(err.splitlines()) == 1
    assert main(args + ["-g", str(good), "--precision", "fp8-tensorwise"]) == 0
    out = capsys.readouterr().out
    assert '"precision": "fp8-tensorwise"' in out and "--fp8-recipe" in out
    assert main(args + ["-g", "H200", "--fp8-param-gather"]) == 2
    assert "needs an FP8 precision" in capsys.readouterr().err
    assert main(args + ["-g", "H200", "--precision", "mxfp8"]) == 2
    assert "Blackwell only" in capsys.readouterr().err


def test_a_workstation_blackwell_file_keeps_the_fp8_transpose(tmp_path):
    """A GPU file says whether its FP8 GEMMs take any operand layout (sm100-class) apart from MXFP8 support (sm120
    has MXFP8 but TN-only FP8 GEMMs): the per-tensor casts then write the transpose too, as on Hopper."""
    body = ("memory_gb_nominal: 96\nbf16_tflops: 500\nfp8_tflops: 1000\nmxfp8: true\nhbm_gbps: 1800\n"
            "nvlink_gbps: 64\n")
    (tmp_path / "dc.yaml").write_text("name: DC\n" + body)
    (tmp_path / "ws.yaml").write_text("name: WS\nfp8_any_layout: false\n" + body)
    dc, ws = get_gpu(str(tmp_path / "dc.yaml")), get_gpu(str(tmp_path / "ws.yaml"))
    assert dc.fp8_any_layout and not ws.fp8_any_layout
    assert get_gpu("B200").fp8_any_layout and not get_gpu("H100").fp8_any_layout
    lay = Layout(world=8, tp=1, pp=1, micro_batch_size=1)

    def quantize(gpu):
        c = ClusterSpec.of(gpu, 8)
        e = evaluate(load_model("Llama-3.1-8B"), Workload(precision="fp8-tensorwise"), c,
                     LayoutTable.from_layouts([lay]), Calibration(gpu.name))
        return e.time.step_terms["quantize"][0]

    co = TimeCoefficients()
    assert quantize(ws) == pytest.approx(quantize(dc) * (co.quant_bytes + co.amax_bytes)
                                         / (co.quant_bytes - 1 + co.amax_bytes))


def test_uncertainty_grows_where_the_calibration_saw_nothing():
    from autotune.cost import uncertainty
    from autotune.cost.calibrate import load_calibration

    m, lay = load_model(QWEN), SEED
    out = {}
    for gpu, prec in (("H200", "bf16"), ("H200", "fp8-tensorwise"), ("H800", "bf16"), ("cpu", "bf16")):
        c, w, cal = ClusterSpec.of(gpu, 32), Workload(precision=prec), load_calibration(gpu)
        ev = evaluate(m, w, c, LayoutTable.from_layouts([lay, lay.with_(pp=8)]), cal)
        out[(gpu, prec)] = uncertainty(ev.time, cal, w)
        assert out[(gpu, prec)].shape == (2,) and (out[(gpu, prec)] >= 0.07).all()
    assert ev.sigma == pytest.approx(out[("cpu", "bf16")])  # every evaluation carries its interval
    # a term no H200 row spends time in (activation offload): its share of the step at the prior's width
    c, w, cal = ClusterSpec.of("H200", 32), Workload(), load_calibration("H200")
    assert "act_offload" not in cal.report.get("fitted_terms", [])
    plain = Layout.parse("TP1 PP1 EP8 DP32", world=32, micro_batch_size=1)
    ev = evaluate(m, w, c, LayoutTable.from_layouts([plain, plain.with_(activation_offload_layers=24)]), cal)
    assert ev.time.step_terms["act_offload"][1] > 0 and ev.sigma[1] > ev.sigma[0]
    assert out[("H800", "bf16")][0] > out[("H200", "bf16")][0]  # borrowed calibration
    assert out[("cpu", "bf16")][0] >= 0.2  # no calibration: the prior everywhere

