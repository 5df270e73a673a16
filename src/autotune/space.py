"""SearchSpace: the dimensions autotune varies (search_spaces/*.yaml), enumerated and pruned as arrays.

`load_space` reads the default space merged with a per-model override (or a user file); `explore`
enumerates every combination, removes illegal layouts (Megatron's rules), layouts that need software
the cluster lacks, impractical placements, predicted OOMs and layouts that cannot win, and reports the
funnel with counts per reason. Combinations are enumerated and screened MAX_CHUNK at a time; each chunk's
layouts that fit go through the time model TIME_CHUNK at a time, and only those within keep_within of the best
so far are held, so a space of tens of millions costs the memory of the layouts that can win. The result holds
those, fully evaluated.
Everything after enumeration is vectorised. No torch, no ray.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import yaml
from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError,
                      create_model, field_validator)

from .catalog import ClusterSpec, ModelSpec, Workload
from .cost import Calibration, Evaluation, evaluate, load_calibration
from .cost._comm import paged_stash
from .cost.memory import MemoryResult, estimate_memory
from .errors import ConfigError
from .layout import DISPATCHERS, RULES, LayoutTable, Recompute, check
from .layout.core import CUDA_GRAPHS
from .layout.dimensions import DIMENSIONS, SPLIT_CHOICES, UNEVEN, expand_splits, grid_axes, grid_columns, split_counts
from .layout.rules import SPLIT_RULES
from .words import count

__all__ = ["SearchSpace", "Dimensions", "Prune", "load_space", "enumerate_space", "explore", "SpaceResult", "chunks", "MAX_CHUNK",
           "nothing_survives"]


_SPACE_TYPES = {int: list[StrictInt], bool: list[StrictBool], str: list[StrictStr], float: list[StrictFloat | StrictInt]}


class _DimensionValues(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*")
    @classmethod
    def _non_empty(cls, v, info):
        if not v:
            raise ValueError("is empty; give at least one value")
        dim = _BY_KEY[info.field_name]
        if dim.kind is int and min(v) < (dim.bounds[0] if dim.bounds else 1):
            raise ValueError("values must be positive integers" if not dim.bounds else f"values must be >= {dim.bounds[0]}")
        if dim.name == "recompute":
            for r in v:
                Recompute.parse(r)
        if dim.kind is float:
            lo, hi = dim.bounds or (0.0, 1.0)
            bad = [f for f in v if not lo <= f <= hi]
            if bad and dim.name == "optimizer_offload":
                raise ValueError(f"offload fraction(s) {bad} outside [0, 1]; e.g. [0.0, 0.5, 1.0]")
            if bad:
                raise ValueError(f"value(s) {bad} outside [{lo:g}, {hi:g}]")
            v = [float(f) for f in v]
        for name, allowed in (("dispatcher", DISPATCHERS), ("cuda_graphs", CUDA_GRAPHS), ("layer_split", SPLIT_CHOICES)):
            bad = [d for d in v if dim.name == name and d not in allowed]
            if bad:
                raise ValueError(f"unknown {name} value(s) {bad}; allowed: {', '.join(allowed)}")
        return sorted(set(v), key=v.index)


_BY_KEY = {d.key: d for d in DIMENSIONS}
# the `dimensions:` section of a search space, one field per searched dimension (layout/dimensions.py)
Dimensions = create_model(
    "Dimensions", __base__=_DimensionValues,
    **{d.key: (_SPACE_TYPES[d.kind], list(d.default)) for d in DIMENSIONS},  # type: ignore[call-overload]
)


class Prune(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    tp_within_node: bool = True
    ep_tp_within_nodes: int = Field(default=8, ge=1)  # nodes an EP x ETP x TP group may span
    memory_margin: float = Field(default=0.03, ge=0, lt=1)  # HBM share kept free: 0 (none) to below 1
    keep_within: float = Field(default=0.70, gt=0, le=1)  # keep layouts predicted at least this share of the best
    # rows per micro-batch above this many tokens (rows x seq_len) are not enumerated; 0: no cap
    max_microbatch_tokens: int = Field(default=0, ge=0)


class SearchSpace(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "custom"
    description: str = ""
    extends: str | None = None
    dimensions: Dimensions = Dimensions()
    prune: Prune = Prune()
    source: str = ""


def _packaged(name: str):
    return resources.files("autotune") / "search_spaces" / f"{name}.yaml"


MAX_YAML_BYTES = 1 << 20  # a search space is a page of YAML
MAX_ALIASES = 50  # anchors are for sharing a list or two, not for building structures
MAX_NODES = 100_000  # YAML nodes after aliases are expanded
MAX_ENUMERATED = 5_000_000  # combinations materialised as one table (enumerate_space)
MAX_EXPLORED = 50_000_000  # combinations `explore` screens, MAX_CHUNK at a time (~3M a second on one core)
MAX_CHUNK = 1 << 20  # rows enumerated and checked at once: bounds explore's memory whatever the space's size
TIME_CHUNK = 1 << 16  # fitting rows whose tokens/s the time model computes at once
# layouts that can still win (within prune.keep_within of the best screened so far), held until the end: ~1.5 KB
# each (the row, 154 B, and its memory terms per stage, 1,296 B at 16 stages: Qwen3-30B-A3B on 64 H100). Those
# that only fit are let go chunk by chunk (the default space fits 1.06M layouts of NVIDIA-Nemotron-3-Nano-30B-A3B
# on 128 H800, of which 14,752 can win)
MAX_EVALUATED = 1_000_000


class _SafeLoader(yaml.SafeLoader):
    """yaml.SafeLoader that counts aliases as it composes: an alias bomb stops at MAX_ALIASES."""

    aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_ALIASES} aliases")
        return super().compose_node(parent, index)


def _expanded_nodes(root, limit: int) -> int:
    """Nodes of the document with every alias expanded (shared nodes counted each time), up to `limit`."""
    memo: dict[int, int] = {}

    def size(node) -> int:
        if id(node) in memo:
            return memo[id(node)]
        memo[id(node)] = limit + 1  # a cycle (a recursive anchor) counts as too big
        kids = node.value if isinstance(node, yaml.SequenceNode) else (
            [n for kv in node.value for n in kv] if isinstance(node, yaml.MappingNode) else [])
        total = 1
        for k in kids:
            total += size(k)
            if total > limit:
                break
        memo[id(node)] = min(total, limit + 1)
        return memo[id(node)]

    return size(root) if root is not None else 0


def _read_yaml(text: str, label: str) -> dict:
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"search space {label}: {len(text):,} characters, more than {MAX_YAML_BYTES:,}; "
                          f"a search space lists a few values per dimension")
    loader = _SafeLoader(text)
    try:
        root = loader.get_single_node()
        if _expanded_nodes(root, MAX_NODES) > MAX_NODES:
            raise ConfigError(f"search space {label}: more than {MAX_NODES:,} values once its aliases are "
                              f"expanded; list the values without nested anchors")
        data = (loader.construct_document(root) if root is not None else None) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"search space {label}: not valid YAML ({' '.join(str(exc).split())[:200]}); "
                          f"fix the file") from None
    except RecursionError:
        raise ConfigError(f"search space {label}: nested too deeply; fix the file") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ConfigError(f"search space {label}: expected a mapping with 'dimensions'")
    return data


def _rows_cap(space: "SearchSpace", workload: Workload) -> tuple[dict, str | None]:
    """The space's dimensions with the rows per micro-batch above prune.max_microbatch_tokens left out (the smallest
    listed always stays), and a note naming what was left out."""
    dims = space.dimensions.model_dump()
    cap, rows = space.prune.max_microbatch_tokens, list(dims["rows_per_microbatch"])
    keep = [r for r in rows if not cap or r * workload.seq_len <= cap] or [min(rows)]
    if keep == rows:
        return dims, None
    dropped = ", ".join(str(r) for r in rows if r not in keep)
    return {**dims, "rows_per_microbatch": keep}, (
        f"rows per micro-batch {dropped} not tried: at {workload.seq_len:,}-token rows a micro-batch would pass "
        f"prune.max_microbatch_tokens ({cap:,})")


def _sized_axes(space: "SearchSpace", dims: dict, model: ModelSpec, cluster: ClusterSpec,
                cap: int) -> tuple[list[list], int]:
    """The enumeration axes of `dims` (the space's dimensions, _rows_cap applied) and their product (the
    combinations), refused when that exceeds `cap` (before numpy allocates)."""
    axes = grid_axes(dims, model, cluster)
    size = int(np.prod([max(len(a), 1) for a in axes], dtype=object))
    if size > cap:
        counts = " x ".join(str(len(a)) for a in axes)
        raise ConfigError(f"search space {space.source}: {size:,} combinations ({counts}) exceed the cap of "
                          f"{cap:,}; list fewer values per dimension")
    return axes, size


def chunks(axes: list[list], rows: int | None = None):
    """`axes` split into sub-grids of at most `rows` rows (default MAX_CHUNK, read at the call), in enumeration
    order: the leading axes are fixed to one value each (every combination of them in turn), the trailing ones
    stay whole."""
    rows = MAX_CHUNK if rows is None else rows
    sizes = [max(len(a), 1) for a in axes]
    k = 0
    while k < len(axes) and int(np.prod(sizes[k:])) > rows:
        k += 1
    for prefix in itertools.product(*axes[:k]):
        yield [[v] for v in prefix] + axes[k:]


def _parse(data: dict, label: str) -> SearchSpace:
    try:
        return SearchSpace.model_validate({**data, "source": label})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc)
        allowed = ""
        if err["type"] == "extra_forbidden":
            section = loc[0] if len(loc) > 1 else None
            model = {"dimensions": Dimensions, "prune": Prune}.get(section or "", SearchSpace)
            allowed = f"; allowed: {', '.join(model.model_fields)}"
            msg = f"unknown {'dimension' if section == 'dimensions' else 'key'} '{loc[-1]}'"
        else:
            msg = err["msg"].removeprefix("Value error, ")
            if len(loc) > 2 and loc[2].isdigit():  # one value of a list (and the union member pydantic tried)
                key = ".".join(loc[:2])
                msg = f"{msg}, got {err['input']!r}"
            elif not isinstance(err.get("input"), (dict, list)) and "input" in err:
                msg = f"{msg}, got {err['input']!r}"
        raise ConfigError(f"search space {label}: {key}: {msg}{allowed}") from None


def load_space(path: str | None = None, model: ModelSpec | None = None) -> SearchSpace:
    """The space in `path`, else the default merged with search_spaces/<model>.yaml when it exists."""
    if path:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"search space {path!r} does not exist; pass a YAML file or omit --space")
        data = _read_yaml(p.read_text(), str(p))
        label = str(p)
    else:
        data, label = {"extends": "default"}, "default"
        if model is not None and _packaged(model.name).is_file():
            data = _read_yaml(_packaged(model.name).read_text(), f"search_spaces/{model.name}.yaml")
            label = f"search_spaces/{model.name}.yaml"
    base = data.get("extends")
    if base:
        if not _packaged(base).is_file():
            raise ConfigError(f"search space {label}: extends unknown space {base!r}; use 'default'")
        parent = _read_yaml(_packaged(base).read_text(), f"search_spaces/{base}.yaml")
        merged = {**parent, **{k: v for k, v in data.items() if k not in ("dimensions", "prune")}}
        merged["dimensions"] = {**(parent.get("dimensions") or {}), **(data.get("dimensions") or {})}
        merged["prune"] = {**(parent.get("prune") or {}), **(data.get("prune") or {})}
        merged.pop("extends", None)
        data = merged
    return _parse(data, label)


def enumerate_space(space: SearchSpace, model: ModelSpec, workload: Workload, cluster: ClusterSpec) -> LayoutTable:
    """Every combination of the space's values for this model and cluster, as a LayoutTable."""
    axes, _ = _sized_axes(space, _rows_cap(space, workload)[0], model, cluster, MAX_ENUMERATED)
    n, cols = grid_columns(axes, workload, model.num_layers)
    return LayoutTable.from_columns(cluster.count, n, sp=True, **cols)


