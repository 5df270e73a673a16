"""Fine-tuning on packed sequences (Workload.packed_doc_len): attention runs within each document of a row."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import Calibration, evaluate
from autotune.cost._published import SQUAD_DOC_TOKENS
from autotune.cost.calibrate import predict
from autotune.cost.measurements import published_measurements
from autotune.errors import BadInput
from autotune.layout import Layout, LayoutTable


def test_attention_work_scales_with_the_document_not_the_row():
    m, t = load_model("Llama-3.1-70B"), LayoutTable.from_layouts([Layout(world=8, tp=8)])
    ev = {d: evaluate(m, Workload(seq_len=4096, global_batch=32, packed_doc_len=d), ClusterSpec.of("H100", 8), t,
                      Calibration("H100")) for d in (0, 512, 8192)}
    att = {d: e.time.mb_terms["compute_attention"][0, 0] for d, e in ev.items()}
    assert att[512] == pytest.approx(att[0] * 512 / 4096, rel=1e-9)  # every layer full causal attention
    assert att[8192] == pytest.approx(att[0])  # a document longer than the row is the row
    dense = {d: e.time.mb_terms["compute_dense"][0, 0] for d, e in ev.items()}
    assert dense[512] == pytest.approx(dense[0])
    assert ev[512].time.tokens_per_s_per_gpu[0] > ev[0].time.tokens_per_s_per_gpu[0]


def test_sliding_windows_are_capped_by_the_document_too():
    m, t = load_model("gpt-oss-120b"), LayoutTable.from_layouts([Layout(world=8, ep=8)])
    w = m.sliding_window
    ev = {d: evaluate(m, Workload(seq_len=4096, global_batch=32, packed_doc_len=d), ClusterSpec.of("H100", 8), t,
                      Calibration("H100")).time.mb_terms["compute_attention"][0, 0] for d in (0, 2 * w, w)}
    assert ev[w] < ev[2 * w] < ev[0]


def test_megatron_bridge_fine_tuning_rows_are_read_as_packed_squad():
    kept, _ = published_measurements()
    tuned = [m for m in kept if m.packed_doc_len]
    assert len(tuned) >= 10 and all(m.source.startswith("Megatron-Bridge perf") for m in tuned)
    assert {m.lora for m in tuned} == {True, False}  # the LoRA and the SFT rows
    assert all(m.packed_doc_len == SQUAD_DOC_TOKENS and m.workload.attention_span == SQUAD_DOC_TOKENS for m in tuned)
    assert not any(m.packed_doc_len for m in kept if "Megatron-Bridge" not in m.source)
    # the reading's one number matters little: half or twice the length moves no prediction by 1%
    for m in tuned:
        at = {d: predict([replace(m, packed_doc_len=d)], Calibration(m.gpu))[0] for d in (128, 256, 512)}
        assert abs(at[128] / at[256] - 1) < 0.01 and abs(at[512] / at[256] - 1) < 0.01


def test_bad_document_length():
    with pytest.raises(BadInput, match="--packed-doc-len"):
        Workload(packed_doc_len=-1)


def test_estimate_packed_doc_len_flag(capsys):
    import json

    from autotune.cli.main import main

    argv = ["estimate", "--model", "Llama-3.1-8B", "--gpu", "H100", "--count", "8", "--layout", "TP1 PP1",
            "--seq-len", "8192", "--global-batch", "64", "--recompute", "full:uniform:1", "--json"]
    outs = {}
    for d in (0, 1024):
        assert main(argv + ["--packed-doc-len", str(d)]) == 0
        outs[d] = json.loads(capsys.readouterr().out)
    assert outs[1024]["packed_doc_len"] == 1024
    assert outs[1024]["throughput"]["tokens_per_s_per_gpu"] > outs[0]["throughput"]["tokens_per_s_per_gpu"]
    assert main(argv + ["--packed-doc-len", "-5"]) == 2
    err = capsys.readouterr().err
    assert "--packed-doc-len -5" in err and len(err.strip().splitlines()) == 1
