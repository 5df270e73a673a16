"""Measured throughput rows the cost model can be calibrated against.

`Measurement` is one measured run: model, GPUs, workload, layout, tokens/s/GPU and where the number came
from. Three sources: `seed_measurements()` (the seed page's three H200 layouts), `published_measurements()`
(the public table shipped in data/published_throughput.csv, mapped onto the catalog: only rows the model
can represent, every other row returned with the reason it was skipped), and `read_measurements()` (a
user's CSV in the published columns, or a JSON list of Measurement objects). Trials become measurements
in the search driver. No torch, no ray.
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import json
import math
import re
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from ..catalog import ClusterSpec, GpuSpec, ModelSpec, Workload, load_model
from ..errors import BadInput, ConfigError
from ..layout import Layout, Recompute, violations
from ..layout.splits import legal_splits, split_flags
from ..layout import LayoutTable
from ._mtp import mtp_passes
from ._published import REQUIRED_COLUMNS, map_row, train_flops_per_token
from .memory import estimate_memory

__all__ = ["Measurement", "published_measurements", "seed_measurements", "read_measurements", "PUBLISHED_CSV"]


def _shipped_csv() -> Path:
    return Path(str(resources.files("autotune.cost") / "data" / "published_throughput.csv"))


PUBLISHED_CSV = _shipped_csv()
MAX_TOKENS_PER_S_PER_GPU = 1e7  # far above any LLM training run (tiny models on B200 reach ~1e5)
MAX_FILE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Measurement:
    """One measured training run, in the cost model's vocabulary."""

    model: str  # catalog name (or config.json path)
    gpu: str  # GPU kind of the catalog (H100, H200, H800, B200, B300, GB200, GB300)
    count: int  # world size
    layout: Layout
    tokens_per_s_per_gpu: float
    gpus_per_node: int = 8
    seq_len: int = 8192
    global_batch: int = 128
    load_balancing_loss: bool = False  # True also for force-balanced routing (near-even expert load)
    source: str = ""  # where the number comes from (and what was assumed or derived)
    weight: float = 1.0  # relative trust in the fit (derived numbers count less)
    grads_fp32: bool = True  # gradients reduced in fp32 (--accumulate-allreduce-grads-in-fp32)
    precision: str = "bf16"  # a Workload precision (bf16, fp8-tensorwise, mxfp8, ...)
    fp8_param_gather: bool = False
    fp8_attention: bool = False  # see Workload.fp8_attention (--fp8-dot-product-attention)
    fp8_output_proj: bool = False  # see Workload.fp8_output_proj (the output layer under MXFP8)
    train_mtp: bool = False  # the MTP block trained with the model (see Workload.train_mtp)
    mtp_passes: int = 0
    force_balance: bool = False  # --moe-router-force-load-balancing (published MoE benchmarks)
    framework: str = "megatron"  # catalog.FRAMEWORKS: the stack that ran it (its memory behaviour)
    fsdp_reshard_moe: bool = False  # see Workload.fsdp_reshard_moe (NeMo AutoModel's moe.reshard_after_forward)
    optimizer_state_bytes: float = 0.0  # per owned parameter; 0: the framework's own
    bf16_layers_end: int = 0  # see Workload: linears a low-precision recipe keeps in BF16 / MXFP8
    quant_overrides: tuple = ()
    # the publisher's record that the row measured a performance regression of its release (_sources.known_regression):
    # kept and predicted, left out of the calibration fit (calibrate.fit_kinds)
    regression: str = ""
    # why the time model cannot yet price this row's model (_sources.unpriced): kept and predicted, left out of the fit
    unpriced: str = ""
    # the part that ran when it differs from the kind's catalog figures (catalog.GPU_VARIANTS, e.g. torchtitan's
    # Grand Teton H100 with 96 GB HBM2e at 2.4 TB/s and 500 W): its figures for the time and memory models, the
    # kind's calibration
    gpu_variant: str = ""
    eager: bool = False  # see Workload.eager: torchtitan run without torch.compile
    attention_kernel: str = "te"  # see Workload.attention_kernel: TE's fused attention or PyTorch SDPA's flash
    lora: bool = False  # see Workload.lora: LoRA fine-tuning of a frozen base
    packed_doc_len: int = 0  # see Workload.packed_doc_len: packed fine-tuning rows attend within each document
    # a GPU the catalog lacks (a search's trials on a user's --gpu FILE): its figures; `gpu` then names it for the
    # calibration (a kind the calibration lacks falls back as calibrate.calibration_for says)
    gpu_spec: GpuSpec | None = None

    def __post_init__(self):
        for name in ("count", "gpus_per_node", "seq_len", "global_batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise BadInput(f"measurement of {self.model!r}: {name} must be a positive integer, got {v!r}")
        for name in ("tokens_per_s_per_gpu", "weight"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise BadInput(f"measurement of {self.model!r}: {name} must be a finite number, got {v!r}")
        if not isinstance(self.gpu, str) or not isinstance(self.model, str):
            raise BadInput(f"measurement: model and gpu must be names, got {self.model!r} and {self.gpu!r}")
        if not 0 < self.tokens_per_s_per_gpu <= MAX_TOKENS_PER_S_PER_GPU:
            raise BadInput(f"measurement {self.label()}: tokens/s/GPU must be above 0 and at most "
                           f"{MAX_TOKENS_PER_S_PER_GPU:g}, got {self.tokens_per_s_per_gpu:g}")
        if not self.weight > 0:
            raise BadInput(f"measurement {self.label()}: weight must be above 0, got {self.weight:g}")
        if self.layout.world != self.count:
            raise BadInput(f"measurement {self.label()}: layout is for {self.layout.world} GPUs, count is {self.count}")
        self.cluster  # a known GPU kind (and variant), whole nodes
        self.workload  # a known precision

    @property
    def workload(self) -> Workload:
        return Workload(seq_len=self.seq_len, global_batch=self.global_batch,
                        load_balancing_loss=self.load_balancing_loss, grads_fp32=self.grads_fp32,
                        precision=self.precision, fp8_param_gather=self.fp8_param_gather,
                        fp8_attention=self.fp8_attention, fp8_output_proj=self.fp8_output_proj,
                        train_mtp=self.train_mtp, mtp_passes=self.mtp_passes,
                        force_balance=self.force_balance, framework=self.framework,
                        fsdp_reshard_moe=self.fsdp_reshard_moe,
                        optimizer_state_bytes=self.optimizer_state_bytes, bf16_layers_end=self.bf16_layers_end,
                        quant_overrides=tuple(tuple(o) for o in self.quant_overrides), eager=self.eager,
                        attention_kernel=self.attention_kernel, lora=self.lora, packed_doc_len=self.packed_doc_len)

    @property
    def kept_out(self) -> bool:
        """Predicted and reported, but left out of every fit: a release's filed regression, or a model the time model
        cannot yet price (calibrate.fit_kinds, search.priors)."""
        return bool(self.regression or self.unpriced)

    @property
    def cluster(self) -> ClusterSpec:
        return ClusterSpec.of(self.gpu_spec or self.gpu_variant or self.gpu, self.count, self.gpus_per_node)

    @property
    def spec(self) -> ModelSpec:
        return load_model(self.model)

    def label(self) -> str:
        return f"{self.model} {self.count}x{self.gpu} {self.layout.label(True)} {self.layout.recompute}"

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["layout"] = self.layout.to_dict()
        if self.gpu_spec is None:
            del d["gpu_spec"]
        else:
            d["gpu_spec"] = dataclasses.asdict(self.gpu_spec)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        d = dict(d)
        lay = d.pop("layout")
        if isinstance(d.get("gpu_spec"), dict):
            try:
                d["gpu_spec"] = GpuSpec(**d["gpu_spec"])
            except TypeError as exc:
                raise BadInput(f"measurement of {d.get('model')!r}: gpu_spec: {exc}; give GpuSpec's fields") from None
        if isinstance(lay, str):  # "TP1 PP4 EP8 DP8" plus optional flat options
            opts = {k: d.pop(k) for k in list(d) if k in Layout.__dataclass_fields__ and k != "world"}
            if isinstance(opts.get("recompute"), str):
                opts["recompute"] = Recompute.parse(opts["recompute"])
            lay = Layout.parse(lay, world=int(d["count"]), **opts)
        elif isinstance(lay, dict):
            lay = Layout.from_dict({**lay, "world": int(lay.get("world", d["count"]))})
        return cls(layout=lay, **d)


def _seed(tps: float, rc_layers: int, source: str, **layout_kw) -> Measurement:
    lay = Layout(world=32, tp=1, pp=4, ep=8, recompute=Recompute("full", "uniform", rc_layers),
                 max_tokens_per_gpu=8192, precision_aware_optimizer=True, **layout_kw)
    return Measurement("Qwen3.5-122B-A10B", "H200", 32, lay, tps, seq_len=8192, global_batch=128, source=source)


def seed_measurements() -> list[Measurement]:
    """The seed page's three measured H200 layouts (recipes/qwen3.5-122b-a10b/h200/), best first."""
    page = "seed page 000_3f17f510fd0702dc (OpenRecipes, ATTUNE, slime 0.3.0 / megatron-core 0.16.0rc0)"
    return [
        _seed(2451.44, 2, f"{page}: attune-tp1-pp4-ep8-rc2"),
        _seed(2366.73, 1, f"{page}: attune-tp1-pp4-ep8", moe_shared_expert_overlap=True),
        _seed(2289.65, 1, f"{page}: attune-tp1-pp4-ep8-flex", dispatcher="flex"),
    ]


def _state_bytes(m: "Measurement") -> float:
    """Bytes of weights, gradients and optimizer state on the fullest pipeline stage of m's layout (no activations)."""
    mem = estimate_memory(m.spec, m.workload, m.cluster, LayoutTable.from_layouts([m.layout]))
    return float(sum(mem.terms[k][0, :m.layout.pp] for k in ("weights", "grads", "optimizer")).max())


def _represent(row: dict, line: int, retry: bool = True) -> Measurement | str:
    """A Measurement for the row, or the reason the model cannot represent it. A Megatron-Bridge row whose printed
    layout is none of its release's recipes and cannot hold even its weights, gradients and optimizer state in the
    GPU's memory did not run as printed: it is read as its release's one recipe layout for its model, GPU and
    precision, when there is one (26.02.01's Llama 3.1 70B GB300 NVFP4 row prints the FP8 row's TP1 PP1 MBS 2 with
    FSDP 0), and says so."""
    got = map_row(row)
    if isinstance(got, str):
        return got
    own = got.get("recipe_layout")
    if retry and own:
        g = got["measurement"]
        try:
            printed = Measurement(layout=Layout(**got["layout"]), **got["measurement"])
            state = _state_bytes(printed)
            cap = float(ClusterSpec.of(g.get("gpu_variant") or g["gpu"], g["count"]).gpu.memory_bytes)
        except BadInput:  # not a run as printed (a count that fills no nodes, ...): the checks below say why
            state, cap = 0.0, 1.0
        if state > cap:
            why = (f"layout of its release's recipes for this model, GPU and precision (TP{own['tp']} PP{own['pp']} "
                   f"CP{own['cp']} VP{own['vp']} EP{own['ep']} MBS{own['micro_batch']}): as printed (TP{row.get('tp')} "
                   f"PP{row.get('pp')} MBS{row.get('micro_batch')}, no recipe of its release) its weights, gradients "
                   f"and optimizer state alone take {state / 2**30:.0f} of {cap / 2**30:.0f} GiB")
            fixed = {**row, **{k: str(own[k]) for k in ("tp", "pp", "cp", "vp", "ep", "micro_batch")}, "_reading": why}
            return _represent(fixed, line, retry=False)
    try:
        model = load_model(got["model"])
        lay = Layout(**got["layout"])
        src = got["source"]
        splits = [] if lay.layer_split else legal_splits(model.num_layers, lay.pp, lay.vpp)
        if splits:  # the layers do not divide: the source ran Megatron's uneven split (see _published.py)
            lay = replace(lay, layer_split=splits[0])
            how = split_flags(splits[0], model.num_layers, lay.pp, lay.vpp)
            src += f"; assumed layer split {list(splits[0])} ({', '.join(how) if how else 'pipeline layout'})"
        m = Measurement(layout=lay, source=f"{src} (csv line {line})", **got["measurement"])
    except BadInput as exc:
        return f"not representable: {exc}"
    try:
        m.workload.check_gpu(m.cluster.gpu)
    except BadInput as exc:
        return f"not representable: {exc}"
    bad = violations(model, m.workload, lay)
    if bad:
        return "illegal for Megatron-core's rules: " + "; ".join(v.message for v in bad)
    if got.get("tflops"):
        # derived: trusted less. Megatron's count (the TFLOP/s Megatron-based pages print) includes a trained MTP block
        tps = got["tflops"] * 1e12 / train_flops_per_token(model, m.seq_len, mtp_passes=mtp_passes(model, m.workload))
        try:
            m = replace(m, tokens_per_s_per_gpu=tps, weight=0.5,
                        source=m.source + f"; tokens/s derived from {got['tflops']:g} TFLOP/s/GPU")
        except BadInput as exc:  # a TFLOP/s figure that is no throughput (negative, or beyond any GPU)
            return f"not representable: {exc}"
    return m


def _check_size(path: Path) -> None:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror}); check the path") from None
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory; give a measurements file")
    if size > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: {size:,} bytes, more than {MAX_FILE_BYTES:,}; split the measurements")


