"""Large tables are priced in groups of equal pipeline depth, then put back in their order.

Both models hold per-stage arrays of shape (n, S), S the table's largest PP, so a PP1 row of a table that also holds
PP16 rows is priced over 16 stage columns, 15 of them never read. A search space mixes PP 1 to 16 about evenly: over
the bench's 105,840 layouts (bench/memory_speed.py) the padding was more than half of the work. Pricing each group
of rows at its own PP and scattering the results back gives the same numbers for every row (each row's terms depend
on that row alone; tests/cost/test_groups.py compares both ways on spaces with uneven layer splits, FP8, offload)
in about half the time.

Grouping pays only on large tables: a group costs a few milliseconds of Python however few its rows, so a table under
GROUP_MIN_ROWS is priced whole, and PP values with fewer than GROUP_MIN_SIZE rows join the next deeper group.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["pp_groups", "scatter_rows", "per_row_view", "LazyRows", "GROUP_MIN_ROWS", "GROUP_MIN_SIZE"]

GROUP_MIN_ROWS = 4096  # tables smaller than this are priced whole
GROUP_MIN_SIZE = 1024  # a PP value with fewer rows is priced with the next deeper PP's


def pp_groups(pp: np.ndarray, min_rows: int | None = None, min_size: int | None = None) -> list[np.ndarray] | None:
    """Row indices (ascending) of each group of rows priced together, shallowest PP first, or None when the table
    is better priced whole (small, or one PP). The thresholds default to the module's (read at each call)."""
    pp = np.asarray(pp)
    min_rows = GROUP_MIN_ROWS if min_rows is None else min_rows
    min_size = GROUP_MIN_SIZE if min_size is None else min_size
    if len(pp) < min_rows:
        return None
    values, inverse, counts = np.unique(pp, return_inverse=True, return_counts=True)
    if len(values) < 2:
        return None
    bounds, size = [], 0  # one past the last PP value of each group
    for v, c in enumerate(counts):
        size += c
        if size >= min_size:
            bounds.append(v + 1)
            size = 0
    if size:  # the deepest values' rows, too few alone, join the last group
        if not bounds:
            return None
        bounds[-1] = len(values)
    if len(bounds) < 2:
        return None
    group_of = np.searchsorted(np.array(bounds), inverse, side="right")
    order = np.argsort(group_of, kind="stable")
    return np.split(order, np.cumsum(np.bincount(group_of, minlength=len(bounds)))[:-1])


def per_row_view(a) -> bool:
    """A (n, S) array that is one value per row broadcast over the stages (the memory model's views)."""
    return isinstance(a, np.ndarray) and a.ndim == 2 and a.shape[1] > 0 and a.strides[1] == 0


def scatter_rows(parts: list, groups: list[np.ndarray], n: int, S: int | None = None):
    """One array over the table's n rows from each group's array (or scalar): (n,) from 1-D parts, (n, S) from
    (n_g, S_g) parts, S_g <= S, zero beyond S_g (beyond each row's PP, which nothing reads). Per-row broadcast
    parts give a per-row broadcast result; scalars equal in every group stay that scalar."""
    if all(np.ndim(p) == 0 for p in parts) and all(float(p) == float(parts[0]) for p in parts):
        return parts[0]
    if S is None:
        out = np.empty(n, dtype=np.result_type(*[np.asarray(p) for p in parts]))
        for p, g in zip(parts, groups):
            out[g] = p
        return out
    if all(per_row_view(p) for p in parts):
        col = np.empty(n)
        for p, g in zip(parts, groups):
            col[g] = p[:, 0]
        return np.broadcast_to(col[:, None], (n, S))
    out = np.zeros((n, S))
    for p, g in zip(parts, groups):
        if np.ndim(p) == 0:
            out[g, :] = p  # a scalar term (the value nothing in the group has) over its group's rows
            continue
        p = np.asarray(p)
        w = min(p.shape[1], S)
        out[g, :w] = np.broadcast_to(p, (len(g), p.shape[1]))[:, :w]
    return out


class LazyRows(Mapping):
    """A mapping of (n, S) arrays scattered from the groups' mappings on first access (the time model's
    per-micro-batch terms: the search never reads them, so 10^5 rows x 20 terms are not copied unless asked for)."""

    def __init__(self, parts: list, groups: list[np.ndarray], n: int, S: int):
        self._parts, self._groups, self._n, self._S = parts, groups, n, S
        self._keys = list(parts[0].keys())
        self._done: dict = {}

    def __getitem__(self, k):
        if k not in self._done:
            if k not in self._keys:
                raise KeyError(k)
            self._done[k] = scatter_rows([p[k] for p in self._parts], self._groups, self._n, self._S)
        return self._done[k]

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)
