"""The space funnel: enumerated and screened in chunks (same answer whatever the chunk size, spaces beyond one
table's cap), and its memory stage: GPU memory (with the margin) and, for offloaded optimizers, host memory."""

import json
from dataclasses import replace

import numpy as np

from autotune.catalog import ClusterSpec, Workload, get_gpu, load_model
import pytest

from autotune import space as space_mod
from autotune.errors import ConfigError
from autotune.layout.describe import settings_label
from autotune.layout.dimensions import table_keys
from autotune.layout.splits import split_text
from autotune.space import MAX_ENUMERATED, enumerate_space, explore, load_space

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


def test_chunked_screening_gives_the_funnel_of_one_table(monkeypatch):
    """Qwen3-30B-A3B on 16 H200: screened in chunks of 4,096 rows, the funnel, the reasons and the surviving
    layouts (in order) are those of the whole space checked as one table."""
    m, w, c = load_model("Qwen3-30B-A3B"), Workload(), ClusterSpec.of("H200", 16)
    space = load_space(None, m)
    space.dimensions.recompute = ["none", "full:uniform:1"]
    space.dimensions.optimizer_offload = [0.0]
    whole = explore(space, m, w, c)
    assert whole.funnel[0][1] <= space_mod.MAX_CHUNK  # one chunk
    monkeypatch.setattr(space_mod, "MAX_CHUNK", 4096)
    monkeypatch.setattr(space_mod, "TIME_CHUNK", 1000)
    parts = list(space_mod.chunks(space_mod.grid_axes(space.dimensions.model_dump(), m, c), 4096))
    assert len(parts) > 10
    chunked = explore(space, m, w, c)
    assert chunked.funnel == whole.funnel and chunked.reasons == whole.reasons
    assert list(table_keys(chunked.table)) == list(table_keys(whole.table))
    assert list(chunked.kept) == list(whole.kept)
    # the memory results screened per chunk (of different PP widths) are joined and reused by the time model
    assert np.array_equal(chunked.evaluation.memory.total, whole.evaluation.memory.total)
    assert np.array_equal(chunked.evaluation.time.tokens_per_s_per_gpu, whole.evaluation.time.tokens_per_s_per_gpu)
    t = enumerate_space(space, m, w, c)  # the table the chunks cut up, in the same order
    assert whole.funnel[0][1] == len(t)


def test_the_result_holds_the_layouts_that_can_win_and_the_time_model_runs_in_chunks(monkeypatch):
    """The time model screens every fitting row TIME_CHUNK at a time (575k rows at once held 3 GB), and the
    result keeps only the rows within keep_within of the best, evaluated whole: the same rows, order and numbers
    as with every fitting row kept and cut afterwards."""
    m, w, c = load_model("Qwen3-30B-A3B"), Workload(), ClusterSpec.of("H200", 16)
    space = load_space(None, m)
    space.dimensions.optimizer_offload = [0.0]
    res = explore(space, m, w, c)
    every = load_space(None, m)
    every.dimensions.optimizer_offload = [0.0]
    every.prune.keep_within = 0.0
    monkeypatch.setattr(space_mod, "TIME_CHUNK", 777)
    all_fit = explore(every, m, w, c)
    tps, best = all_fit.evaluation.time.tokens_per_s_per_gpu, all_fit.evaluation.time.tokens_per_s_per_gpu.max()
    can_win = np.flatnonzero(tps >= space.prune.keep_within * best)
    assert 0 < len(res.table) == len(res.kept) == len(can_win) < len(all_fit.table)
    assert list(table_keys(res.table)) == list(table_keys(all_fit.table.take(can_win)))
    assert np.allclose(res.evaluation.time.tokens_per_s_per_gpu, tps[can_win], rtol=1e-12)
    assert np.all(np.diff(res.evaluation.time.tokens_per_s_per_gpu[res.kept]) <= 0)  # best first
    assert res.reasons["cannot win (predicted below 70% of the best)"] == len(all_fit.table) - len(can_win)
    assert dict(res.funnel)["fits"] == dict(all_fit.funnel)["fits"] == len(all_fit.table)