# the columns a table cannot do without (the layout's other degrees, the precision and recompute read as blank when a
# table has no column for them), and the throughput columns, at least one of which it needs
ESSENTIAL_COLUMNS = ("model", "gpu", "num_gpus", "seq_len", "global_batch", "tp", "pp")
THROUGHPUT_COLUMNS = ("tokens_per_s_per_gpu", "tflops_per_gpu", "mfu")


def _column(name: str | None) -> str:
    """A header as the published columns spell it: ' Num GPUs' and 'num-gpus' read as 'num_gpus'."""
    return re.sub(r"[\s\-]+", "_", (name or "").strip().lower())


def _read_csv(path: Path) -> list[dict]:
    """The rows of a table in the published columns (a byte-order mark, header case and spacing, and missing
    optional columns allowed)."""
    _check_size(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            have = reader.fieldnames = [_column(c) for c in reader.fieldnames or []]  # the rows' keys from here on
            missing = [c for c in ESSENTIAL_COLUMNS if c not in have]
            if not any(c in have for c in THROUGHPUT_COLUMNS):
                missing.append(" or ".join(THROUGHPUT_COLUMNS))
            if missing:
                raise ConfigError(f"{path}: missing column(s) {', '.join(missing)}; "
                                  f"use the columns of published_throughput.csv ({', '.join(REQUIRED_COLUMNS)})")
            blank = {c: "" for c in (*REQUIRED_COLUMNS, "mfu", "notes", "source") if c not in have}
            return [{**blank, **row} for row in reader]
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text (a binary file?); give a CSV in the published columns") from None
    except csv.Error as exc:
        raise ConfigError(f"{path}: not a readable CSV ({exc}); give a CSV in the published columns") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror}); check the path") from None


