"""TrialSpec and TrialResult: the plain JSON files in runs/<study>/trials/<n>/.

They cross process and machine boundaries (driver -> backend -> runner -> driver), so they are pydantic
models validated on read. A failed trial is a result with a failure class, not an exception: an OOM
teaches the search where the memory wall is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..catalog.hardware import MAX_GPUS, ClusterSpec, GpuSpec, get_gpu
from ..errors import ConfigError
from ..fsutil import write_text_atomic

__all__ = ["EarlyStop", "TrialSpec", "TrialResult", "StepRecord", "Prediction", "FailureClass", "write_json_atomic", "read_model",
           "TRIAL_STARTUP_S"]

# Seconds a trial spends outside its timed steps (launch, model build, checkpoint-free warm-up), from the
# seed page: 8.96 GPU-hours per 20-step trial on 32 H200 is 1,008 s per trial, of which 20 steps of the
# 2,451 tokens/s/GPU layout (8,192 x 128 tokens per step) are 267 s. The planner prices trials with it and the
# simulator charges it, so a trial's predicted GPU-hours and the ones it is charged agree.
TRIAL_STARTUP_S = 8.96 * 3600 / 32 - 20 * 8192 * 128 / (2451.4 * 32)

FailureClass = Literal["ok", "oom", "timeout", "nccl", "nan", "crash", "infra"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Prediction(_Strict):
    """The cost model's prediction for one layout, as named breakdowns (what the dashboard and the LLM
    planner read). Written into TrialSpec at dispatch and, by the simulator, into its TrialResult."""

    tokens_per_s_per_gpu: float  # calibrated model, corrected by what the trials taught (the ranking value)
    peak_bytes: float  # predicted peak GPU memory, the most loaded pipeline stage
    model_tokens_per_s_per_gpu: float | None = None  # the calibrated cost model alone
    uncertainty: float | None = None  # relative standard deviation the planner used
    step_time_s: float | None = None
    mfu: float | None = None
    usd_per_million_tokens: float | None = None
    capacity_bytes: float | None = None  # usable HBM per GPU
    host_bytes: float | None = None  # host memory per node for an offloaded optimizer
    memory_terms: dict[str, list[float]] = Field(default_factory=dict)  # term -> bytes on each pipeline stage
    time_terms: dict[str, float] = Field(default_factory=dict)  # step-time term -> seconds per step


class DataSpec(_Strict):
    kind: Literal["synthetic", "pretokenized"] = "synthetic"
    path: str | None = None  # a .npy / .bin of token ids for "pretokenized"


class EarlyStop(_Strict):
    """When a trial may end before `steps` (runner/loop.py: steady_window, clearly_losing). `steps` stays the
    cap. Steady: after at least `window` scored steps, the mean step time over every scored step so far is,
    with 95% confidence, within +-accuracy_percent of the mean the full trial would score (reference "window":
    Student t x CV / sqrt(n) x sqrt(1 - n / N), N the full trial's scored steps), or of the true mean
    (reference "mean": no finite-population factor), so the trial's tokens/s is known to that accuracy. Losing:
    after min_steps scored steps, the trial beats incumbent_tokens_per_s_per_gpu with probability below
    1 - confidence."""

    accuracy_percent: float = Field(default=1.0, gt=0, le=100)
    reference: Literal["window", "mean"] = "window"
    window: int = Field(default=3, ge=2, le=10_000)  # scored steps before the steady rule may fire
    min_steps: int = Field(default=3, ge=2)  # scored steps before the losing rule may fire
    incumbent_tokens_per_s_per_gpu: float | None = Field(default=None, gt=0)
    confidence: float = Field(default=0.99, gt=0.5, lt=1)

    def cap(self, steps: int) -> int | None:
        """The step cap the steady rule measures a trial's mean against (reference "window": the full trial of
        `steps`), or None (reference "mean": the true mean): runner/loop.steady_window's `cap`."""
        return steps if self.reference == "window" else None