@dataclass
class SpaceResult:
    space: SearchSpace
    enumerated: int
    funnel: list[tuple[str, int]]  # (stage, count remaining)
    reasons: dict[str, int]  # reason -> layouts removed for it (first reason only)
    last_reasons: dict[str, int]  # reasons that removed the final layouts of the last non-empty stage; when no
    # layout is legal, the rules the closest layouts break (those breaking the fewest rules), most often first
    table: LayoutTable  # the kept layouts (legal, supported, practical, fit, can win), in enumeration order; empty
    # (and no evaluation) when none is kept
    evaluation: Evaluation | None  # of `table`'s rows
    kept: np.ndarray  # indices into `table`, best first (every row)
    notes: list[str] = field(default_factory=list)
    blocked_dp: int = 0  # when no layout is legal: the smallest DP among the closest rows the batch does not divide
    closest_broken: int = 0  # when no layout is legal: how many rules the closest layouts break (last_reasons')


def _even_batch(g: int, d: int) -> int:
    """The smallest d x 2^k of at least g rows: a global batch that divides over DP d and its power-of-two multiples."""
    return d * 2 ** max(0, math.ceil(math.log2(g / d)))


def batch_fallback(res: SpaceResult, workload: Workload) -> int | None:
    """When no layout survived only because the global batch divides over none of the DP sizes the GPU count leaves
    (the closest layouts break that one rule: 72 GPUs leave a DP with a factor of 3 or 9, which 128 rows do not
    divide over): the global batch nothing_survives suggests first, d x 2^k rows, the smallest of at least the batch
    asked (d: the smallest DP those layouts leave). None otherwise. For a default batch only: one a user gave is
    theirs to change."""
    if len(res.kept) or not res.blocked_dp or res.closest_broken != 1 or "illegal: dp_batch" not in res.last_reasons:
        return None
    return _even_batch(workload.global_batch, res.blocked_dp)