def test_a_space_larger_than_one_table_is_explored():
    """tiny-moe on 2 CPUs: the default space is 6.2M combinations (more than one table's cap of 5M, most
    illegal at this world size); explore screens them in chunks and keeps the legal few."""
    m, w, c = load_model("tiny-moe"), Workload(seq_len=256, global_batch=8), ClusterSpec.of("cpu", 2)
    space = load_space(None, m)
    with pytest.raises(ConfigError, match="exceed the cap"):
        enumerate_space(space, m, w, c)
    res = explore(space, m, w, c)
    assert res.funnel[0][1] > MAX_ENUMERATED
    assert 0 < res.funnel[1][1] < 10_000 and len(res.kept)
    assert set(res.table.tp) <= {1, 2} and set(res.table.ep) <= {1, 2}


def test_a_space_beyond_the_exploration_cap_is_a_one_line_error(tmp_path):
    p = tmp_path / "huge.yaml"
    p.write_text("extends: default\ndimensions:\n  vpp: [" + ", ".join(str(i) for i in range(1, 65)) + "]\n"
                 "  optimizer_offload: [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]\n")
    m = load_model("Qwen3-30B-A3B")
    with pytest.raises(ConfigError, match=r"combinations .* exceed the cap of 50,000,000; list fewer"):
        explore(load_space(str(p)), m, Workload(), ClusterSpec.of("H200", 16))


def test_too_many_layouts_that_can_win_is_a_one_line_error(monkeypatch):
    """Screening stops as soon as more layouts could win than the cost model may evaluate at once."""
    m = load_model("Qwen3-30B-A3B")
    monkeypatch.setattr(space_mod, "MAX_EVALUATED", 5_000)
    with pytest.raises(ConfigError, match=r"more than 5,000 layouts of Qwen3-30B-A3B on 16 x H200 are predicted "
                                          r"within 30% of the best .* list fewer values per dimension or raise "
                                          r"prune.keep_within"):
        explore(load_space(None, m), m, Workload(), ClusterSpec.of("H200", 16))


def test_memory_follows_the_layouts_that_can_win_not_those_that_fit(monkeypatch):
    """Qwen3-30B-A3B on 16 H200: ~141k layouts fit, ~13k can win. Each chunk's rows below 70% of the best so
    far are let go as it is screened, so a cap under the fitting count but over the winning one is no error
    (NVIDIA-Nemotron-3-Nano-30B-A3B on 128 H800, 1.06M fitting, was refused by the default space)."""
    m, w, c = load_model("Qwen3-30B-A3B"), Workload(), ClusterSpec.of("H200", 16)
    whole = explore(load_space(None, m), m, w, c)
    fits, kept = dict(whole.funnel)["fits"], dict(whole.funnel)["kept"]
    assert kept < 20_000 < fits
    monkeypatch.setattr(space_mod, "MAX_EVALUATED", 20_000)
    monkeypatch.setattr(space_mod, "MAX_CHUNK", 1 << 18)  # several chunks, so the best rises on the way
    capped = explore(load_space(None, m), m, w, c)
    assert capped.funnel == whole.funnel and capped.reasons == whole.reasons
    assert list(table_keys(capped.table)) == list(table_keys(whole.table)) and list(capped.kept) == list(whole.kept)


def test_space_cli_screens_at_the_precision_a_search_would_run(capsys):
    """`autotune space --precision` shows the funnel and ranking a `search --precision` screens with."""
    from autotune.cli.main import main

    args = ["space", "--model", "Qwen3-30B-A3B", "--gpu", "B200", "--count", "16", "--top", "3", "--json"]
    capsys.readouterr()
    out = {}
    for p in ("bf16", "mxfp8"):
        assert main(args + ["--precision", p]) == 0
        out[p] = json.loads(capsys.readouterr().out)
    assert out["mxfp8"]["precision"] == "mxfp8" and out["bf16"]["precision"] == "bf16"
    speed = {p: out[p]["top"][0]["throughput"]["tokens_per_s_per_gpu"] for p in out}
    assert speed["mxfp8"] > speed["bf16"]
    assert main(args + ["--gpu", "H100", "--precision", "mxfp8"]) == 2
    assert "Blackwell only" in capsys.readouterr().err


