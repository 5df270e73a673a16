"""Accuracy of the throughput model against measured rows: the seed page and the public table.

For every row the model can represent (cost.measurements): measured tokens/s/GPU, the uncalibrated
prediction (factors 1), the shipped calibration's prediction and its error. Then: MAPE over the BF16
Hopper rows (every row, and once per distinct configuration so container-version repeats do not count
five times), Spearman rank correlation per model with >= 3 rows (numpy ranks, ties averaged), the seed
rows and their order, and a leave-one-model-out check: refit without a model's rows and predict them
(how wrong the calibration is on a model it has never seen). Skipped rows are counted by reason.

    python bench/throughput_accuracy.py [--csv PATH] [--no-lomo]
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict

import numpy as np

from autotune.cost.calibrate import (Calibration, fit_kinds, load_calibration, predict, published_measurements,
                                     seed_measurements)

HOPPER = ("H100", "H200")


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank."""
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x))
    r[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        tie = x == v
        r[tie] = r[tie].mean()
    return r


def spearman(a, b) -> float:
    ra, rb = ranks(np.asarray(a, float)), ranks(np.asarray(b, float))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def by_kind(rows, cal_of) -> np.ndarray:
    out = np.zeros(len(rows))
    for kind in {m.gpu for m in rows}:
        idx = [i for i, m in enumerate(rows) if m.gpu == kind]
        out[idx] = predict([rows[i] for i in idx], cal_of(kind))
    return out


def lomo(rows) -> np.ndarray:
    """Leave-one-model-out predictions: calibrate without the model's rows, predict them."""
    out = np.zeros(len(rows))
    for model in {m.model for m in rows}:
        cals = fit_kinds([m for m in rows if m.model != model], sorted({m.gpu for m in rows}))
        idx = [i for i, m in enumerate(rows) if m.model == model]
        for i in idx:
            out[i] = predict([rows[i]], cals.get(rows[i].gpu, Calibration(rows[i].gpu)))[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=None, help="published table (default: the shipped copy)")
    ap.add_argument("--no-lomo", action="store_true", help="skip the leave-one-model-out refits")
    args = ap.parse_args()
    kept, skipped = published_measurements(args.csv)
    rows = seed_measurements() + kept
    meas = np.array([m.tokens_per_s_per_gpu for m in rows])
    raw = by_kind(rows, Calibration)
    cal = by_kind(rows, load_calibration)
    out = np.full(len(rows), np.nan) if args.no_lomo else lomo(rows)
    err = lambda p: 100 * (p / meas - 1)  # noqa: E731
    print(f"{'row':<58}{'gpu':>5}{'measured':>10}{'uncal':>8}{'err%':>7}{'pred':>8}{'err%':>7}{'LOMO%':>7}  source")
    for i, m in enumerate(rows):
        print(f"{m.label()[:57]:<58}{m.gpu:>5}{meas[i]:>10,.0f}{raw[i]:>8,.0f}{err(raw)[i]:>+7.1f}{cal[i]:>8,.0f}"
              f"{err(cal)[i]:>+7.1f}{err(out)[i]:>+7.1f}  {m.source.split(';')[0][:48]}")
    hop = np.array([m.gpu in HOPPER for m in rows])
    keys = [(m.model, m.gpu, m.count, m.seq_len, m.global_batch, m.layout) for m in rows]
    first = np.array([keys.index(k) == i for i, k in enumerate(keys)])

    def mape(p, mask):
        return float(np.mean(np.abs(err(p)[mask]))) if mask.any() else float("nan")

    print(f"\nMAPE, BF16 Hopper rows ({hop.sum()} rows / {(hop & first).sum()} distinct configurations):")
    for name, p in (("uncalibrated", raw), ("shipped calibration", cal), ("leave-one-model-out", out)):
        print(f"  {name:<22} all rows {mape(p, hop):5.1f}%   distinct {mape(p, hop & first):5.1f}%")
    print(f"  B200 rows ({(~hop).sum()}): calibrated MAPE {mape(cal, ~hop):.1f}%, uncalibrated {mape(raw, ~hop):.1f}%")
    print("\nSpearman rank correlation per model (>= 3 rows; measured vs predicted):")
    groups = defaultdict(list)
    for i, m in enumerate(rows):
        groups[m.model].append(i)
        groups[f"{m.model} on {m.gpu}"].append(i)
    for name, idx in sorted(groups.items()):
        if len(idx) >= 3:
            print(f"  {name:<34} n={len(idx):<3} calibrated {spearman(meas[idx], cal[idx]):+.2f}   "
                  f"uncalibrated {spearman(meas[idx], raw[idx]):+.2f}")
    seeds = [i for i, m in enumerate(rows) if m.source.startswith("seed page")]
    if len(seeds) != 3:
        raise SystemExit(f"expected the 3 seed rows, found {len(seeds)}: the seed measurements lost their source")
    order = all(cal[a] > cal[b] for a, b in zip(seeds, seeds[1:]))
    print("\nseed rows (H200, measured order #1 > #2 > #3):")
    for r, i in enumerate(seeds, 1):
        name = rows[i].source.split(": ")[-1]
        print(f"  #{r} measured {meas[i]:,.1f}  predicted {cal[i]:,.1f}  ({err(cal)[i]:+.1f}%)  {name}")
    print(f"  predicted in the measured order: {order}; all within 10%: {bool(np.all(np.abs(err(cal)[seeds]) < 10))}")
    other_gpus()
    reasons = Counter(why if not why.startswith(("model", "GPU", "precision")) else why.split(" ")[0] + " ..."
                      for _, why in skipped)
    print(f"\nrows used {len(rows)} (3 seed + {len(kept)} published); skipped {len(skipped)}:")
    for why, n in reasons.most_common():
        print(f"  {n:4d}  {why[:110]}")


def other_gpus() -> None:
    """The seed page's other clusters give a throughput but no layout: compare with our predicted best, and
    show how the best moves if memory is tighter than the model thinks (a larger margin) or if the optimizer
    had to be offloaded to the host (the only way 2.2 TB of weights, gradients and Adam state fit where HBM
    is short). A measured number from an unknown layout is a lower bound on what the cluster can do."""
    import numpy as np

    from autotune.catalog import ClusterSpec, Workload, load_model
    from autotune.space import explore, load_space

    m, w = load_model("Qwen3.5-122B-A10B"), Workload()
    space = load_space(None, m)
    space.prune.keep_within = 0.0  # every layout that fits, so the scenarios below can pick from them
    print("\nseed page, other GPUs (layouts not published): our predicted best layout against their measured number")
    print(f"  {'cluster':<10} {'scenario':<28} {'layout':<40} {'HBM':>5} {'tok/s/GPU':>10} {'ratio':>6}")
    clusters = (("H100", 48, 999.7, "not published"), ("H200", 32, 2451.4, "seed #1: TP1 PP4 EP8 DP8 full:uniform:2"),
                ("B200", 16, 2475.8, "not published"))
    for gpu, count, measured, theirs in clusters:
        res = explore(space, m, w, ClusterSpec.of(gpu, count))
        if not len(res.kept):
            print(f"  {count} x {gpu}: no layout survives pruning")
            continue
        ev, t = res.evaluation, res.table
        tps, share = ev.time.tokens_per_s_per_gpu, ev.memory.peak / ev.memory.capacity_bytes
        fits = np.zeros(len(t), dtype=bool)
        fits[res.kept] = True
        for name, ok in (("best (margin 8%)", fits), ("best at margin 16%", fits & (share <= 0.84)),
                         ("best with no offload", fits & (t.offload == 0)),
                         ("best with full offload", fits & (t.offload == 1))):
            if not ok.any():
                print(f"  {count:3d} x {gpu:<5} {name:<28} none")
                continue
            i = int(np.argmax(np.where(ok, tps, -np.inf)))
            lay = t.row(i)
            label = f"{lay.label()} {lay.recompute}" + (f" off{lay.optimizer_offload:g}" if lay.optimizer_offload else "")
            print(f"  {count:3d} x {gpu:<5} {name:<28} {label:<40} {share[i]:5.0%} {tps[i]:10,.1f} "
                  f"{tps[i] / measured:6.2f}")
        print(f"  {'':<10} {'measured (seed page)':<28} {theirs:<40} {'':>5} {measured:10,.1f}")


if __name__ == "__main__":
    main()