def nothing_survives(res: SpaceResult, workload: Workload, subject: str = "no layout") -> str:
    """Why no layout survived, and the way out that fits what removed the last of them (one line, for BadInput):
    when none is legal, the rules the closest layouts break (explore's second pass); when none fits, the memory."""
    why = ", ".join(f"{k} ({v:,})" for k, v in res.last_reasons.items()) or "nothing enumerated"
    codes = set(res.last_reasons)
    top = next(iter(res.last_reasons), "")
    if any("OOM" in c or "memory" in c for c in codes):
        hint = ("add GPUs, shorten --seq-len, or widen the space (--space: recompute, optimizer_offload, "
                "offload_modules)")
    elif "illegal: dp_batch" in codes and res.blocked_dp:
        g, d = workload.global_batch, res.blocked_dp
        near, even = -(-g // d) * d, _even_batch(g, d)
        way = (f"{near} (a multiple of {d})" if near == even else
               f"{even} ({d} x {even // d}, which divides over power-of-two multiples of DP {d} too) or {near} (the "
               f"nearest multiple of {d})")
        hint = (f"the global batch ({g} rows) must divide over DP, and the smallest DP these layouts leave is {d}: "
                f"use --global-batch {way}, or a GPU count that leaves a DP dividing {g}")
    elif "illegal: layers_pp" in codes:
        hint = ("let the space try uneven layer splits (--space with layer_split: [even, uneven]), or list PP x VPP "
                "values that divide the model's layers")
    elif top in ("illegal: interleaved_microbatches", "illegal: microbatch_divides", "illegal: tokens_within_rows"):
        hint = "use a larger --global-batch (more micro-batches per DP rank), or drop VPP from the space"
    elif top.startswith("illegal: world"):
        hint = _world_hint(res)
    else:
        hint = "widen the space (--space), or change the GPU count"
    if res.closest_broken:
        k = res.closest_broken
        why = f"none is legal; the closest break {k} rule{'s' if k > 1 else ''} (layouts breaking each): {why}"
    else:
        why = f"the last candidates were removed by: {why}"
    return f"{subject} survives pruning; {why}. {hint[0].upper()}{hint[1:]}"


def _world_hint(res: SpaceResult) -> str:
    """The way out when TP x PP x CP or EP x ETP x PP divides no layout into the GPUs: more GPUs when the count is
    below the smallest product the space lists (a space whose EP starts at 4 on 2 GPUs), else a count they divide."""
    d, world = res.space.dimensions, int(res.table.world)
    smallest = {"TP x PP x CP": min(d.tp) * min(d.pp) * min(d.cp), "EP x ETP x PP": min(d.ep) * min(d.etp) * min(d.pp)}
    name, need = max(smallest.items(), key=lambda kv: kv[1])
    if world < need:
        return (f"the space's smallest {name} is {need} (its lists start at " + ", ".join(
            f"{k} {min(getattr(d, k.lower()))}" for k in name.split(" x ")) + f"), more than {count(world, 'GPU')}: use at "
            f"least {need} GPUs, or a --space whose lists start lower")
    return "use a GPU count that the space's TP x PP x CP and EP x ETP x PP divide (e.g. a power of 2)"


def _first_reason(masks: list[tuple[str, np.ndarray]], n: int,
                  weight: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, int]]:
    """Rows every mask passes, and per reason the rows it removed first (`weight`: how many layouts a row stands
    for, an "uneven" row one per split)."""
    alive = np.ones(n, dtype=bool)
    counts: dict[str, int] = {}
    for reason, ok in masks:
        dead = alive & ~ok
        if dead.any():
            counts[reason] = int(dead.sum() if weight is None else weight[dead].sum())
        alive &= ok
    return alive, counts


