"""The sections of a recipe (schema_version 1) as strict pydantic models: gpu, author, stack, workload,
layout, result, correctness, patches.

The shape follows the seed page's OpenRecipes recipes field for field. Every model forbids unknown
fields and is strict (no silent "1" -> 1 coercion), because a recipe is data crossing a boundary: a typo
must fail loudly with its field path rather than be ignored. Dates also accept ISO strings so a recipe
assembled from JSON (gate results) validates. Fields listed in `_omit_none` are optional and left out of
the dump when absent (e.g. `worst_step_tolerance_ratio`); every other nullable field is always written,
as `null`, because the seed writes it (`mfu_note`, `layer_split`, `offload`).

The top-level `Recipe` and the schema generator are in `schema.py`; derived-number checks in `checks.py`.
"""

from __future__ import annotations

import datetime as _dt
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

__all__ = [
    "Section", "Gpu", "Author", "Stack", "Build", "Dataset", "WorkloadSection", "RecomputeSection", "Offload",
    "LayoutSection", "ActiveParams", "Result", "ComponentTest", "Convergence", "Correctness", "Patch",
    "Date", "SHA256",
]

# A date written unquoted in YAML (2026-10-13); an ISO string is accepted too (JSON has no date type).
Date = Annotated[_dt.date, Field(strict=False)]
SHA256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Outcome = Literal["pass", "fail"]
GateOutcome = Literal["pass", "fail", "not run"]


class Section(BaseModel):
    """Base of every recipe model: strict, closed, and dumped in field order."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)
    _omit_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_absent_optionals(self, handler):
        data = handler(self)
        for key in self._omit_none:
            if key in data and data[key] is None:
                del data[key]
        return data


class Gpu(Section):
    """The hardware the numbers were measured (or predicted) on."""

    type: str = Field(min_length=1, description="GPU kind as the catalog names it (H100, H200, B200); `autotune gpus` lists them.")
    memory_gb: int = Field(gt=0, description="Device memory in GB as the vendor prints it (H200: 141).")
    count: int = Field(gt=0, description="GPUs in the run: the world size.")
    per_node: int = Field(gt=0, description="GPUs per node.")
    instance: str = Field(description="Instance type or machine, e.g. AWS p5en.48xlarge.")


class Author(Section):
    """Who measured the recipe and how to cite them."""

    _omit_none = frozenset({"url"})
    name: str = Field(min_length=1, description="Author or tool name as the leaderboard prints it (e.g. ATTUNE).")
    url: str | None = Field(None, description="Where to cite or reach the author (paper, repository); optional.")


class Stack(Section):
    """The software the run used; free text so a version can carry its provenance."""

    _omit_none = frozenset({"transformer_engine", "cuda", "nccl", "deepep", "network", "source"})
    framework: str = Field(description="Training framework and version, e.g. slime 0.3.0 with its commit.")
    megatron_lm: str = Field(description="Megatron-LM commit / megatron-core version, with any backported fixes.")
    transformer_engine: str | None = Field(None, description="Transformer Engine version; omitted when not installed.")
    pytorch: str = Field(description="PyTorch version and build.")
    cuda: str | None = Field(None, description="CUDA version (a string: '12.9'); omitted on CPU.")
    nccl: str | None = Field(None, description="NCCL version and where it was read from.")
    deepep: str | None = Field(None, description="DeepEP version (needed by the flex and hybridep dispatchers); omitted when absent.")
    python: str = Field(description="Python version (a string: '3.12').")
    network: str | None = Field(None, description="Interconnect: GPUs per node, fabric, bandwidth per node.")
    source: str | None = Field(None, description="How the versions above were collected.")


class Build(Section):
    """How the dataset's fixed-length token rows were built from the source data."""

    name: str = Field(description="Name of the row build, e.g. qwen35-tulu3-fixed8192-v1.")
    tokenizer: str = Field(description="Tokenizer used, with its tokenizer.json hash.")
    loss_mask: str = Field(description="Loss-mask rule (slime --loss-mask-type), e.g. qwen3_5.")
    rows: int = Field(ge=1, description="Number of rows built.")
    row_tokens: int = Field(gt=0, description="Tokens per row; equals workload.row_tokens.")
    padding_tokens: int = Field(ge=0, description="Padding tokens across all rows (0: rows are packed full).")
    seed: int = Field(description="Seed of the permutation used for packing.")
    packing: str = Field(description="How conversations were packed into rows.")
    supervised_token_ratio: float = Field(gt=0, le=1, description="Fraction of tokens that carry a loss target.")
    parquet_sha256: SHA256 = Field(description="SHA-256 of the built parquet file (64 lowercase hex digits).")
    parquet_bytes: int = Field(gt=0, description="Size of the built parquet file in bytes.")
    builder: str = Field(description="Script that builds the rows, and its documentation.")


