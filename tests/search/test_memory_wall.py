"""A trial that runs out of memory teaches the search where the memory wall is (search/candidates.py learn_oom):
every candidate predicted to need as much memory is set aside, screened with the reason, and said in the notes.

The cluster is a test double (no GPU here): bench/memory_wall.py's simulator with a memory model that under-predicts
by a factor, so the layouts the cost model puts near the HBM limit run out of memory when "run"."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.layout import Layout
from autotune.search.driver import SearchConfig, SearchDriver
from autotune.search.study import StudyDir
from autotune.space import load_space

MODEL, GPU, COUNT = "Qwen3.5-122B-A10B", "H200", 32
BENCH = Path(__file__).resolve().parents[2] / "bench" / "memory_wall.py"


def _bench():
    spec = importlib.util.spec_from_file_location("memory_wall", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def TightMemory(factor: float):
    """bench/memory_wall.py's simulator whose memory runs `factor` above the model's."""
    return _bench().TightMemory(factor, ClusterSpec.of(GPU, COUNT).gpu.memory_bytes)


def _driver(tmp_path, backend, trials=12, planner="model") -> SearchDriver:
    model, w = load_model(MODEL), Workload()
    return SearchDriver(model, ClusterSpec.of(GPU, COUNT), w, load_space(None, model), backend,
                        StudyDir(tmp_path, "wall"), SearchConfig(trials=trials, planner=planner))


def test_an_oom_sets_aside_every_candidate_that_needs_as_much_memory(tmp_path):
    backend = TightMemory(1.12)
    events = []
    d = _driver(tmp_path, backend)
    d.emit = lambda kind, data: events.append((kind, data))
    out = d.run()
    ooms = [(n, p) for n, s, p, _ in backend.ran if s == "oom"]
    assert ooms, "the top predicted layouts sit near the HBM limit: 12% more memory must run one out"
    first_n, first_peak = ooms[0]
    # after the first OOM nothing predicted to need as much memory was dispatched again
    later = [p for n, s, p, _ in backend.ran if n > first_n]
    assert later and all(p < first_peak for p in later)
    # the wall is the lowest OOM'd peak, and the planners' context leaves those candidates out
    c = d.candidates
    assert c.wall is not None and abs(c.wall[0] - min(p for _, p in ooms)) < 1.0  # bytes (the simulator rounds)
    ctx = d._context()
    walled = np.array([k in ctx.walled for k in ctx.keys])
    assert walled.any() and not (ctx.untried() & walled).any()
    assert np.all(c.peak[walled] >= c.wall[0]) and np.all(c.peak[~walled] < c.wall[0])
    notes = [e[1]["text"] for e in events if e[0] == "note"]
    assert notes and f"trial {first_n} ran out of memory" in notes[0] and "set aside" in notes[0]
    assert any("ran out of memory" in n for n in out.notes)
    # the search still finds a layout that runs: the best is an ok trial below the wall
    assert out.best is not None and out.best.status == "ok"
    d.close()


def test_a_walled_candidate_is_screened_with_the_reason(tmp_path):
    backend = TightMemory(1.12)
    d = _driver(tmp_path, backend, trials=3)
    d.run()
    c = d.candidates
    assert c.wall is not None
    j = int(np.argmax(c.peak))  # the most memory-hungry candidate: above the wall
    idx, why = c.screen(c.table.row(j))
    assert idx is None and f"trial {c.wall[1]}, which ran out" in why
    below = int(np.argmin(c.peak))
    assert c.screen(c.table.row(below)) == (below, None)
    d.close()


def test_no_oom_no_wall(tmp_path):
    d = _driver(tmp_path, TightMemory(1.0), trials=3)
    out = d.run()
    assert d.candidates.wall is None and d._context().walled == set()
    assert not any("ran out of memory" in n for n in out.notes)
    d.close()


def test_a_proxy_trial_that_runs_out_sets_no_wall(tmp_path):
    # --proxy shrinks the model for the trial: its OOM says little about the full model's memory
    model, w = load_model(MODEL), Workload()
    d = SearchDriver(model, ClusterSpec.of(GPU, COUNT), w, load_space(None, model), TightMemory(1.12),
                     StudyDir(tmp_path, "wall"), SearchConfig(trials=6, planner="model", proxy=True))
    d.run()
    assert any(r.status == "oom" for r in d.records)
    assert d.candidates.wall is None
    d.close()