@pytest.mark.parametrize("setting, needle", [
    ("keep_within: 5", "prune.keep_within: Input should be less than or equal to 1, got 5"),
    ("keep_within: 0", "prune.keep_within: Input should be greater than 0, got 0"),
    ("memory_margin: -1", "prune.memory_margin: Input should be greater than or equal to 0, got -1"),
    ("memory_margin: 1.5", "prune.memory_margin: Input should be less than 1, got 1.5"),
    ("ep_tp_within_nodes: 0", "prune.ep_tp_within_nodes: Input should be greater than or equal to 1, got 0"),
])
def test_prune_settings_out_of_range_are_one_line_errors(tmp_path, setting, needle):
    """A negative memory margin let layouts that run out of memory through; keep_within 5 blamed a layout rule."""
    f = tmp_path / "space.yaml"
    f.write_text(f"extends: default\nprune:\n  {setting}\n")
    with pytest.raises(ConfigError) as exc:
        load_space(str(f))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_tp_comm_overlap_asked_where_it_cannot_act_is_one_layout_not_two(tmp_path):
    """TP communication overlap needs TP > 1: with both values listed, a TP 1 row asking for it would be the same
    layout as the one without (a trial spent twice), so it is screened out as redundant; shown as it takes effect."""
    from autotune.layout.describe import settings_label

    m, c = load_model("Qwen3-30B-A3B"), ClusterSpec.of("H100", 16)
    f = tmp_path / "space.yaml"
    f.write_text("extends: default\ndimensions:\n  tp_comm_overlap: [false, true]\n")
    res = explore(load_space(str(f)), m, Workload(), c)
    t = res.table
    assert not (t.tp_comm_overlap & (t.tp == 1)).any() and (t.tp_comm_overlap & (t.tp > 1)).any()
    assert res.reasons["redundant: TP communication overlap needs TP > 1 (the same layout without it is in the space)"]
    only_on = explore(load_space(None, m), m, Workload(), c)  # the default space lists it on only: TP 1 stays
    tp1 = np.flatnonzero(only_on.table.tp == 1)
    assert len(tp1) and "tp comm overlap" not in settings_label(only_on.table.row(int(tp1[0])))


def test_the_space_searches_the_split_where_layers_do_not_divide():
    """Qwen3-235B-A22B has 94 layers: PP8 x VPP4 (the published layout) divides them only with an uneven split.
    The default space tries every split Megatron accepts there (embedding and loss counted as layers, the
    balanced one), never one where the layers divide, and counts each split as one enumerated layout."""
    from autotune.layout.splits import legal_splits

    m, w, c = load_model("Qwen3-235B-A22B"), Workload(seq_len=4096), ClusterSpec.of("H100", 64)
    space = load_space(None, m)
    space.dimensions.recompute = ["full:uniform:1"]
    space.dimensions.optimizer_offload = [0.0]
    res = explore(space, m, w, c)
    t = res.table
    assert len(res.kept) and (t.split > 0).any()
    for pp, vpp in {(int(a), int(b)) for a, b in zip(t.pp, t.vpp)}:
        rows = (t.pp == pp) & (t.vpp == vpp)
        splits = {t.row(int(i)).layer_split for i in np.flatnonzero(rows)}
        if m.num_layers % (pp * vpp) == 0:
            assert splits == {()}
        else:
            assert () not in splits and splits <= set(legal_splits(m.num_layers, pp, vpp))
    pub = (t.pp == 8) & (t.vpp == 4)
    assert {t.row(int(i)).layer_split for i in np.flatnonzero(pub)} == set(legal_splits(94, 8, 4))
    even = load_space(None, m)
    even.dimensions.recompute, even.dimensions.optimizer_offload = ["full:uniform:1"], [0.0]
    even.dimensions.layer_split = ["even"]
    only_even = explore(even, m, w, c)
    assert not (only_even.table.split > 0).any() and only_even.funnel[0][1] < res.funnel[0][1]
    assert res.funnel[1][1] > only_even.funnel[1][1]  # legal: the uneven splits of PP x VPP that do not divide
    # every uneven row shows its split where the search and its study show settings
    i = int(np.flatnonzero(t.split > 0)[0])
    assert f"layer split {split_text(t.row(i).layer_split)}" in settings_label(t.row(i))