class Dataset(Section):
    """The published rows the throughput was measured on."""

    name: str = Field(description="Dataset name, e.g. Tulu 3 SFT mixture.")
    source: str = Field(description="Where it comes from, e.g. a Hugging Face dataset id.")
    revision: str = Field(description="Source revision (commit) used.")
    license: str = Field(description="Dataset license.")
    rows_sha256: SHA256 = Field(description="SHA-256 over the built rows (64 lowercase hex digits).")
    build: Build = Field(description="How the rows were built.")


class WorkloadSection(Section):
    """What is trained, independent of the layout."""

    row_tokens: int = Field(gt=0, description="Tokens per row (sequence length).")
    rows: str = Field(description="What a row is, e.g. SFT conversations.")
    global_batch: int = Field(gt=0, description="Rows per optimizer step.")
    precision: Literal["bf16", "fp8", "fp4", "fp16", "fp32"] = Field(
        description="Training precision: the format of the linears' GEMMs (fp8 and fp4 train in BF16 around them); "
        "which FP8 or FP4 recipe (delayed, tensorwise, blockwise, mxfp8; nvfp4) is the run block's --fp8-recipe or "
        "--fp4-recipe.")
    dataset: Dataset | None = Field(
        description="The published rows measured on; null when no published rows were read (a prediction, or "
        "autotune's synthetic proxy rows)."
    )


class RecomputeSection(Section):
    """Activation recomputation, as Megatron's --recompute-* arguments."""

    _omit_none = frozenset({"modules"})
    granularity: Literal["none", "selective", "full"] = Field(description="--recompute-granularity (none: no recompute).")
    method: Literal["uniform", "block"] | None = Field(description="--recompute-method for full recompute; null otherwise.")
    num_layers: int | None = Field(
        ge=1, description="--recompute-num-layers for full recompute (layers per chunk, or first N for block); null otherwise."
    )
    modules: list[str] | None = Field(None, description="--recompute-modules for selective recompute; optional.")

    @model_validator(mode="after")
    def _full_needs_method(self):
        if self.granularity == "full" and (self.method is None or self.num_layers is None):
            raise ValueError("full recompute needs method (uniform|block) and num_layers >= 1")
        if self.granularity != "full" and (self.method is not None or self.num_layers is not None):
            raise ValueError(f"method and num_layers apply to full recompute only; set them null for {self.granularity}")
        return self


class Offload(Section):
    """What is kept in host memory instead of on the GPU."""

    optimizer_fraction: float = Field(gt=0, le=1, description="Fraction of optimizer state offloaded to the host.")


class LayoutSection(Section):
    """The parallel layout. `label`, `dp` and `rows_per_microbatch` are derived and checked against the degrees."""

    label: str = Field(description="Short label from the degrees, e.g. 'TP1 PP4 EP8 DP8' (derived; checked).")
    summary: str = Field(description="One-line description of the layout and its options, in the seed's words.")
    highlights: str = Field(description="What sets this recipe apart, as the leaderboard prints it.")
    tp: int = Field(ge=1, description="Tensor-parallel size.")
    pp: int = Field(ge=1, description="Pipeline-parallel size.")
    vpp: int = Field(ge=1, description="Virtual pipeline stages per pipeline rank (1: no interleaving).")
    cp: int = Field(ge=1, description="Context-parallel size.")
    ep: int = Field(ge=1, description="Expert-parallel size.")
    etp: int = Field(ge=1, description="Expert tensor-parallel size.")
    dp: int = Field(ge=1, description="Data-parallel size: count / (tp x pp x cp) (derived; checked).")
    sequence_parallel: bool = Field(
        description="Sequence parallelism as Megatron applies it (effective only at TP > 1, so false at TP 1 even "
        "when the command passes --sequence-parallel)."
    )
    layer_split: list[int] | None = Field(
        description="Layers per pipeline stage when uneven (sums to the model's layers); null for an even split."
    )
    max_tokens_per_gpu: int | None = Field(
        ge=1, description="Dynamic batching cap (slime --max-tokens-per-gpu); null with a fixed micro-batch size."
    )
    rows_per_microbatch: int = Field(ge=1, description="Rows per micro-batch (derived from the token cap; checked).")
    recompute: RecomputeSection = Field(description="Activation recomputation.")
    offload: Offload | None = Field(description="Host offload; null for none.")
    dispatcher: Literal["alltoall", "allgather", "flex", "hybridep"] = Field(
        description="MoE token dispatcher (flex: the flex dispatcher on DeepEP; hybridep: on HybridEP).")


