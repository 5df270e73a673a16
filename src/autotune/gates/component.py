"""The component gate: one MoE layer with a candidate dispatcher against an FP32 reference.

`run_component(spec)` starts `spec.ep` ranks of `python -m autotune.runner.component` (gloo on CPU,
NCCL where CUDA is), each in one process group that a timeout kills whole, and reads rank 0's JSON.
`judge(numbers)` decides, with no torch: pass when routing is identical to the default dispatcher's,
the candidate's worst relative L2 error (output, input gradient) is within 2 x the default's error +
1e-3 for each tensor, the rerun is bitwise identical, and each negative control (a perturbed expert
weight, a dropped token) fails that same test. Flex (DeepEP) runs only where deep_ep imports and CUDA
exists; elsewhere the gate is `not_run` with the reason.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import BadInput
from ..layout.core import DISPATCHERS, FLEX_DISPATCHERS
from ..trials.plan import flex_backend_missing
from .result import GateResult

__all__ = ["ComponentSpec", "run_component", "judge", "component_gate", "flex_blocker", "component_test_entry"]

CONTROLS = ("perturbed_weight", "dropped_token")
TENSORS = (("output", "output_error"), ("input gradient", "input_grad_error"))


@dataclass(frozen=True)
class ComponentSpec:
    """What to test: the reduced CPU shape by default (the seed's is hidden 3072, 256 experts, top-8, FFN 1024)."""

    dispatcher: str = "allgather"
    reference_dispatcher: str = "alltoall"
    hidden: int = 128
    experts: int = 8
    topk: int = 2
    ffn: int = 64
    tokens: int = 256  # per rank
    ep: int = 2
    dtype: str = "bf16"
    seed: int = 1234
    timeout_s: float = 300.0

    def __post_init__(self):
        for d in (self.dispatcher, self.reference_dispatcher):
            if d not in DISPATCHERS:
                raise BadInput(f"dispatcher {d!r}: choose one of {', '.join(DISPATCHERS)}")
        if self.ep < 1 or self.experts % self.ep:
            ok = ", ".join(str(d) for d in range(1, self.experts + 1) if self.experts % d == 0)
            raise BadInput(f"--ep {self.ep}: give a rank count that divides the {self.experts} experts ({ok})")
        if not 1 <= self.topk <= self.experts:
            raise BadInput(f"top-k {self.topk}: must be between 1 and the {self.experts} experts")

    def shape_text(self) -> str:
        seed = (self.hidden, self.experts, self.topk, self.ffn) == (3072, 256, 8, 1024)
        what = "one Qwen3.5-122B-A10B MoE layer" if seed else "one MoE layer (reduced shape)"
        return (f"{what}: hidden {self.hidden}, {self.experts} experts, top-{self.topk}, expert FFN "
                f"{self.ffn}, EP {self.ep}, ETP 1, TP 1; {self.tokens:,} tokens per rank; {self.dtype}")

    def argv(self, out: Path) -> list[str]:
        return ["--dispatcher", self.dispatcher, "--reference-dispatcher", self.reference_dispatcher,
                "--hidden", str(self.hidden), "--experts", str(self.experts), "--topk", str(self.topk),
                "--ffn", str(self.ffn), "--tokens", str(self.tokens), "--ep", str(self.ep), "--dtype", self.dtype,
                "--seed", str(self.seed), "--timeout", str(self.timeout_s), "--out", str(out)]


def flex_blocker(cuda: bool | None = None, dispatcher: str = "flex") -> str | None:
    """Why the flex dispatcher on `dispatcher`'s backend (flex: DeepEP, hybridep: HybridEP) cannot run here, or None
    (always None for alltoall and allgather, which run anywhere)."""
    if dispatcher not in FLEX_DISPATCHERS:
        return None
    why = flex_backend_missing(dispatcher)
    if why:
        return f"{why}; run bench/component_gpu.py on a GPU node with it"
    if cuda is False:
        return f"the {dispatcher} dispatcher needs CUDA GPUs"
    return None


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_component(spec: ComponentSpec, python: str = sys.executable, work_dir: Path | None = None) -> dict:
    """Run the component test's ranks; returns rank 0's numbers. RuntimeError (with the log tail) on failure."""
    with tempfile.TemporaryDirectory(prefix="autotune-component-", dir=work_dir) as tmp:
        out = Path(tmp) / "component.json"
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port()), "WORLD_SIZE": str(spec.ep),
               "LOCAL_WORLD_SIZE": str(spec.ep), "PYTHONUNBUFFERED": "1"}
        logs = [open(Path(tmp) / f"rank{r}.log", "w+") for r in range(spec.ep)]
        procs: list[subprocess.Popen] = []
        try:
            for r in range(spec.ep):
                procs.append(subprocess.Popen(
                    [python, "-m", "autotune.runner.component", *spec.argv(out)],
                    env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=logs[r], stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    # rank 0 leads a new process group the others join: a timeout kills every rank at once
                    process_group=0 if r == 0 else procs[0].pid))
            codes = [p.wait(timeout=spec.timeout_s + 60) for p in procs]
        except subprocess.TimeoutExpired:
            codes = None
        finally:
            if procs and any(p.poll() is None for p in procs):
                try:
                    os.killpg(procs[0].pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                for p in procs:
                    p.wait()
        tails = []
        for fh in logs:
            fh.seek(0)
            tails.append(fh.read()[-2000:])
            fh.close()
        if codes is None:
            raise RuntimeError(f"the component test timed out after {spec.timeout_s + 60:.0f} s")
        if any(codes) or not out.exists():
            bad = next((i for i, c in enumerate(codes) if c), 0)
            last = [ln for ln in tails[bad].splitlines() if ln.strip() and "warn" not in ln.lower()][-3:]
            raise RuntimeError(f"rank {bad} exited {codes[bad]}: " + " | ".join(last))
        return json.loads(out.read_text())


def _within(run: dict, default: dict) -> tuple[bool, list[dict]]:
    rows = []
    for name, key in TENSORS:
        bound = 2 * default[key] + 1e-3
        rows.append({"tensor": name, "error": run[key], "bound": bound, "ratio": run[key] / bound})
    ok = all(r["error"] <= r["bound"] for r in rows) and run["routing_mismatch_vs_default"] == 0
    return ok, rows


def judge(numbers: dict) -> tuple[str, str, dict]:
    """(status, one-line detail, details) from the runner's numbers."""
    runs = numbers["runs"]
    default, cand = runs["default"], runs["candidate"]
    ok, rows = _within(cand, default)
    worst = max(rows, key=lambda r: r["ratio"])
    routing = cand["routing_mismatch_vs_default"] == 0
    controls = {c: not _within(runs[c], default)[0] for c in CONTROLS}  # True: the control failed, as it must
    rerun = bool(numbers["rerun_bitwise_identical"])
    passed = ok and routing and rerun and all(controls.values())
    text = (("routing identical" if routing else f"routing differs on {cand['routing_mismatch_vs_default']} tokens")
            + f"; worst tensor ({worst['tensor']}) relative L2 error {worst['error']:.3g} against a bound of "
            f"{worst['bound']:.3g} (2 x the {numbers['reference_dispatcher']} dispatcher's error + 1e-3); "
            + ("the rerun is bitwise identical" if rerun else "the rerun differs")
            + (" and the negative controls fail" if all(controls.values()) else
               "; negative control(s) not detected: " + ", ".join(c for c, f in controls.items() if not f)))
    details = {"tensors": rows, "routing_identical": routing, "rerun_bitwise_identical": rerun,
               "controls_failed": controls, "numbers": numbers}
    return ("pass" if passed else "fail"), text, details


def component_gate(spec: ComponentSpec, *, cuda: bool | None = None, run=run_component) -> GateResult:
    """Run (or explain why it cannot run) and judge one component test."""
    name = f"{spec.dispatcher} dispatcher against an FP32 reference"
    base = {"spec": asdict(spec), "test": name, "shape": spec.shape_text()}
    for d in (spec.dispatcher, spec.reference_dispatcher):
        why = flex_blocker(cuda, d)
        if why:
            return GateResult(gate="component", status="not_run", summary=f"not run: {why}", details=base)
    if spec.ep < 2:
        return GateResult(gate="component", status="not_run", details=base,
                          summary="not run: EP 1 moves no tokens between ranks; test a dispatcher at EP >= 2")
    try:
        numbers = run(spec)
    except RuntimeError as exc:
        return GateResult(gate="component", status="fail", details={**base, "error": str(exc)},
                          summary=f"fail: the component run did not finish: {exc}")
    status, text, details = judge(numbers)
    return GateResult(gate="component", status=status, summary=f"{status}: {text}", details={**base, **details})


def component_test_entry(result: GateResult, gpu: str | None = None, date: str | None = None) -> dict:
    """The recipe's `component_tests` entry (sections.ComponentTest) for a component GateResult that ran."""
    d = result.details
    return {"test": d["test"], "shape": d["shape"], "gpu": gpu or d.get("numbers", {}).get("device", "cpu"),
            "date": date or _dt.date.today().isoformat(), "result": result.status,
            "detail": result.summary.split(": ", 1)[-1]}