def _closest(masks: list[tuple[str, np.ndarray]], dp: np.ndarray, weight: np.ndarray | None = None):
    """Among the rows some rule refuses: how many rules the closest ones break (the fewest), per rule the layouts of
    those rows that break it, and the smallest DP among them whose batch does not divide. None when none is refused.
    What to change when nothing is legal: the rules the nearest layouts still break, not every rule that fired."""
    if not masks or not len(dp):
        return None
    broken = np.zeros(len(dp), dtype=np.int16)  # rules each row breaks, one mask at a time (no (rows, rules) matrix)
    masks = [(reason, np.broadcast_to(np.asarray(m, dtype=bool), broken.shape)) for reason, m in masks]
    for _, m in masks:
        broken += ~m
    refused = (broken > 0) & (True if weight is None else weight > 0)
    if not refused.any():
        return None
    k = int(broken[refused].min())
    near = np.flatnonzero(refused & (broken == k))
    w = np.ones(len(near)) if weight is None else weight[near]
    counts, batch = {}, None
    for reason, m in masks:
        fail = ~m[near]
        if fail.any():
            counts[reason] = int(w[fail].sum())
        if reason == "illegal: dp_batch":
            batch = near[fail]
    return k, counts, int(dp[batch].min()) if batch is not None and len(batch) else 0