def published_measurements(csv_path: str | Path | None = None) -> tuple[list[Measurement], list[tuple[dict, str]]]:
    """Rows the model can represent, and (row, reason) for every row it cannot."""
    path = Path(csv_path) if csv_path else PUBLISHED_CSV
    kept: list[Measurement] = []
    skipped: list[tuple[dict, str]] = []
    for i, row in enumerate(_read_csv(path)):
        got = _represent(row, i + 2)
        if isinstance(got, str):
            skipped.append((row, got))
        else:
            kept.append(got)
    return kept, skipped


_REQUIRED = ("model", "gpu", "count", "layout", "tokens_per_s_per_gpu")


def _check_fields(d: dict, where: str) -> None:
    """A JSON measurement's keys and the layout's form, named before the dataclass sees them (its errors are
    Python's: "'list' object has no attribute 'world'")."""
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise ConfigError(f"{where}: missing field(s) {', '.join(missing)}; give {', '.join(_REQUIRED)}")
    lay = d["layout"]
    if not isinstance(lay, (str, dict)):
        raise ConfigError(f"{where}: field layout: give degrees like \"TP1 PP4 EP8 DP8\" or an object of layout "
                          f"fields, got {type(lay).__name__}")
    allowed = set(Measurement.__dataclass_fields__) | (set(Layout.__dataclass_fields__) if isinstance(lay, str) else set())
    for key in d:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown field {key!r}{hint}; fields: {', '.join(Measurement.__dataclass_fields__)}")
    if not isinstance(d.get("quant_overrides", []), list):
        raise ConfigError(f"{where}: field quant_overrides: give a list of [module, format] pairs, got "
                          f"{type(d['quant_overrides']).__name__}")


