"""Token rows for a trial: seeded synthetic rows or rows cut from a pretokenized .npy file.

A step's rows are numbered globally (row g of step s), so every layout of the same trial sees the
same tokens: DP rank d takes rows [d * R, (d + 1) * R) of the step, where R = micro-batches x rows per
micro-batch. That is what makes loss curves of different layouts comparable.

Synthetic rows are learnable on purpose, so that a few steps show a falling loss: each row follows
t[i+1] = (a * t[i] + b) mod V, with one token in eight replaced by a random one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["RowSource", "SyntheticRows", "NpyRows", "make_source"]

_NOISE = 1 / 8


class RowSource:
    """Rows of seq_len + 1 token ids (inputs and shifted labels) for (step, global row)."""

    def rows(self, step: int, first: int, count: int) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError


class SyntheticRows(RowSource):
    def __init__(self, vocab_size: int, seq_len: int, seed: int):
        self.vocab, self.seq_len, self.seed = vocab_size, seq_len, seed
        rng = np.random.default_rng([seed, 0])
        # An odd multiplier is a bijection mod a power-of-two vocabulary; any V works well enough.
        self.a = int(rng.integers(1, max(2, vocab_size // 2))) * 2 + 1
        self.b = int(rng.integers(0, vocab_size))

    def _row(self, step: int, row: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 1, step, row])
        n = self.seq_len + 1
        noise = rng.random(n) < _NOISE
        random = rng.integers(0, self.vocab, n)
        out = np.empty(n, dtype=np.int64)
        out[0] = random[0]
        for i in range(1, n):  # a short Python loop: rows are a few thousand tokens
            out[i] = random[i] if noise[i] else (self.a * out[i - 1] + self.b) % self.vocab
        return out

    def rows(self, step: int, first: int, count: int) -> np.ndarray:
        return np.stack([self._row(step, first + r) for r in range(count)])


class NpyRows(RowSource):
    """A .npy of token ids: 2-D (rows, >= seq_len + 1) or 1-D (a token stream cut into rows)."""

    def __init__(self, path: Path, seq_len: int, vocab_size: int, rows_per_step: int):
        arr = np.load(path, mmap_mode="r")
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"dataset {path}: token ids must be integers, found {arr.dtype}")
        n = seq_len + 1
        if arr.ndim == 1:
            arr = arr[: len(arr) // n * n].reshape(-1, n)
        elif arr.ndim != 2 or arr.shape[1] < n:
            raise ValueError(f"dataset {path}: need rows of at least {n} tokens (seq_len + 1), shape is {arr.shape}")
        if len(arr) == 0:
            raise ValueError(f"dataset {path}: fewer than {n} tokens")
        self.arr, self.n, self.vocab, self.rows_per_step, self.path = arr, n, vocab_size, rows_per_step, path

    def rows(self, step: int, first: int, count: int) -> np.ndarray:
        idx = [(step * self.rows_per_step + first + r) % len(self.arr) for r in range(count)]
        out = np.asarray(self.arr[idx, : self.n], dtype=np.int64)
        if out.min() < 0 or out.max() >= self.vocab:
            raise ValueError(f"dataset {self.path}: token id {int(out.max())} outside the vocabulary of {self.vocab}")
        return out


def make_source(plan) -> RowSource:
    seq = plan.workload.seq_len
    if plan.data_path is not None:
        return NpyRows(plan.data_path, seq, plan.model.vocab_size, plan.rows_per_step)
    return SyntheticRows(plan.model.vocab_size, seq, plan.spec.seed)
