"""Real runs behind the gates (slow): megatron-core on CPU ranks over gloo.

Convergence: tiny-moe trials through LocalBackend (fp32 on CPU, 6 steps). TP1 vs TP2, EP1 vs EP2 and
TP1 vs PP2 VPP2 pass with a correlation above 0.9999; a doubled learning rate and rows from another data seed fail
under the fp32 profile (the one for deterministic CPU runs; Bridge's 10% pointwise tolerance is for bf16).
EP1 vs EP2 runs both arms through tests/gates/ep_runner.py (the runner with runner.component.layout_invariant_init),
because megatron's CPU initialisation builds other weights at EP2.
Component: alltoall vs allgather at EP2, the bound computed, each negative control failing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from gate_helpers import cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))
from runner_helpers import cpu_spec  # noqa: E402

from autotune.catalog import load_model  # noqa: E402
from autotune.gates.convergence import convergence_gate, read_losses  # noqa: E402
from autotune.layout import Layout  # noqa: E402
from autotune.runner.data import SyntheticRows  # noqa: E402
from autotune.trials.backends.local import LocalBackend  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _megatron():
    pytest.importorskip("megatron.core")  # here, not at import: collecting this file stays cheap

HERE = Path(__file__).resolve().parent
TP1, TP2 = Layout(world=1, micro_batch_size=1), Layout(world=2, tp=2, micro_batch_size=1)
EP2 = Layout(world=2, ep=2, micro_batch_size=1, distributed_optimizer=False)
VPP = Layout(world=2, pp=2, vpp=2, micro_batch_size=1)


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    done: dict = {}

    def get(name: str, layout: Layout, wrapped: bool = False, **fields):
        if name not in done:
            d = tmp_path_factory.mktemp(name)
            runner = "autotune.runner"
            if wrapped:
                runner = "ep_runner"
                fields["env"] = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
            backend = LocalBackend(grace_s=5.0, runner_module=runner)
            res = backend.wait(backend.submit(cpu_spec(layout, number=len(done), **fields), d))
            assert res.status == "ok", (name, res.reason, res.log_tail)
            done[name] = d / "steps.jsonl"
        return read_losses(done[name])

    return get


def _rows(tmp_path: Path, seed: int) -> Path:
    model = load_model("tiny-moe")
    src = SyntheticRows(model.vocab_size, 128, seed)
    path = tmp_path / f"rows-{seed}.npy"
    np.save(path, np.concatenate([src.rows(step, 0, 4) for step in range(6)]))  # NpyRows: row step*4 + r
    return path


def test_tp1_and_tp2_pass(trial, capsys):
    ref, tp2 = trial("tp1", TP1), trial("tp2", TP2)
    res = convergence_gate(tp2, ref, "fp32")
    assert res.status == "pass" and res.details["correlation"] > 0.9999, res.summary
    assert res.details["final_loss_difference"] < 1e-5
    assert convergence_gate(tp2, ref, "bridge").status == "pass"


def test_ep1_and_ep2_pass(trial):
    ep1, ep2 = trial("ep1_global_init", TP1, wrapped=True), trial("ep2_global_init", EP2, wrapped=True)
    res = convergence_gate(ep2, ep1, "fp32")
    assert res.status == "pass" and res.details["correlation"] > 0.9999, res.summary


def test_an_interleaved_pipeline_with_pp2_passes_against_tp1(trial):
    # PP 2 with VPP: both p2p directions go to the one peer. Batched p2p on one group paired a forward
    # activation with a backward gradient on gloo (step-0 losses of micro-batches 2 and 3 differed from
    # TP1's); the runner now overlaps p2p as megatron's training does, on two groups
    ref, vpp = trial("tp1", TP1), trial("pp2_vpp2", VPP)
    res = convergence_gate(vpp, ref, "fp32")
    assert res.status == "pass" and res.details["final_loss_difference"] < 1e-5, res.summary


def test_a_changed_learning_rate_fails(trial):
    ref = trial("tp1", TP1)
    lr = trial("tp1_lr", TP1, workload=dict(lr=2e-3, min_lr=2e-4))
    res = convergence_gate(lr, ref, "fp32")
    assert res.status == "fail" and {"pointwise", "final_loss"} <= set(res.details["failed"]), res.summary


def test_a_perturbed_data_seed_fails(trial, tmp_path_factory):
    ref = trial("tp1", TP1)
    rows = _rows(tmp_path_factory.mktemp("rows"), 4321)
    other = trial("tp1_data", TP1, data={"kind": "pretokenized", "path": str(rows)})
    res = convergence_gate(other, ref, "fp32")
    assert res.status == "fail" and "pointwise" in res.details["failed"], res.summary


def test_component_alltoall_vs_allgather_at_ep2(capsys):
    rc, out, err = cli(capsys, "check", "component", "--dispatcher", "allgather", "--reference-dispatcher", "alltoall",
                       "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["status"] == "pass", (doc["summary"], err)
    d = doc["details"]
    runs = d["numbers"]["runs"]
    assert d["routing_identical"] and d["rerun_bitwise_identical"]
    assert runs["default"]["routing_mismatch_vs_default"] == 0 and runs["candidate"]["dropped_tokens"] == 0
    for row in d["tensors"]:
        key = "output_error" if row["tensor"] == "output" else "input_grad_error"
        assert row["bound"] == pytest.approx(2 * runs["default"][key] + 1e-3)
        assert 0 < row["error"] <= row["bound"]
        # bf16 layers against the FP32 reference: a real, nonzero error, well inside the bound
        assert 1e-4 < runs["default"][key] < 0.05
    for control in ("perturbed_weight", "dropped_token"):
        assert d["controls_failed"][control]
        worst = max(runs[control]["output_error"] / (2 * runs["default"]["output_error"] + 1e-3),
                    runs[control]["input_grad_error"] / (2 * runs["default"]["input_grad_error"] + 1e-3))
        assert worst > 1.0 or runs[control]["routing_mismatch_vs_default"] > 0, control
    assert runs["dropped_token"]["dropped_tokens"] == 1