def _enumerated(chunk: list[list], model: ModelSpec, workload: Workload, cluster: ClusterSpec, closest: bool = False):
    """One chunk's combinations with their layer splits: (layouts it stands for, legal-so-far table, {reason:
    layouts removed}). An "uneven" row is first checked, as one row, against the rules that do not read the split;
    the survivors become one row per split Megatron accepts (most rows of a large space are illegal for other
    reasons, so few are expanded), which _screen then checks against every rule."""
    rows, cols = grid_columns(chunk, workload)
    uneven = cols["split"] == UNEVEN
    if not uneven.any():
        return rows, LayoutTable.from_columns(cluster.count, rows, sp=True, **cols), {}, None
    weight = split_counts(cols, model.num_layers)
    t = LayoutTable.from_columns(cluster.count, rows, sp=True, **{**cols, "split": np.where(uneven, 0, cols["split"])})
    masks = [(f"illegal: {code}", ok | uneven if code in SPLIT_RULES else ok) for code, ok in check(model, workload, t).items()]
    legal, reasons = _first_reason(masks, rows, weight)
    keep = np.flatnonzero(legal & (weight > 0))
    n, cols = expand_splits(len(keep), {k: np.asarray(v)[keep] for k, v in cols.items()}, model.num_layers)
    return (int(weight.sum()), LayoutTable.from_columns(cluster.count, n, sp=True, **cols), reasons,
            _closest(masks, t.dp, weight) if closest else None)