def test_uneven_rows_are_counted_once_per_split_whatever_the_chunking(monkeypatch):
    m, w, c = load_model("Qwen3-235B-A22B"), Workload(seq_len=4096), ClusterSpec.of("H100", 64)
    space = load_space(None, m)
    space.dimensions.recompute, space.dimensions.optimizer_offload = ["full:uniform:1"], [0.0]
    space.dimensions.dispatcher, space.dimensions.ep_overlap = ["alltoall"], [False]
    whole = explore(space, m, w, c)
    monkeypatch.setattr(space_mod, "MAX_CHUNK", 2048)
    chunked = explore(space, m, w, c)
    assert chunked.funnel == whole.funnel and chunked.reasons == whole.reasons
    assert list(table_keys(chunked.table)) == list(table_keys(whole.table))
    t = enumerate_space(space, m, w, c)  # every split materialised: the funnel's first count
    assert len(t) == whole.funnel[0][1]


def test_space_shows_the_split_column_only_when_a_top_layout_has_one(capsys):
    from autotune.cli.main import main

    assert main(["space", "--model", "Qwen3-235B-A22B", "--gpu", "H100", "--count", "64", "--top", "3"]) == 0
    out = capsys.readouterr().out
    import re

    assert "split" in out and re.search(r"\b\d+,\d+x\d+,\d+\b", out)  # e.g. 1,2x46,1 (folded runs)
    assert main(["space", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32", "--top", "3"]) == 0
    assert "split" not in capsys.readouterr().out.split("top 3", 1)[1]


def _run_cli(capsys, *args):
    from autotune.cli.main import main

    capsys.readouterr()
    rc = main(["space", *args])
    out, err = capsys.readouterr()
    return rc, out, err.strip().splitlines()[-1] if err.strip() else ""


@pytest.mark.parametrize("count, batch, fixed", [(32, 3, (4,)), (40, 128, (160, 130))])
def test_when_no_layout_is_legal_the_way_out_is_the_rule_the_closest_layouts_break(capsys, count, batch, fixed):
    """A global batch no DP divides: the message names dp_batch among the rules the nearest layouts break (not
    every rule that fired over the whole grid), suggests a global batch (the smallest DP times a power of 2 first,
    so power-of-two multiples of that DP divide it too, then the nearest multiple when that is another), and each
    batch it suggests does give layouts."""
    base = ["--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", str(count), "--top", "1"]
    rc, _, line = _run_cli(capsys, *base, "--global-batch", str(batch))
    assert rc == 2 and "none is legal; the closest break" in line and "illegal: dp_batch" in line, line
    assert "uneven layer splits" not in line and "world_mp" not in line, line
    assert f"use --global-batch {fixed[0]} " in line, line
    assert len(fixed) == 1 or f" or {fixed[1]} (the nearest multiple" in line, line
    rc, out, line = _run_cli(capsys, *base, "--global-batch", str(batch), "--json")  # a script reads the same
    doc = json.loads(out)
    assert rc == 2 and doc["top"] == [] and "illegal: dp_batch" in doc["last_reasons"] and doc["error"] in line
    for good in fixed:
        rc, out, line = _run_cli(capsys, *base, "--global-batch", str(good), "--json")
        assert rc == 0 and json.loads(out)["top"], line


def test_a_split_the_space_cannot_make_points_at_uneven_splits(tmp_path, capsys):
    """94 layers over PP 4 with only even splits listed: the closest layouts break layers_pp alone."""
    sp = tmp_path / "even.yaml"
    sp.write_text("dimensions:\n  tp: [1]\n  pp: [4]\n  vpp: [1]\n  layer_split: [even]\n")
    rc, _, line = _run_cli(capsys, "--model", "Qwen3-235B-A22B", "--gpu", "H100", "--count", "64", "--space", str(sp))
    assert rc == 2 and "the closest break 1 rule" in line and "illegal: layers_pp" in line, line
    assert "layer_split: [even, uneven]" in line and "--global-batch" not in line, line


def test_a_global_batch_smaller_than_the_gpu_count_is_named_with_the_batch_that_frees_data_parallelism():
    """128 rows on 4,096 GPUs left every layout at DP <= 128 and the best at 0.5% MFU, silently; the funnel now
    says why and which batch lets DP use the GPUs, and no such note appears once the rows cover the GPUs."""
    m, c = load_model("Llama-3.1-8B"), ClusterSpec.of("H100", 64)
    small = explore(load_space(None, m), m, Workload(global_batch=16), c)
    note = next(n for n in small.notes if n.startswith("--global-batch 16 rows on 64 GPUs"))
    assert "at least 4 GPUs" in note and f"gets {16 * 8192 // 64:,} tokens" in note and "--global-batch 64 or more" in note
    assert np.all(small.table.dp <= 16)
    enough = explore(load_space(None, m), m, Workload(global_batch=64), c)
    assert not any("rows per step than GPUs" in n for n in enough.notes)
    assert enough.evaluation.time.mfu.max() > small.evaluation.time.mfu.max()
    big = space_mod.small_batch_note(Workload(global_batch=1280), ClusterSpec.of("H100", 4096), 0.01)
    assert big.startswith("--global-batch 1280 rows on 4,096 GPUs") and "--global-batch 4096 or more" in big  # as typed


def test_rows_per_micro_batch_stop_at_the_micro_batch_token_cap():
    """The default space lists 1-8 rows per micro-batch (Megatron-Bridge's recipes run 8 rows of 4,096 tokens);
    prune.max_microbatch_tokens (32,768, the recipes' largest micro-batch) leaves 8 rows out at 8,192 tokens, says
    so, and a cap of 0 lifts it."""
    m, c = load_model("Qwen3-30B-A3B"), ClusterSpec.of("B200", 8)
    space = load_space(None, m)
    space.prune.keep_within = 0.0
    short = explore(space, m, Workload(seq_len=4096, global_batch=512), c)
    assert (short.table.max_tokens * short.table.cp == 8 * 4096).any()
    assert not any("micro-batch" in n for n in short.notes)
    long = explore(space, m, Workload(seq_len=8192, global_batch=512), c)
    assert (long.table.max_tokens * long.table.cp).max() == 4 * 8192
    assert any(n.startswith("rows per micro-batch 8 not tried: at 8,192-token rows") for n in long.notes)
    space.prune.max_microbatch_tokens = 0
    uncapped = explore(space, m, Workload(seq_len=8192, global_batch=512), c)
    assert uncapped.funnel[0][1] > long.funnel[0][1] and not any("micro-batch" in n for n in uncapped.notes)


def test_a_default_global_batch_no_dp_divides_becomes_one_that_does_with_a_note(capsys, tmp_path):
    """40 GPUs leave no DP that 128 rows divide over (the test above). Without --global-batch, `space` and `search`
    take the batch that message suggests first (10 x 16 = 160) and say so; a batch the user gave stays an error."""
    from autotune.cli.main import main

    base = ["--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "40"]
    rc, out, line = _run_cli(capsys, *base, "--top", "1", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["top"] and doc["workload"]["global_batch"] == 160, line
    note = next(n for n in doc["notes"] if n.startswith("--global-batch 160 by default"))
    assert "the default 128 rows divide over none of the data-parallel sizes 40 GPUs leave (the smallest is 10); " \
           "160 = 10 x 16 rows do" in note
    capsys.readouterr()
    rc = main(["search", *base, "--trials", "1", "--runs-dir", str(tmp_path), "--study", "b", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["best"] and any(n.startswith("--global-batch 160 by default") for n in out["notes"])
    assert [d.name for d in tmp_path.iterdir()] == ["b"]  # the first, failed start left nothing behind
    # (--global-batch 128 given on 40 GPUs stays an error: the test above)


def test_fewer_gpus_than_the_spaces_smallest_product_asks_for_more_gpus(capsys):
    """Qwen3.5-122B-A10B's space starts EP at 4: on 2 GPUs no layout is legal, and the way out is at least 4 GPUs (or a
    space whose lists start lower), not 'a power of 2' (2 is one)."""
    rc, _, line = _run_cli(capsys, "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "2")
    assert rc == 2 and "illegal: world_ep" in line, line
    assert "smallest EP x ETP x PP is 4 (its lists start at EP 4, ETP 1, PP 1), more than 2 GPUs: use at least 4 GPUs" in line
    assert "power of 2" not in line
