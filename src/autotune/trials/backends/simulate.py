"""The simulator backend: the cost model's prediction returned as a trial result, marked `predicted`.

It writes the trial folder exactly as a real backend does (trial_result.json, steps.jsonl, a log), so
everything downstream (study, dashboard, recipes) runs unchanged without a cluster. `delay_s` makes each
simulated trial take that long (for demos and for testing resume after a kill mid-trial).
"""

from __future__ import annotations

import time
from dataclasses import fields
from pathlib import Path

from ...catalog import Workload, load_model
from ...layout import Layout, LayoutTable
from ..prediction import prediction_of
from ..spec import TRIAL_STARTUP_S, StepRecord, TrialResult, TrialSpec, write_json_atomic
from .base import Backend, Handle

__all__ = ["SimulateBackend"]


class SimulateBackend(Backend):
    name = "simulate"
    measured = False

    def __init__(self, delay_s: float = 0.0, startup_s: float = TRIAL_STARTUP_S):
        self.delay_s = delay_s
        self.startup_s = startup_s  # scheduler admission, image pull, checkpoint load: counted in GPU-hours
        self._live: list[Handle] = []  # submitted, not finished (closing cancels them, as a real backend's)

    def submit(self, spec: TrialSpec, trial_dir: Path) -> Handle:
        handle = Handle(spec, trial_dir, token={"started": time.monotonic(), "result": None})
        self._live.append(handle)
        return handle

    def poll(self, handle: Handle) -> TrialResult | None:
        if handle.token["result"] is not None:
            return handle.token["result"]
        if time.monotonic() - handle.token["started"] < self.delay_s:
            return None
        return self._finish(handle, self._simulate(handle.spec))

    def _finish(self, handle: Handle, result: TrialResult) -> TrialResult:
        d = handle.trial_dir
        (d / "logs").mkdir(parents=True, exist_ok=True)
        with open(d / "steps.jsonl", "w") as fh:
            for s in result.steps:
                fh.write(s.model_dump_json() + "\n")
        (d / "logs" / "simulate.log").write_text(
            f"simulated trial {handle.spec.number}: cost-model prediction, no training step was run\n")
        write_json_atomic(d / "trial_result.json", result)
        handle.token["result"] = result
        if handle in self._live:
            self._live.remove(handle)
        return result

    def cancel(self, handle: Handle) -> None:
        if handle.token["result"] is None:
            self._finish(handle, TrialResult(study=handle.spec.study, number=handle.spec.number, status="crash",
                                             source="predicted", backend=self.name, reason="cancelled",
                                             cancelled=True))

    def close(self) -> None:
        """The driver is leaving (an interrupt, SIGTERM): trials still 'running' end as cancelled."""
        for handle in list(self._live):
            self.cancel(handle)

    def _simulate(self, spec: TrialSpec) -> TrialResult:
        from ...cost import evaluate

        model = load_model(spec.model)
        names = {f.name for f in fields(Workload)}
        wl = {k: (tuple(v) if k == "window" else v) for k, v in spec.workload.items() if k in names}
        workload = Workload(**wl)
        cluster = spec.cluster()
        lay = Layout.from_dict(spec.layout)
        ev = evaluate(model, workload, cluster, LayoutTable.from_layouts([lay]))
        peak = int(ev.memory.peak[0])
        common = dict(study=spec.study, number=spec.number, source="predicted", backend=self.name,
                      peak_memory_bytes=peak, window=workload.window,
                      prediction=prediction_of(ev, 0, model, cluster))
        oom = ev.memory.oom_reason(0)
        if oom:
            return TrialResult(status="oom", reason=oom, **common)
        step = float(ev.time.step_time[0])
        steps = [StepRecord(step=i, time_s=step, tokens=workload.tokens_per_step, peak_memory_bytes=[peak])
                 for i in range(spec.steps)]
        gpu_h = (step * spec.steps + self.startup_s) * spec.count / 3600.0
        return TrialResult(status="ok", tokens_per_s_per_gpu=float(ev.time.tokens_per_s_per_gpu[0]),
                           step_time_s=step, step_time_cv_percent=0.0, steps=steps, gpu_hours=gpu_h,
                           wall_s=0.0, stack={"simulator": "autotune cost model"},
                           reason="cost-model prediction; no training step was run", **common)