def _screen(t: LayoutTable, model: ModelSpec, workload: Workload, cluster: ClusterSpec, p: "Prune",
            tp_overlap_both: bool = False, closest: bool = False):
    """Which rows of `t` are legal, and which of those the cluster supports and the placement rules keep:
    (legal mask, kept mask, {reason: rows removed for it}, {reason: legal rows removed for it}).
    `tp_overlap_both`: the space lists TP communication overlap on and off, so a row asking for it where it cannot
    take effect (TP 1) duplicates the row without it."""
    legal_masks = [(f"illegal: {r.code}", m) for r, m in zip(RULES, check(model, workload, t).values())]
    legal, reasons = _first_reason(legal_masks, len(t))
    nearest = _closest(legal_masks, t.dp) if closest and not legal.any() else None  # what to change: explore
    soft = [("needs DeepEP (flex dispatcher) which the cluster lacks", ~((t.dispatcher == 2) & (not cluster.has_deepep))),
            ("needs HybridEP (the flex dispatcher's hybridep backend) which the cluster lacks",
             ~((t.dispatcher == 3) & (not cluster.has_hybridep))),
            ("needs Transformer Engine (context parallelism) which the cluster lacks",
             ~((t.cp > 1) & (not cluster.has_te))),
            ("needs megatron-core's paged stash (full-iteration CUDA graphs of a dropless MoE model) which the "
             "cluster's megatron-core lacks", ~(paged_stash(model, t) & (not cluster.has_paged_stash)))]
    practical = [("TP spans nodes", ~((t.tp > cluster.node_size) & p.tp_within_node)),
                 (f"EP x ETP x TP spans more than {p.ep_tp_within_nodes} nodes",
                  t.ep * t.etp * np.maximum(t.tp // t.etp, 1) <= p.ep_tp_within_nodes * cluster.node_size),
                 ("redundant: without EP or ETP the dispatcher choice changes nothing",
                  ~((t.ep * t.etp == 1) & (t.dispatcher != 0))),
                 ("redundant: TP communication overlap needs TP > 1 (the same layout without it is in the space)",
                  ~(tp_overlap_both & t.tp_comm_overlap & ~t.sp_eff))]
    kept, later = _first_reason([("legal", legal)] + soft + practical, len(t))
    later.pop("legal", None)
    return legal, kept, reasons, later, nearest


def _add(into: dict[str, int], counts: dict[str, int]) -> None:
    for k, v in counts.items():
        into[k] = into.get(k, 0) + v


def _nearest_legal(axes, model: ModelSpec, workload: Workload, cluster: ClusterSpec, p: "Prune",
                   overlap_both: bool) -> tuple[int, dict[str, int], int]:
    """When no layout is legal, a second pass over the chunks (only then: it costs as much as the first's rule
    checks): how many rules the closest layouts break, per rule how many of them break it, and the smallest DP
    among those whose batch it does not divide (see _closest)."""
    fewest, blockers, blocked_dp = 0, {}, 0
    for chunk in chunks(axes):
        _, t, _, near_split = _enumerated(chunk, model, workload, cluster, closest=True)
        near_screen = _screen(t, model, workload, cluster, p, tp_overlap_both=overlap_both, closest=True)[4]
        for near in (near_split, near_screen):
            if near is None or (fewest and near[0] > fewest):
                continue
            if not fewest or near[0] < fewest:
                fewest, blockers, blocked_dp = near[0], {}, 0
            _add(blockers, near[1])
            blocked_dp = min(filter(None, (blocked_dp, near[2])), default=0)  # 0: no such layout yet
    return fewest, blockers, blocked_dp


def explore(space: SearchSpace, model: ModelSpec, workload: Workload, cluster: ClusterSpec,
            calibration: Calibration | None = None) -> SpaceResult:
    """The space's funnel for this model and cluster. Combinations are enumerated and screened MAX_CHUNK rows
    at a time, so memory follows the layouts that can win, not the space's size (up to MAX_EXPLORED combinations)."""
    dims, rows_note = _rows_cap(space, workload)
    axes, size = _sized_axes(space, dims, model, cluster, MAX_EXPLORED)
    p = space.prune
    cal = calibration if calibration is not None else load_calibration(cluster.gpu.name)
    n = n_legal = practical = survivors = done = 0
    reasons: dict[str, int] = {f"illegal: {r.code}": 0 for r in RULES}  # in the rules' order
    later: dict[str, int] = {}
    oom = {"predicted OOM": 0, "predicted host OOM (offloaded optimizer)": 0}
    held: list[tuple[LayoutTable, MemoryResult, np.ndarray]] = []  # (rows, memory, tokens/s) that can win so far
    best = -np.inf
    overlap_both = len(set(space.dimensions.tp_comm_overlap)) > 1
    for chunk in chunks(axes):
        rows, t, r_split, _ = _enumerated(chunk, model, workload, cluster)
        done += int(np.prod([max(len(a), 1) for a in chunk]))
        legal, kept, r_legal, r_later, _ = _screen(t, model, workload, cluster, p, tp_overlap_both=overlap_both)
        n, n_legal = n + rows, n_legal + int(legal.sum())
        _add(reasons, r_split)
        _add(reasons, r_legal)
        _add(later, r_later)
        part = t.take(np.flatnonzero(kept))
        practical += len(part)
        if len(part):  # memory first, a chunk at a time: the time model runs only on what fits
            mem = estimate_memory(model, workload, cluster, part, cal.memory)
            gpu_fits = mem.peak <= mem.capacity_bytes * (1 - p.memory_margin)
            fits = gpu_fits & mem.host_fits
            oom["predicted OOM"] += int((~gpu_fits).sum())
            oom["predicted host OOM (offloaded optimizer)"] += int((gpu_fits & ~fits).sum())
            idx = np.flatnonzero(fits)
            part, mem = part.take(idx), mem.take(idx)
            survivors += len(part)
            if len(part):  # tokens/s TIME_CHUNK rows at a time; only the rows that can still win are held
                tps = np.concatenate([_tokens_per_s(model, workload, cluster, cal, part.take(sl), mem.take(sl))
                                      for sl in _slices(len(part), TIME_CHUNK)])
                if tps.max() > best:  # a new best: what it puts out of reach goes (it would not be kept at the end)
                    best = float(tps.max())
                    held = [(r.take(k), m.take(k), x[k]) for r, m, x in held
                            if len(k := np.flatnonzero(x >= p.keep_within * best))]
                k = np.flatnonzero(tps >= p.keep_within * best)
                if len(k):
                    held.append((part.take(k), mem.take(k), tps[k]))
        if (can_win := sum(len(h[0]) for h in held)) > MAX_EVALUATED:
            raise ConfigError(f"search space {space.source}: more than {MAX_EVALUATED:,} layouts of {model.name} on "
                              f"{cluster.count} x {cluster.gpu.name} are predicted within "
                              f"{1 - p.keep_within:.0%} of the best ({can_win:,} after {done:,} of {size:,} "
                              f"combinations), too many to hold at once (~1.5 KB each); list fewer values per "
                              "dimension or raise prune.keep_within")
    empty = part.take(np.array([], dtype=int))  # the table when nothing fits (no chunk left a row)
    reasons = {k: v for k, v in reasons.items() if v}
    funnel = [("enumerated", n), ("legal", n_legal)]
    last = later if n_legal and not practical else None  # what removed the final candidates
    reasons.update(later)
    notes = []
    if not cluster.has_deepep and "flex" in space.dimensions.dispatcher:
        notes.append("flex dispatcher dropped: DeepEP is not available on this cluster")
    if not cluster.has_hybridep and "hybridep" in space.dimensions.dispatcher:
        notes.append("hybridep dispatcher dropped: HybridEP (DeepEP's hybrid-ep branch) is not available on this "
                     "cluster")
    if not cluster.has_paged_stash and model.is_moe and "full" in space.dimensions.cuda_graphs:
        notes.append("full-iteration CUDA graphs of dropless layouts dropped: they run on megatron-core's paged stash "
                     "(--moe-paged-stash), which this cluster's megatron-core lacks; token drop keeps them")
    if not cluster.has_te and True in space.dimensions.precision_aware_optimizer:
        notes.append("precision-aware optimizer replaced by the plain distributed optimizer: Transformer Engine "
                     "is not available on this cluster")
    notes += [note for d in DIMENSIONS if (note := d.narrowed(list(getattr(space.dimensions, d.key)), model, cluster))]
    notes += [rows_note] if rows_note else []
    funnel.append(("supported and practical", practical))
    fewest, blockers, blocked_dp = _nearest_legal(axes, model, workload, cluster, p, overlap_both) if not n_legal \
        else (0, {}, 0)
    if last is None:
        last = dict(sorted(blockers.items(), key=lambda kv: -kv[1])) if blockers else dict(reasons)
    if not practical:
        return SpaceResult(space, n, funnel + [("fits", 0), ("kept", 0)], reasons, last,
                           empty, None, np.array([], dtype=int), notes, blocked_dp, fewest)
    reasons.update(oom)
    funnel.append(("fits", survivors))
    if not survivors:  # memory removed the last of them
        return SpaceResult(space, n, funnel + [("kept", 0)], {k: v for k, v in reasons.items() if v},
                           {k: v for k, v in oom.items() if v}, empty, None, np.array([], dtype=int), notes)
    # the rows that can win (held in enumeration order), evaluated whole
    reasons["cannot win (predicted below {:.0%} of the best)".format(p.keep_within)] = survivors - sum(
        len(h[0]) for h in held)
    table = LayoutTable.concat([h[0] for h in held])
    memory = MemoryResult.concat([h[1] for h in held], int(table.pp.max()))
    ev = evaluate(model, workload, cluster, table, cal, memory=memory)
    kept = np.argsort(-ev.time.tokens_per_s_per_gpu, kind="stable")
    funnel.append(("kept", int(len(kept))))
    if workload.global_batch < cluster.count:
        notes.append(small_batch_note(workload, cluster, float(ev.time.mfu[kept[0]])))
    note = full_graphs_note(space, model, workload, cluster, cal, table.row(int(kept[0])),
                            float(ev.time.tokens_per_s_per_gpu[kept[0]]))
    notes += [note] if note else []
    return SpaceResult(space, n, funnel, {k: v for k, v in reasons.items() if v}, last, table, ev, kept, notes)


FULL_GRAPHS_GAIN = 0.03  # a predicted gain worth a note (above the 2% trial noise the search assumes)


def full_graphs_note(space: SearchSpace, model: ModelSpec, workload: Workload, cluster: ClusterSpec, cal: Calibration,
                     best, best_tps: float) -> str | None:
    """What a space without full-iteration CUDA graphs leaves out for a dropless MoE model: its best layout on HybridEP
    with whole-step graphs (megatron-core's paged stash, Megatron-Bridge's fastest MoE recipes), when that is legal,
    fits, the cluster has both, and it is predicted FULL_GRAPHS_GAIN faster. Opting in stays the user's call: the
    paged stash needs a megatron-core after 0.16."""
    if (not model.is_moe or "full" in space.dimensions.cuda_graphs
            or not (cluster.has_paged_stash and cluster.has_hybridep) or best.moe_capacity_factor or best.ep * best.etp == 1):
        return None
    lay = best.with_(cuda_graphs="full", dispatcher="hybridep", ep_overlap=False, moe_shared_expert_overlap=False,
                     activation_offload_layers=0)  # settings Megatron refuses beside full graphs or on HybridEP
    t = LayoutTable.from_layouts([lay])
    if not all(bool(m[0]) for m in check(model, workload, t).values()):
        return None
    ev = evaluate(model, workload, cluster, t, cal)
    tps = float(ev.time.tokens_per_s_per_gpu[0])
    room = ev.memory.capacity_bytes * (1 - space.prune.memory_margin)  # the margin the space prunes by
    if not (ev.memory.host_fits[0] and ev.memory.peak[0] <= room) or tps < best_tps * (1 + FULL_GRAPHS_GAIN):
        return None
    return (f"not searched: full-iteration CUDA graphs on HybridEP (megatron-core's paged stash, as Megatron-Bridge's "
            f"fastest MoE recipes run): the best layout so is predicted {tps:,.0f} tokens/s/GPU ({tps / best_tps - 1:+.0%}); "
            "add full to the space's cuda_graphs (and hybridep to its dispatcher) to search it; it needs a megatron-core "
            "with --moe-paged-stash")


def small_batch_note(workload: Workload, cluster: ClusterSpec, best_mfu: float) -> str:
    """A global batch of fewer rows than GPUs: DP cannot exceed the rows, so every layout splits each row over
    count / rows GPUs or more, however small the model."""
    g, n = workload.global_batch, cluster.count
    return (f"--global-batch {g} rows on {n:,} GPUs: fewer rows per step than GPUs, so every layout splits each row "
            f"over at least {-(-n // g):,} GPUs (TP x CP x PP) and each GPU gets {g * workload.seq_len / n:,.0f} "
            f"tokens per step (best predicted MFU {best_mfu:.1%}); --global-batch {n} or more lets data "
            "parallelism use the GPUs")


def _tokens_per_s(model: ModelSpec, workload: Workload, cluster: ClusterSpec, cal: Calibration, rows: LayoutTable,
                  mem: MemoryResult) -> np.ndarray:
    """The time model's tokens/s/GPU of `rows`, their memory already estimated (all a row's terms are ~5 KB:
    575k rows at once held 3 GB, so callers pass TIME_CHUNK rows at a time)."""
    memory = MemoryResult.concat([mem], int(rows.pp.max()))  # the stage columns the time model reads
    return evaluate(model, workload, cluster, rows, cal, memory=memory).time.tokens_per_s_per_gpu


def _slices(n: int, size: int) -> list[np.ndarray]:
    """Row indices 0..n-1 in consecutive runs of at most `size`."""
    return [np.arange(i, min(i + size, n)) for i in range(0, n, size)]
