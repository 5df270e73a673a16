"""The searched dimensions: one table, and everything that loops over it.

Each `Dimension` says, for one thing the search varies: its name (the search-space key under
`dimensions:` and the Optuna study parameter), the Layout field it sets, the LayoutTable columns it fills,
how a Layout encodes to a parameter value and back, how a column of the table reads as parameter values
(vectorised), and the integer feature columns the residual model regresses on. Space enumeration,
LayoutTable parameters, study parameters, layout keys, the Optuna planner's decode and the residual
features all come from `DIMENSIONS`, so a dimension added here is searched, stored, keyed and learnt
everywhere at once. Pure numpy: no torch, no ray.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .axes import (capacity_axis, graphs_axis, graphs_narrowed, moe_dispatcher_axis, moe_flag_axis, offload_bits,
                   offload_modules_axis, offload_modules_narrowed, offload_text, precision_aware_axis, recompute_axis,
                   shared_overlap_axis, te_flag_axis, te_narrowed)
from .core import CUDA_GRAPHS, DISPATCHERS, GRANULARITIES, METHODS, SELECTIVE_MODULES, Layout, Recompute
from .splits import legal_splits, parse_split, split_text
from .table import LayoutTable, split_code, split_of

__all__ = ["Dimension", "DIMENSIONS", "PARAM_NAMES", "layout_params", "layout_from_params", "layout_key",
           "table_params", "table_keys", "feature_columns", "grid_axes", "grid_columns", "expand_splits", "split_counts",
           "SPLIT_CHOICES", "UNEVEN"]


@dataclass(frozen=True)
class Dimension:
    name: str  # search-space key (except `space_key`) and Optuna study parameter
    field: str  # the Layout attribute it sets
    kind: type  # the parameter's Python type: int, bool, float or str
    encode: Callable[[Layout], Any]  # Layout -> parameter value (a JSON scalar)
    decode: Callable[[Any], dict]  # parameter value -> Layout keyword arguments
    values: Callable[[LayoutTable], np.ndarray]  # table -> parameter value per row
    features: Callable[[LayoutTable], list[np.ndarray]]  # table -> integer feature columns (residual model)
    axis: Callable[[list, Any, Any], list]  # (space values, model, cluster) -> values enumerated
    columns: Callable[[np.ndarray, dict, Any], dict]  # (axis values per row, all axes, workload) -> table columns
    default: tuple = ()  # the search-space value when a space does not name the dimension
    space_key: str | None = None  # the search-space key when it differs from `name`
    bounds: tuple[float, float] | None = None  # float dimensions: the values a space may give
    # (space values, model, cluster) -> why the cluster or model narrows the values, or None (space notes)
    narrowed: Callable[[list, Any, Any], str | None] = lambda vals, model, cluster: None

    @property
    def key(self) -> str:
        """The search-space key (`dimensions:` in search_spaces/*.yaml)."""
        return self.space_key or self.name


def _degree(name: str, moe_only: bool = False) -> Dimension:
    return Dimension(
        name=name, field=name, kind=int,
        encode=lambda lay: getattr(lay, name),
        decode=lambda v: {name: int(v)},
        values=lambda t: getattr(t, name),
        features=lambda t: [getattr(t, name)],
        axis=(lambda vals, model, cluster: vals if model.is_moe else [1]) if moe_only else (lambda vals, m, c: vals),
        columns=lambda v, grid, wl: {name: v},
        default=(1,),
    )


def _flag(name: str, field: str, column: str, default: bool, axis=None, narrowed=None) -> Dimension:
    return Dimension(
        name=name, field=field, kind=bool,
        encode=lambda lay: bool(getattr(lay, field)),
        decode=lambda v: {field: bool(v)},
        values=lambda t: getattr(t, column),
        features=lambda t: [getattr(t, column).astype(int)],
        axis=axis or (lambda vals, m, c: vals),
        columns=lambda v, grid, wl: {column: v.astype(bool)},
        default=(default,),
        **({"narrowed": narrowed} if narrowed else {}),
    )


# recompute: a string in spaces and studies ("full:uniform:2"), four codes in the table
def _rc_codes(text: str) -> tuple[int, int, int, int]:
    rc = Recompute.parse(text)
    mods = sum(1 << SELECTIVE_MODULES.index(m) for m in rc.modules)
    return GRANULARITIES.index(rc.granularity), METHODS.index(rc.method) if rc.method else 0, rc.num_layers or 0, mods


def _rc_text(gran: int, method: int, layers: int, mods: int) -> str:
    return str(Recompute(
        GRANULARITIES[gran],  # type: ignore[arg-type]
        METHODS[method] if gran == 2 else None,  # type: ignore[arg-type]
        layers if gran == 2 else None,
        tuple(m for b, m in enumerate(SELECTIVE_MODULES) if mods >> b & 1) if gran == 1 else ()))


def _rc_values(t: LayoutTable) -> np.ndarray:
    codes = np.stack([t.rc_gran, t.rc_method, t.rc_layers, t.rc_modules], 1).astype(np.int64)
    uniq, inv = np.unique(codes, axis=0, return_inverse=True)
    return np.array([_rc_text(*map(int, u)) for u in uniq], dtype=object)[inv.reshape(-1)]


def _index_of(choices: list[str], v: np.ndarray) -> np.ndarray:
    """Position in `choices` of each string of `v` (vectorised over the distinct values)."""
    pos = {x: i for i, x in enumerate(choices)}
    uniq, inv = np.unique(v.astype(str), return_inverse=True)
    return np.array([pos[u] for u in uniq.tolist()], dtype=np.int64)[inv.reshape(-1)]


def _rc_columns(v: np.ndarray, grid: dict, wl) -> dict:
    texts = list(dict.fromkeys(v.tolist()))
    rc = np.array([_rc_codes(x) for x in texts], dtype=np.int64)[_index_of(texts, v)]
    return {"rc_gran": rc[:, 0], "rc_method": rc[:, 1], "rc_layers": rc[:, 2], "rc_modules": rc[:, 3]}


def _dispatcher_values(t: LayoutTable) -> np.ndarray:
    return np.array(DISPATCHERS, dtype=object)[t.dispatcher.astype(int)]


def _max_tokens_columns(rows: np.ndarray, grid: dict, wl) -> dict:
    cp = grid["cp"]
    return {"max_tokens": (rows.astype(np.int64) * wl.seq_len // cp.astype(np.int64)).astype(np.int64)}


# layer splits: the space says "even" (Megatron's default: PP x VPP divides the layers) and/or "uneven" (where they do
# not divide, every split Megatron accepts: splits.legal_splits); a table row holds one concrete split (its code)
SPLIT_CHOICES = ("even", "uneven")
UNEVEN = -1  # the split column of an enumerated "uneven" row before expand_splits gives it its splits


def _offload_values(t: LayoutTable) -> np.ndarray:
    """The offload_modules value per row (a bitmask's text, computed once per distinct mask)."""
    masks, inv = np.unique(t.off_modules, return_inverse=True)
    return np.array([offload_text(m) for m in masks], dtype=object)[inv.ravel()]


def _offload_columns(v: np.ndarray, grid: dict, wl) -> dict:
    """The off_modules bitmask of each row's value (vectorised over the distinct values)."""
    uniq, inv = np.unique(np.asarray(v).astype(str), return_inverse=True)
    return {"off_modules": np.array([offload_bits(u) for u in uniq.tolist()], dtype=np.int64)[inv.reshape(-1)]}


def _split_values(t: LayoutTable) -> np.ndarray:
    uniq, inv = np.unique(t.split, return_inverse=True)
    return np.array([split_text(split_of(int(c))) for c in uniq], dtype=object)[inv.reshape(-1)]


def _split_options(cols: dict, todo: np.ndarray, num_layers: int) -> tuple[np.ndarray, list[list[int]]]:
    """For the "uneven" rows (`todo`): each one's (PP, VPP) group, and per group the codes of the splits Megatron
    accepts there (splits.legal_splits; none where the layers divide evenly)."""
    key = cols["pp"].astype(np.int64) * 4096 + cols["vpp"].astype(np.int64)  # (PP, VPP) as one integer
    pairs, group = np.unique(key[todo], return_inverse=True)
    options = [[split_code(s) for s in legal_splits(num_layers, int(k) // 4096, int(k) % 4096)] for k in pairs]
    return group.reshape(-1), options


def split_counts(cols: dict, num_layers: int) -> np.ndarray:
    """How many rows each enumerated row becomes: 1, or for an "uneven" row the number of splits Megatron accepts
    for its (PP, VPP) (0 when its layers divide evenly: the even row covers it)."""
    todo = cols["split"] == UNEVEN
    out = np.ones(len(todo), dtype=np.int64)
    if todo.any():
        group, options = _split_options(cols, todo, num_layers)
        out[todo] = np.array([len(o) for o in options], dtype=np.int64)[group]
    return out


def expand_splits(n: int, cols: dict, num_layers: int) -> tuple[int, dict]:
    """Rows enumerated as "uneven" (split column UNEVEN), each replaced by one row per split Megatron accepts for
    its (PP, VPP) (splits.legal_splits), in enumeration order; a row whose layers divide evenly, or that no
    split places, has none and goes (the even row covers the first; the second is illegal either way)."""
    split = cols["split"]
    todo = split == UNEVEN
    if not todo.any():
        return n, cols
    group, options = _split_options(cols, todo, num_layers)
    width = max(1, max(len(o) for o in options))
    codes = np.array([o + [0] * (width - len(o)) for o in options], dtype=np.int64).reshape(len(options), width)
    g = np.zeros(n, dtype=np.int64)
    g[todo] = group
    counts = np.where(todo, np.array([len(o) for o in options], dtype=np.int64)[g], 1)
    idx = np.repeat(np.arange(n), counts)
    copy = np.arange(len(idx)) - np.repeat(np.cumsum(counts) - counts, counts)  # which of its row's copies
    out = {k: np.asarray(v)[idx] for k, v in cols.items()}
    out["split"] = np.where(todo[idx], codes[g[idx], copy], split[idx])
    return len(idx), out


def _float_dim(name: str, field: str, column: str, default: float, bounds, axis) -> Dimension:
    return Dimension(
        name=name, field=field, kind=float,
        encode=lambda lay: float(getattr(lay, field)),
        decode=lambda v: {field: float(v)},
        values=lambda t: getattr(t, column),
        features=lambda t: [np.round(getattr(t, column) * 1000).astype(np.int64)],
        axis=axis,
        columns=lambda v, grid, wl: {column: v.astype(float)},
        default=(default,), bounds=bounds,
    )


DIMENSIONS: tuple[Dimension, ...] = (
    _degree("tp"), _degree("pp"), _degree("vpp"), _degree("cp"),
    _degree("ep", moe_only=True), _degree("etp", moe_only=True),
    Dimension(
        name="recompute", field="recompute", kind=str,
        encode=lambda lay: str(lay.recompute),
        decode=lambda v: {"recompute": Recompute.parse(v)},
        values=_rc_values,
        # the recompute choice folded into one code, and the selective modules as a bitmask
        features=lambda t: [t.rc_gran * 10000 + t.rc_method * 1000 + t.rc_layers * 10, t.rc_modules],
        axis=recompute_axis,
        columns=_rc_columns,
        default=("none",),
    ),
    Dimension(
        name="dispatcher", field="dispatcher", kind=str,
        encode=lambda lay: lay.dispatcher,
        decode=lambda v: {"dispatcher": str(v)},
        values=_dispatcher_values,
        features=lambda t: [t.dispatcher],
        axis=moe_dispatcher_axis,
        columns=lambda v, grid, wl: {"dispatcher": _index_of(list(DISPATCHERS), v)},
        default=("alltoall",),
    ),
    Dimension(
        name="max_tokens_per_gpu", field="max_tokens_per_gpu", kind=int, space_key="rows_per_microbatch",
        encode=lambda lay: lay.max_tokens_per_gpu or 0,
        decode=lambda v: {"max_tokens_per_gpu": int(v) or None, "micro_batch_size": None if v else 1},
        values=lambda t: t.max_tokens,
        features=lambda t: [t.max_tokens],
        axis=lambda vals, m, c: vals,
        columns=_max_tokens_columns,
        default=(1,),
    ),
    _flag("distributed_optimizer", "distributed_optimizer", "dist_opt", True),
    _flag("precision_aware_optimizer", "precision_aware_optimizer", "precision_aware", False,
          axis=precision_aware_axis),
    _flag("moe_shared_expert_overlap", "moe_shared_expert_overlap", "shared_overlap", False,
          axis=shared_overlap_axis),
    _float_dim("optimizer_offload", "optimizer_offload", "offload", 0.0, (0.0, 1.0), lambda vals, m, c: vals),
    _flag("ep_overlap", "ep_overlap", "ep_overlap", False, axis=moe_flag_axis),
    _flag("tp_comm_overlap", "tp_comm_overlap", "tp_comm_overlap", False, axis=te_flag_axis,
          narrowed=te_narrowed("TP communication overlap (--tp-comm-overlap)")),
    Dimension(
        name="cuda_graphs", field="cuda_graphs", kind=str,
        encode=lambda lay: lay.cuda_graphs,
        decode=lambda v: {"cuda_graphs": str(v)},
        values=lambda t: np.array(CUDA_GRAPHS, dtype=object)[t.cuda_graphs.astype(int)],
        features=lambda t: [t.cuda_graphs],
        axis=graphs_axis,
        columns=lambda v, grid, wl: {"cuda_graphs": _index_of(list(CUDA_GRAPHS), v)},
        default=("none",), narrowed=graphs_narrowed,
    ),
    _float_dim("moe_capacity_factor", "moe_capacity_factor", "capacity", 0.0, (0.0, 8.0), capacity_axis),
    Dimension(
        name="layer_split", field="layer_split", kind=str,
        encode=lambda lay: split_text(lay.layer_split),
        decode=lambda v: {"layer_split": parse_split(v)},
        values=_split_values,
        features=lambda t: [(t.split > 0).astype(np.int64)],  # an uneven split (which one is the PP and VPP's)
        axis=lambda vals, m, c: vals,
        columns=lambda v, grid, wl: {"split": np.where(np.asarray(v) == "uneven", UNEVEN, 0).astype(np.int64)},
        default=("even",),
    ),
    Dimension(
        name="activation_offload_layers", field="activation_offload_layers", kind=int,
        encode=lambda lay: lay.activation_offload_layers,
        decode=lambda v: {"activation_offload_layers": int(v)},
        values=lambda t: t.act_offload, features=lambda t: [t.act_offload], axis=lambda vals, m, c: vals,
        columns=lambda v, grid, wl: {"act_offload": v.astype(np.int64)}, default=(0,), bounds=(0, 10_000),
    ),
    Dimension(  # fine-grained activation offloading: "none", or the modules whose inputs go to host memory
        name="offload_modules", field="offload_modules", kind=str,
        encode=lambda lay: ",".join(lay.offload_modules) or "none",  # Layout keeps OFFLOAD_MODULES' order
        decode=lambda v: {"offload_modules": tuple(m for m in str(v).split(",") if m and m != "none")},
        values=_offload_values, features=lambda t: [t.off_modules], axis=offload_modules_axis,
        columns=_offload_columns,
        default=("none",), narrowed=offload_modules_narrowed,
    ),
)

PARAM_NAMES: tuple[str, ...] = tuple(d.name for d in DIMENSIONS)


def layout_params(lay: Layout) -> dict:
    """The study parameters of a layout: one value per searched dimension."""
    return {d.name: d.encode(lay) for d in DIMENSIONS}


def layout_from_params(world: int, params: dict) -> Layout:
    """The Layout a set of study parameters names (dimensions not given keep Layout's defaults)."""
    kw: dict = {}
    for d in DIMENSIONS:
        if d.name in params:
            kw.update(d.decode(params[d.name]))
    return Layout(world=world, **kw)


def layout_key(lay: Layout) -> str:
    """Identity of a layout for 'already tried' bookkeeping: its parameters over every dimension."""
    return json.dumps(layout_params(lay), sort_keys=True)


def table_params(t: LayoutTable) -> dict[str, np.ndarray]:
    """Each dimension's parameter values per row, as arrays (vectorised)."""
    return {d.name: d.values(t) for d in DIMENSIONS}


def _py(kind: type, v):
    return kind(v.item() if hasattr(v, "item") else v)


def table_keys(t: LayoutTable) -> list[str]:
    """layout_key of every row, equal to layout_key(t.row(i)), without building the Layouts."""
    cols = table_params(t)
    names = sorted(cols)
    kinds = {d.name: d.kind for d in DIMENSIONS}
    # distinct value tuples are few; build each key string once
    stacked = [cols[n] for n in names]
    out = []
    cache: dict[tuple, str] = {}
    for row in zip(*stacked):
        k = tuple(row)
        s = cache.get(k)
        if s is None:
            s = json.dumps({n: _py(kinds[n], v) for n, v in zip(names, row)}, sort_keys=True)
            cache[k] = s
        out.append(s)
    return out


def feature_columns(t: LayoutTable) -> list[np.ndarray]:
    """The layout features the residual model and planners reason about, one integer column each."""
    return [c for d in DIMENSIONS for c in d.features(t)]


def grid_axes(space_values: dict, model, cluster) -> list[list]:
    """Per dimension, the values enumerated for this model and cluster (from the space's values)."""
    return [list(d.axis(list(space_values[d.key]), model, cluster)) for d in DIMENSIONS]


def grid_columns(axes: list[list], workload, num_layers: int | None = None) -> tuple[int, dict]:
    """Every combination of `axes` as LayoutTable columns: (rows, {column: array}). Row r takes value
    (r // stride_j) % len(axis_j) of axis j (C order, the last axis fastest), built by repeat-and-tile of each
    axis's few values, not an (rows x axes) index table (10^6 rows x 18 axes is the slow part). With the model's
    `num_layers`, "uneven" layer splits become one row per split Megatron accepts (expand_splits); without it they
    stay one row each, split column UNEVEN (space.explore expands them once the other rules have passed them)."""
    sizes = [max(len(a), 1) for a in axes]
    n = int(np.prod(sizes))
    strides = [int(np.prod(sizes[j + 1:])) for j in range(len(sizes))]

    def spread(values: np.ndarray, j: int) -> np.ndarray:
        return np.tile(np.repeat(values, strides[j]), n // (sizes[j] * strides[j]))

    numeric = {d.name: spread(np.asarray(a), j) for j, (d, a) in enumerate(zip(DIMENSIONS, axes)) if d.kind is not str}
    cols: dict = {}
    for j, (d, a) in enumerate(zip(DIMENSIONS, axes)):
        if d.kind is str:  # encode the few distinct strings once, then spread per row
            small = d.columns(np.asarray(a, dtype=object), {}, workload)
            cols.update({k: spread(np.asarray(v), j) for k, v in small.items()})
        else:
            cols.update(d.columns(numeric[d.name], numeric, workload))
    if num_layers is not None and "split" in cols and (cols["split"] == UNEVEN).any():
        return expand_splits(n, cols, num_layers)
    return n, cols