class ActiveParams(Section):
    """N in the MFU formula: parameters used per token (every matrix used per token plus one vocabulary matrix)."""

    _omit_none = frozenset({"revision"})
    count: int = Field(gt=0, description="Active parameters per token.")
    source: str = Field(description="Where the model's configuration came from.")
    revision: str | None = Field(None, description="Revision of that source; optional.")


class Result(Section):
    """The measured (or predicted) numbers. MFU, $ and window tokens are derived and recomputed by the checks."""

    _omit_none = frozenset()
    tokens_per_s_per_gpu: float = Field(gt=0, description="Training tokens per second per GPU over the scored window.")
    usd_per_million_tokens: float = Field(ge=0, description="GPU price per hour / (tokens/s/GPU x 3600) x 1e6 (derived; checked).")
    step_time_cv_percent: float | None = Field(ge=0, description="Coefficient of variation of step time over the window, %; null for a prediction.")
    mfu: float = Field(ge=0, le=8, description="tokens/s/GPU x 6 x N / dense BF16 peak (derived; checked). Above 1 only "
                       "for FP8 / FP4 recipes, whose GEMMs run above the BF16 peak (up to 6x it in the catalog).")
    mfu_note: str | None = Field(description="Caveat on the MFU figure; null for none.")
    active_params: ActiveParams = Field(description="N used for MFU.")
    measured: Date = Field(description="Date of the measurement (or prediction), YYYY-MM-DD.")
    steps_per_run: int = Field(ge=1, description="Training steps in the run (slime --num-rollout).")
    window: list[Annotated[int, Field(ge=0)]] = Field(
        min_length=2, max_length=2, description="First and last scored step, inclusive: [first, last], last < steps_per_run."
    )
    window_tokens: int = Field(gt=0, description="Tokens in the scored window: steps x global batch x row tokens (checked).")
    runs: int = Field(ge=0, description="Measured runs behind the number (0 for a prediction).")
    profiler: bool = Field(description="Whether a profiler was on during the measured run.")
    gpu_hours: float | None = Field(
        ge=0, description="GPU-hours the run cost (a prediction may give its predicted cost, saying so in gpu_hours_note); "
        "null when unknown."
    )
    gpu_hours_note: str | None = Field(description="How gpu_hours was counted; null when not applicable.")


class ComponentTest(Section):
    """A numerical test of one component (e.g. a dispatcher) at this model's shape."""

    test: str = Field(description="What was tested, against what reference.")
    shape: str = Field(description="The shape it was tested at.")
    gpu: str = Field(description="GPU it ran on.")
    date: Date = Field(description="Date it ran, YYYY-MM-DD.")
    result: Outcome = Field(description="pass or fail.")
    detail: str = Field(description="Errors against bounds, controls, reruns.")


class Convergence(Section):
    """Short-run loss parity of the recipe against a reference recipe."""

    _omit_none = frozenset({"worst_step_tolerance_ratio"})
    steps: int = Field(ge=1, description="Steps compared.")
    result: Outcome = Field(description="pass or fail.")
    correlation: float = Field(ge=-1, le=1, description="Correlation of the two loss curves.")
    final_loss_difference: float = Field(ge=0, description="Absolute loss difference at the last step.")
    pointwise_failures: int = Field(ge=0, description="Scored steps outside tolerance.")
    note: str = Field(description="How the two arms were run.")
    worst_step_tolerance_ratio: float | None = Field(
        None, ge=0, description="Worst step's deviation as a fraction of its tolerance; optional."
    )


class Correctness(Section):
    """Whether the recipe trains the same model as the reference: configuration rules, component tests, convergence."""

    result: GateOutcome = Field(description="Overall: pass, fail, or not run.")
    summary: str = Field(description="One-line summary of the gates.")
    reference: str = Field(description="The reference recipe or run compared against.")
    configuration: GateOutcome = Field(description="Numerics rules on the arguments: pass, fail, or not run.")
    component_tests: list[ComponentTest] = Field(description="Component tests run; empty for none.")
    convergence: Convergence | None = Field(description="Convergence check; null when not run.")
    rules: str = Field(description="Which rules and thresholds the gates used.")


class Patch(Section):
    """A source change the recipe needs on top of the stack."""

    _omit_none = frozenset({"source"})
    name: str = Field(description="Short name of the patch.")
    description: str = Field(description="What it changes and why; whether it changes the training step.")
    source: str | None = Field(None, description="Where the patch lives (URL, commit or file); optional.")