class TrialSpec(_Strict):
    """Everything a backend needs to run one trial; written as trial_spec.json before dispatch.
    Numbers are range-checked (finite, positive where they must be, bounded far above real use)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    schema_version: Literal[1] = 1
    study: str = Field(min_length=1, max_length=200)
    number: int = Field(ge=0, le=10**9)
    model: str = Field(min_length=1, max_length=4096)  # catalog name or config.json path
    gpu: str = Field(min_length=1, max_length=100)
    # the whole GPU when its name does not stand for it (a user's --gpu FILE: the file may not exist where the trial
    # runs, and the name alone would be looked up in the catalog); its fields and types checked, as GpuSpec's
    gpu_spec: GpuSpec | None = None
    count: int = Field(gt=0, le=MAX_GPUS)  # world size
    gpus_per_node: int = Field(gt=0, le=1024)
    layout: dict  # Layout.to_dict()
    workload: dict  # Workload fields
    steps: int = Field(default=20, gt=0, le=10_000_000)
    warmup_steps: int = Field(default=5, ge=0)  # steps before the scoring window
    seed: int = Field(default=1234, ge=0, le=2**32 - 1)
    data: DataSpec = Field(default_factory=DataSpec)
    proxy: dict | None = None  # how the model was shrunk for the trial, if at all
    timeout_s: float = Field(default=3600.0, gt=0, le=30 * 86400)
    command: list[str] | None = None  # the exact command a backend ran (filled in by the backend)
    env: dict[str, str] = Field(default_factory=dict)
    predicted: Prediction | None = None  # the cost model's prediction at dispatch
    early_stop: EarlyStop | None = None  # end the trial once steady, or once clearly losing (None: run all steps)

    def gpu_of(self) -> GpuSpec:
        """The trial's GpuSpec: the carried one, else the catalog's."""
        return self.gpu_spec or get_gpu(self.gpu)

    def cluster(self, **kw) -> ClusterSpec:
        """The trial's ClusterSpec (`kw`: ClusterSpec.of's software flags)."""
        return ClusterSpec.of(self.gpu_of(), self.count, self.gpus_per_node, **kw)


class StepRecord(_Strict):
    step: int
    time_s: float
    tokens: int
    lm_loss: float | None = None
    grad_norm: float | None = None
    peak_memory_bytes: list[int] = Field(default_factory=list)  # per rank


class TrialResult(_Strict):
    """What came back. `source` says whether it was measured or predicted by the simulator."""

    schema_version: Literal[1] = 1
    study: str
    number: int
    status: FailureClass
    source: Literal["measured", "predicted"] = "measured"
    backend: str = ""
    tokens_per_s_per_gpu: float | None = None
    step_time_s: float | None = None
    step_time_cv_percent: float | None = None
    peak_memory_bytes: int | None = None  # max over ranks
    window: tuple[int, int] | None = None
    steps: list[StepRecord] = Field(default_factory=list)
    stack: dict[str, str] = Field(default_factory=dict)
    proxy: dict | None = None
    reason: str | None = None  # one line: why it failed, or notes (e.g. "standard attention: GDN unsupported on CPU")
    prediction: Prediction | None = None  # the simulator's result: the breakdown behind its number
    log_tail: str | None = None
    wall_s: float | None = None
    gpu_hours: float | None = None
    attempts: int = 1
    stopped_early: str | None = None  # why the trial ended before its step cap ("steady: ...", "losing: ...")
    # stopped by the search driver (an interrupt, SIGTERM), not by the layout: a resumed study runs it again
    cancelled: bool = False

    def charged_gpu_hours(self, count: int) -> float:
        """The GPU-hours the search charges the trial: its own, else its wall time x `count` ranks (a CPU trial
        reports none of its own)."""
        return self.gpu_hours or (self.wall_s or 0.0) * count / 3600.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def stderr(self) -> float | None:
        """The relative standard error of the measured tokens/s: the step-time CV over the scored window / sqrt(its
        steps) (None for a prediction, or with no window). Steps that drift together make it an underestimate; the
        search takes the larger of it and the run-to-run noise (search/residual.ResidualModel.fit_rows)."""
        if self.source != "measured" or self.step_time_cv_percent is None or self.window is None:
            return None
        lo, hi = self.window
        n = sum(lo <= r.step <= hi for r in self.steps) or hi - lo + 1
        return self.step_time_cv_percent / 100.0 / max(n, 1) ** 0.5


def write_json_atomic(path: Path, data: dict | BaseModel) -> None:
    """Write JSON atomically (see autotune.fsutil)."""
    text = data.model_dump_json(indent=2) if isinstance(data, BaseModel) else json.dumps(data, indent=2)
    write_text_atomic(path, text + "\n")


def read_model(cls: type[BaseModel], path: Path):
    """Load and validate a JSON file as `cls`; one-line ConfigError on any problem."""
    try:
        return cls.model_validate_json(Path(path).read_bytes())
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory; give a {cls.__name__} JSON file") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        raise ConfigError(f"{path}: field {loc}: {err['msg']} ({len(exc.errors())} error(s)); fix the file") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read; fix the file") from None
