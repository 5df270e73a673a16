"""The search's live view: plain lines when the console is not a terminal (CI logs), a rich panel when it is."""

import io

import pytest

from rich.console import Console

from autotune.report.live import LiveView

GiB = 1024**3


def _events(view: LiveView) -> None:
    with view:
        view.on_event("dispatched", {"number": 0, "layout": "TP1 PP4 EP8 DP8", "predicted": 2500.0,
                                     "why": "the best optimistic score among 40 untried"})
        view.on_event("screened", {"number": 1, "layout": "TP1 PP1 EP8 DP32", "reason": "predicted OOM: 190.2 GiB > 139.8"})
        view.on_event("finished", {"number": 0, "layout": "TP1 PP4 EP8 DP8", "status": "ok", "value": 2400.0,
                                   "predicted": 2500.0, "source": "measured", "peak_memory_bytes": 120 * GiB,
                                   "gpu_hours": 3.0, "wall_s": 42.0})
        view.on_event("dispatched", {"number": 2, "layout": "TP2 PP2 EP8 DP8", "predicted": {"tokens_per_s_per_gpu": 2600.0},
                                     "why": "predicted 2,600 tokens/s/GPU (+/-10%)", "settings": "no recompute, flex"})
        view.on_event("finished", {"number": 2, "layout": "TP2 PP2 EP8 DP8", "status": "oom", "value": None,
                                   "predicted": 2600.0, "source": "measured", "reason": "CUDA out of memory",
                                   "gpu_hours": 1.5})
        view.on_event("done", {"stop_reason": "trial budget reached (2 trials)"})


def test_plain_lines_when_not_a_terminal():
    buf = io.StringIO()
    view = LiveView("searching Qwen3.5-122B-A10B on 32 x H200", 2, 10.0, True, Console(file=buf, width=100),
                    mfu_per_tps=5e-5)
    assert view.live is None
    _events(view)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "trial 0 dispatched: TP1 PP4 EP8 DP8, predicted 2,500.0 tokens/s/GPU (the best optimistic score among 40 untried)"
    assert lines[1] == "trial 1 screened: TP1 PP1 EP8 DP32: predicted OOM: 190.2 GiB > 139.8"
    assert lines[2] == ("trial 0 measured: TP1 PP4 EP8 DP8 2,400.0 tokens/s/GPU (predicted 2,500.0), MFU 12.0%, peak "
                        "120.0 GiB, 42.0 s | 1/2 trials, 3.0/10 GPU-hours, best 2,400.0 (TP1 PP4 EP8 DP8, trial 0)")
    # a rationale that gives the prediction is not repeated; the settings tell two trials of one label apart
    assert lines[3] == "trial 2 dispatched: TP2 PP2 EP8 DP8 [no recompute, flex]: predicted 2,600 tokens/s/GPU (+/-10%)"
    assert lines[4].startswith("trial 2 oom: TP2 PP2 EP8 DP8 (predicted 2,600.0)") and "CUDA out of memory" in lines[4]
    assert "2/2 trials, 4.5/10 GPU-hours" in lines[4]
    assert lines[5] == "search stopped: trial budget reached (2 trials); 2/2 trials, 4.5/10 GPU-hours, best 2,400.0 (TP1 PP4 EP8 DP8, trial 0)"
    assert len(lines) == 6 and "\x1b" not in buf.getvalue()


def test_disabled_prints_nothing():
    buf = io.StringIO()
    _events(LiveView("t", 2, None, False, Console(file=buf, force_terminal=True)))
    assert buf.getvalue() == ""


def test_rich_panel_on_a_terminal():
    buf = io.StringIO()
    view = LiveView("searching X", 2, None, True, Console(file=buf, force_terminal=True, width=160))
    assert view.live is not None
    _events(view)
    text = Console(width=160, file=io.StringIO(), record=True)
    text.print(view.render())
    shown = text.export_text()
    for s in ("searching X", "2/2 (+1 screened)", "4.5 (no budget)", "best so far: TP1 PP4 EP8 DP8 2,400.0",
              "120.0", "measured", "oom", "CUDA out of memory", "screened", "42.0", "stopped: trial budget reached"):
        assert s in shown, s


def test_for_search_titles_and_computes_mfu_by_the_one_formula():
    from autotune.catalog import ClusterSpec, load_model
    from autotune.cost.flops import mfu

    m, cluster = load_model("Qwen3.5-122B-A10B"), ClusterSpec.of("H200", 32)
    buf = io.StringIO()
    view = LiveView.for_search(m, cluster, "demo", 5, None, True, Console(file=buf, width=200))
    assert view.title == "searching Qwen3.5-122B-A10B on 32 x H200 (study demo)"
    view.on_event("finished", {"number": 0, "layout": "TP1 PP4 EP8 DP8", "status": "ok", "value": 2451.44,
                               "predicted": 2500.0, "source": "measured"})
    want = float(mfu(m, 2451.44, cluster.gpu.bf16_tflops))
    assert view.rows[0].mfu == pytest.approx(want, rel=1e-12) and f"MFU {want:.1%}" in buf.getvalue() and "MFU 13.4%" in buf.getvalue()


def test_a_resumed_study_counts_its_kept_trials_and_best():
    """Progress after --resume: the kept trials count and the best may be one of them (it said 1/3 trials and a
    worse best of this run's)."""
    buf = io.StringIO()
    view = LiveView("t", 3, None, True, Console(file=buf, width=200))
    view.on_event("resumed", {"finished": 2, "gpu_hours": 14.1,
                              "best": {"number": 0, "layout": "TP2 PP4 VPP3 EP8 DP4", "value": 3406.1,
                                       "source": "predicted"}})
    assert buf.getvalue() == ""  # counted, not printed: the notes say what was resumed
    view.on_event("finished", {"number": 2, "layout": "TP2 PP4 VPP4 EP8 DP4", "status": "ok", "value": 3367.8,
                               "predicted": 3367.8, "source": "predicted", "gpu_hours": 7.1})
    assert buf.getvalue().rstrip().endswith("| 3/3 trials, 21.2 GPU-hours, best 3,406.1 (TP2 PP4 VPP3 EP8 DP4, trial 0)")


def test_the_stop_rules_chance_follows_the_progress():
    """After each trial the driver says the stop rule's number (SearchDriver.chance); the progress shows it, one decimal
    under 10%, and a converged search's last line does not repeat it."""
    buf = io.StringIO()
    view = LiveView("t", 5, None, True, Console(file=buf, width=300))
    view.on_event("finished", {"number": 0, "layout": "TP1 PP4 EP8 DP8", "status": "ok", "value": 2400.0,
                               "predicted": 2500.0, "source": "measured", "chance": 0.412, "noise": 0.02})
    view.on_event("finished", {"number": 1, "layout": "TP2 PP4 EP8 DP4", "status": "ok", "value": 2300.0,
                               "predicted": 2350.0, "source": "measured", "chance": 0.038, "noise": 0.02})
    view.on_event("done", {"stop_reason": "converged: the chance ... is 3.8%"})
    lines = buf.getvalue().splitlines()
    assert lines[0].endswith("best 2,400.0 (TP1 PP4 EP8 DP8, trial 0); 41% chance an untried layout beats it by > 2%")
    assert lines[1].endswith("; 3.8% chance an untried layout beats it by > 2%")
    assert lines[2].startswith("search stopped: converged") and "chance an untried" not in lines[2]