def read_measurements(path: str | Path) -> tuple[list[Measurement], list[tuple[dict, str]]]:
    """A user's measurements: a CSV in the published columns, or a JSON list of Measurement objects."""
    p = Path(path)
    if p.suffix.lower() == ".csv":
        return published_measurements(p)
    if p.suffix.lower() != ".json":
        raise BadInput(f"--measurements {str(p)!r}: give a .csv (published columns) or a .json list of measurements")
    _check_size(p)
    try:
        data = json.loads(p.read_text(encoding="utf-8-sig"))  # a byte-order mark, as some editors write, is allowed
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text (a binary file?); give a JSON list of measurements") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested too deeply to read; give a JSON list of measurements") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read ({exc.strerror}); check the path") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno}); fix the file") from None
    rows = data.get("measurements") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise ConfigError(f"{p}: expected a JSON list of measurements (or {{\"measurements\": [...]}})")
    out = []
    for i, d in enumerate(rows):
        if not isinstance(d, dict):
            raise ConfigError(f"{p}: measurement {i}: expected an object, got {type(d).__name__}")
        _check_fields(d, f"{p}: measurement {i}")
        try:
            m = Measurement.from_dict(d)
            bad = violations(m.spec, m.workload, m.layout)  # e.g. DP0: degrees that do not divide the world
        except BadInput as exc:  # the layout's own words name CLI flags; here they are the measurement's fields
            raise ConfigError(f"{p}: measurement {i}: {str(exc).replace('--count', 'count')}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{p}: measurement {i}: a field has a value of the wrong type ({type(exc).__name__}); "
                              f"give {', '.join(_REQUIRED)} as in `autotune calibrate --help`") from None
        if bad:
            raise ConfigError(f"{p}: measurement {i} ({m.label()}): illegal for Megatron-core's rules: "
                              + "; ".join(v.message for v in bad))
        out.append(m)
    return out, []
