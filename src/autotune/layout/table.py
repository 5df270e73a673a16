"""LayoutTable: many layouts as columns of numpy arrays, for the vectorised rules and cost model.

A `Layout` is one row; `LayoutTable.from_layouts` and `.row(i)` convert. Categorical fields are small
integer codes (see DISPATCHERS, GRANULARITIES, METHODS in core.py); selective recompute modules are a
bitmask over SELECTIVE_MODULES. An uneven layer split is a code into a process-wide registry of
splits (`split_code` / `split_of`; 0 = Megatron's even split): the splits in use are few, the rows many.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .core import CUDA_GRAPHS, DISPATCHERS, GRANULARITIES, METHODS, OFFLOAD_MODULES, SELECTIVE_MODULES, Layout, Recompute

__all__ = ["LayoutTable", "split_code", "split_of"]

_INT_COLS = ("tp", "pp", "vpp", "cp", "ep", "etp", "rc_gran", "rc_method", "rc_layers", "rc_modules",
             "dispatcher", "max_tokens", "mbs", "split", "cuda_graphs", "act_offload", "off_modules")
_FLOAT_COLS = ("offload", "capacity")
_SPLITS: list[tuple[int, ...]] = [()]
_SPLIT_IDS: dict[tuple[int, ...], int] = {(): 0}


def split_code(layer_split: tuple[int, ...]) -> int:
    """The table code of a layer split (interned; 0 is the even split)."""
    key = tuple(layer_split)
    if key not in _SPLIT_IDS:
        _SPLIT_IDS[key] = len(_SPLITS)
        _SPLITS.append(key)
    return _SPLIT_IDS[key]


def split_of(code: int) -> tuple[int, ...]:
    return _SPLITS[int(code)]
_BOOL_COLS = ("sp", "dist_opt", "precision_aware", "shared_overlap", "ce_fusion", "overlap_grad", "overlap_param",
              "fsdp", "ep_overlap", "tp_comm_overlap")


@dataclass
class LayoutTable:
    world: int
    tp: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    sp: np.ndarray  # requested sequence parallel
    rc_gran: np.ndarray  # 0 none, 1 selective, 2 full
    rc_method: np.ndarray  # 0 uniform, 1 block
    rc_layers: np.ndarray
    rc_modules: np.ndarray  # bitmask over SELECTIVE_MODULES
    dispatcher: np.ndarray  # 0 alltoall, 1 allgather, 2 flex
    max_tokens: np.ndarray  # 0: not dynamic
    mbs: np.ndarray  # rows per micro-batch when not dynamic
    dist_opt: np.ndarray
    precision_aware: np.ndarray
    offload: np.ndarray  # float
    shared_overlap: np.ndarray
    ce_fusion: np.ndarray
    overlap_grad: np.ndarray
    overlap_param: np.ndarray
    split: np.ndarray  # layer split code (split_of); 0: even
    fsdp: np.ndarray  # Megatron FSDP (parameters and gradients sharded too)
    ep_overlap: np.ndarray  # EP all-to-all overlapped with another micro-batch's compute
    tp_comm_overlap: np.ndarray  # requested TP comm overlap (effective: `tp_overlap`)
    cuda_graphs: np.ndarray  # index into CUDA_GRAPHS
    capacity: np.ndarray  # float: MoE capacity factor, 0 = dropless
    act_offload: np.ndarray  # layers per pipeline chunk whose activations are offloaded
    off_modules: np.ndarray  # bitmask over OFFLOAD_MODULES: submodules whose inputs are offloaded (fine-grained)

    def __len__(self) -> int:
        return len(self.tp)

    # --- derived ---------------------------------------------------------------------------------
    @property
    def dp(self) -> np.ndarray:
        """DP per row (0 where TP x PP x CP does not divide the world). Computed once per table: the rules and
        the cost model read it dozens of times (a table's degree columns are never changed in place)."""
        key = (self.tp, self.pp, self.cp)  # the arrays themselves: a column replaced by another is a new key
        cached = self.__dict__.get("_dp")
        if cached is None or any(a is not b for a, b in zip(cached[0], key)):
            mp = self.tp * self.pp * self.cp
            cached = self.__dict__["_dp"] = (key, np.where(self.world % mp == 0, self.world // mp, 0))
        return cached[1]

    @property
    def edp(self) -> np.ndarray:
        g = self.ep * self.etp * self.pp
        return np.where(self.world % g == 0, self.world // g, 0)

    @property
    def sp_eff(self) -> np.ndarray:
        return self.sp & (self.tp > 1)

    @property
    def tp_overlap(self) -> np.ndarray:
        return self.tp_comm_overlap & self.sp_eff

    def rows_per_mb(self, seq_len: int) -> np.ndarray:
        local = np.maximum(1, seq_len // self.cp)
        return np.where(self.max_tokens > 0, np.maximum(1, self.max_tokens // local), np.maximum(1, self.mbs))

    def num_microbatches(self, global_batch: int, seq_len: int) -> np.ndarray:
        rows = global_batch // np.maximum(1, self.dp)
        r = self.rows_per_mb(seq_len)
        return np.maximum(1, -(-rows // r))

    # --- conversion ------------------------------------------------------------------------------
    @classmethod
    def from_layouts(cls, layouts: list[Layout]) -> "LayoutTable":
        if not layouts:
            raise ValueError("LayoutTable needs at least one layout")
        world = layouts[0].world
        if any(lay.world != world for lay in layouts):
            raise ValueError("all layouts of one table share the world size")
        rows = [_encode(lay) for lay in layouts]
        cols = {k: np.array([r[k] for r in rows]) for k in rows[0]}
        return cls(world=world, **cols)

    @classmethod
    def from_columns(cls, world: int, n: int, **cols) -> "LayoutTable":
        """Columns given as arrays or scalars (broadcast); the rest take Layout's defaults."""
        base = _encode(Layout(world=world))
        out = {}
        for k, default in base.items():
            v = cols.pop(k, default)
            dtype = bool if k in _BOOL_COLS else (float if k in _FLOAT_COLS else np.int64)
            if isinstance(v, np.ndarray) and v.shape == (n,) and v.dtype == dtype and v.flags.owndata:
                out[k] = v  # a fresh column of the right kind (space enumeration builds 10^6-row ones): no copy
            else:
                out[k] = np.broadcast_to(np.asarray(v, dtype=dtype), (n,)).copy()
        if cols:
            raise TypeError(f"unknown LayoutTable columns: {sorted(cols)}")
        return cls(world=world, **out)

    @classmethod
    def concat(cls, parts: list["LayoutTable"]) -> "LayoutTable":
        """The rows of `parts` in order, as one table (all parts share the world size)."""
        if not parts or any(p.world != parts[0].world for p in parts):
            raise ValueError("LayoutTable.concat needs at least one table, all of one world size")
        kw = {f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls) if f.name != "world"}
        return cls(world=parts[0].world, **kw)

    def take(self, idx) -> "LayoutTable":
        kw = {f.name: getattr(self, f.name)[idx] for f in fields(self) if f.name != "world"}
        return LayoutTable(world=self.world, **kw)

    def row(self, i: int) -> Layout:
        g = int(self.rc_gran[i])
        mods = tuple(m for b, m in enumerate(SELECTIVE_MODULES) if int(self.rc_modules[i]) >> b & 1)
        rc = Recompute(
            GRANULARITIES[g],  # type: ignore[arg-type]
            METHODS[int(self.rc_method[i])] if g == 2 else None,  # type: ignore[arg-type]
            int(self.rc_layers[i]) if g == 2 else None,
            mods if g == 1 else (),
        )
        return Layout(
            world=self.world,
            tp=int(self.tp[i]), pp=int(self.pp[i]), vpp=int(self.vpp[i]), cp=int(self.cp[i]),
            ep=int(self.ep[i]), etp=int(self.etp[i]), sequence_parallel=bool(self.sp[i]), recompute=rc,
            dispatcher=DISPATCHERS[int(self.dispatcher[i])],  # type: ignore[arg-type]
            max_tokens_per_gpu=int(self.max_tokens[i]) if self.max_tokens[i] > 0 else None,
            micro_batch_size=None if self.max_tokens[i] > 0 else int(self.mbs[i]),
            distributed_optimizer=bool(self.dist_opt[i]), precision_aware_optimizer=bool(self.precision_aware[i]),
            optimizer_offload=float(self.offload[i]), moe_shared_expert_overlap=bool(self.shared_overlap[i]),
            cross_entropy_fusion=bool(self.ce_fusion[i]), overlap_grad_reduce=bool(self.overlap_grad[i]),
            overlap_param_gather=bool(self.overlap_param[i]), layer_split=split_of(self.split[i]),
            fsdp=bool(self.fsdp[i]), ep_overlap=bool(self.ep_overlap[i]), tp_comm_overlap=bool(self.tp_comm_overlap[i]),
            cuda_graphs=CUDA_GRAPHS[int(self.cuda_graphs[i])],  # type: ignore[arg-type]
            moe_capacity_factor=float(self.capacity[i]), activation_offload_layers=int(self.act_offload[i]),
            offload_modules=tuple(m for b, m in enumerate(OFFLOAD_MODULES) if int(self.off_modules[i]) >> b & 1),
        )


def _encode(lay: Layout) -> dict:
    rc = lay.recompute
    return dict(
        tp=lay.tp, pp=lay.pp, vpp=lay.vpp, cp=lay.cp, ep=lay.ep, etp=lay.etp, sp=lay.sequence_parallel,
        rc_gran=GRANULARITIES.index(rc.granularity),
        rc_method=METHODS.index(rc.method) if rc.method else 0,
        rc_layers=rc.num_layers or 0,
        rc_modules=sum(1 << SELECTIVE_MODULES.index(m) for m in rc.modules),
        dispatcher=DISPATCHERS.index(lay.dispatcher),
        max_tokens=lay.max_tokens_per_gpu or 0,
        mbs=lay.micro_batch_size or 1,
        dist_opt=lay.distributed_optimizer, precision_aware=lay.precision_aware_optimizer,
        offload=float(lay.optimizer_offload), shared_overlap=lay.moe_shared_expert_overlap,
        ce_fusion=lay.cross_entropy_fusion, overlap_grad=lay.overlap_grad_reduce,
        overlap_param=lay.overlap_param_gather, split=split_code(lay.layer_split),
        fsdp=lay.fsdp, ep_overlap=lay.ep_overlap, tp_comm_overlap=lay.tp_comm_overlap,
        cuda_graphs=CUDA_GRAPHS.index(lay.cuda_graphs), capacity=float(lay.moe_capacity_factor),
        act_offload=lay.activation_offload_layers,
        off_modules=sum(1 << OFFLOAD_MODULES.index(m) for m in lay.offload_modules),
    )
