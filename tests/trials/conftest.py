"""Shared fixtures for trial-backend tests: a small real trial spec, a /proc scan, a trial directory.

Each Ray test module starts one Ray for the whole module (5-10 s on 2 cores) in a module-scoped
fixture and shuts it down at the end, so no test pays for its own cluster.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from autotune.catalog import Workload
from autotune.layout import Layout
from autotune.trials.spec import TrialSpec


def tiny_spec(number: int = 0, *, steps: int = 6, timeout_s: float = 120.0, **over) -> TrialSpec:
    """A real tiny-moe trial on 2 CPU ranks: EP2, DP2, a window of steps 2..5."""
    workload = dataclasses.asdict(Workload(seq_len=128, global_batch=4, steps=steps, window=(2, 5)))
    layout = Layout(world=2, ep=2, micro_batch_size=1, distributed_optimizer=False).to_dict()
    fields = dict(study="t", number=number, model="tiny-moe", gpu="cpu", count=2, gpus_per_node=2,
                  layout=layout, workload=workload, steps=steps, warmup_steps=2, timeout_s=timeout_s)
    fields.update(over)
    return TrialSpec(**fields)


def procs_mentioning(marker: str | Path, environ: bool = False) -> list[int]:
    """Pids of live processes whose command line (or, with environ, environment) mentions `marker`
    (no psutil: a /proc scan)."""
    needle = str(marker).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            if environ:
                cmd += (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmd and state != "Z":  # a zombie is already dead, only not yet reaped
            found.append(int(entry.name))
    return sorted(found)


@pytest.fixture
def tmp_trial(tmp_path: Path) -> Path:
    """A trial directory, as the search driver lays it out: runs/<study>/trials/<n>/."""
    d = tmp_path / "trials" / "0"
    d.mkdir(parents=True)
    return d


@pytest.fixture
def make_spec():
    """`make_spec(number, steps=..., timeout_s=..., **fields)`: a tiny-moe TrialSpec (see tiny_spec)."""
    return tiny_spec


@pytest.fixture
def proc_scan():
    """`proc_scan(marker, environ=False)`: pids of live processes mentioning marker."""
    return procs_mentioning
