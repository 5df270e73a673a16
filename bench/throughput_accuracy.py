"""Accuracy of the throughput and memory models against measured rows: the seed page and the public table.

For every row the model can express (cost.measurements): measured tokens/s/GPU, the uncalibrated
prediction (factors 1), the shipped calibration's (in-sample on the shipped table; on another table given with
--csv it is out of sample, and the column says "shipped"), a leave-one-model-out (LOMO) and a leave-one-source-
out (LOSO) prediction (refit without the model's / the source's rows, predict them: how wrong the model is
where it has seen nothing alike), and the predicted peak memory against the GPU's (a published row ran,
so it fit). Then per GPU family and precision: rows expressed and skipped, MAPE in-sample / LOMO / LOSO,
the share of rows inside the printed 68% / 95% intervals (cost.uncertainty), the mean Spearman rank correlation
within each (model, GPU, sequence length) group of 3+ rows (and within
one page and release, and over the group's distinct configurations with the repeats of one configuration in
other releases collapsed to their median), and the rows predicted not to fit; the groups one by one; the seed rows and their order; skipped rows by reason.
Rows their publisher filed as a regression of their release (cost/_sources.known_regression) are predicted but left
out of every fit; they are listed apart, beside the same source's other releases, and the table is shown again
without them. Rows of a model the time model cannot yet price (cost/_sources.unpriced: DeepSeek-V4) stay in the
tables but out of every fit, and are listed apart with the reason.
Every precision's rows are fitted (calibrate.FIT_PRECISIONS); LOMO and LOSO are the out-of-sample checks.

    python bench/throughput_accuracy.py [--csv PATH] [--no-lomo]
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict

import numpy as np

from autotune.catalog import PRECISIONS
from autotune.cost import evaluate
from autotune.cost.uncertainty import uncertainty
from autotune.cost._published import gpu_kind, precision_of
from autotune.cost.calibrate import (FAMILIES, Calibration, calibration_for, fit_kinds, load_calibration, predict,
                                     published_measurements, seed_measurements, stack_kind)
from autotune.layout import LayoutTable


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
    a, b = np.asarray(a, float), np.asarray(b, float)
    if np.isnan(a).any() or np.isnan(b).any():  # e.g. the LOMO column under --no-lomo
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def by_kind(rows, cal_of) -> np.ndarray:
    """Each row predicted with `cal_of(key)`, key its GPU kind and stack (calibrate.stack_kind)."""
    out = np.zeros(len(rows))
    for key in {stack_kind(m.gpu, m.framework) for m in rows}:
        idx = [i for i, m in enumerate(rows) if stack_kind(m.gpu, m.framework) == key]
        out[idx] = predict([rows[i] for i in idx], cal_of(key))
    return out


def held_out(rows, key) -> np.ndarray:
    """Each row predicted by a calibration fitted without every row sharing its `key` (model, source)."""
    out = np.zeros(len(rows))
    for k in {key(m) for m in rows}:
        cals = fit_kinds([m for m in rows if key(m) != k], sorted({m.gpu for m in rows}))
        for i in [i for i, m in enumerate(rows) if key(m) == k]:
            out[i] = predict([rows[i]], calibration_for(rows[i], cals))[0]
    return out


def source_of(m) -> str:
    return re.split(r"[:;(]", m.source, maxsplit=1)[0].strip()


def family(gpu: str | None) -> str:
    return FAMILIES.get(gpu or "", "other")


def peaks(rows) -> tuple[np.ndarray, np.ndarray]:
    """Predicted peak GPU memory of each row and the GPU's capacity (bytes)."""
    peak, cap = np.zeros(len(rows)), np.zeros(len(rows))
    for i, m in enumerate(rows):
        ev = evaluate(m.spec, m.workload, m.cluster, LayoutTable.from_layouts([m.layout]), load_calibration(m.gpu))
        peak[i], cap[i] = ev.memory.peak[0], ev.memory.capacity_bytes
    return peak, cap


def sigmas(rows) -> np.ndarray:
    """The relative 1-sigma interval `autotune estimate` prints for each row (cost.uncertainty), under the
    calibration its predictions use."""
    out = np.zeros(len(rows))
    for i, m in enumerate(rows):
        cal = load_calibration(stack_kind(m.gpu, m.framework))
        ev = evaluate(m.spec, m.workload, m.cluster, LayoutTable.from_layouts([m.layout]), cal)
        out[i] = float(uncertainty(ev.time, cal, m.workload)[0])
    return out


def coverage(meas, pred, sigma, mask) -> str:
    """Share of rows whose measured tokens/s lie within 1 and 2 sigma of the prediction (log space)."""
    z = np.abs(np.log(meas[mask] / pred[mask])) / sigma[mask]
    return f"{np.mean(z <= 1):.0%} within 1 sigma (68% if calibrated), {np.mean(z <= 2):.0%} within 2 (95%)"


def publication(m) -> str:
    """The page and release a row was published in (one software stack, one set of settings)."""
    return m.source.split(";")[0].strip()


def rank_groups(rows, mask, by_publication: bool = False) -> list[list[int]]:
    """Indices of each (model, GPU, seq len) group of 3+ rows; with `by_publication`, also split by the page
    and release that published them: there only the layout and precision differ, not the software."""
    g = defaultdict(list)
    for i, m in enumerate(rows):
        if mask[i]:
            g[(m.model, m.gpu, m.seq_len) + ((publication(m),) if by_publication else ())].append(i)
    return [idx for _, idx in sorted(g.items()) if len(idx) >= 3]


def configuration(m) -> str:
    """Everything the model reads of a row (all but the measured number, its source, weight and regression
    note): rows equal in it are one configuration measured again, in another release or on another page."""
    d = m.to_dict()
    for k in ("tokens_per_s_per_gpu", "source", "weight", "regression", "unpriced"):
        d.pop(k, None)
    return json.dumps(d, sort_keys=True, default=str)


def layout_ranks(rows, mask, meas, pred) -> list[tuple[int, int, float]]:
    """Spearman over the distinct configurations of each (model, GPU, seq len) group with 3+ of them: the
    repeats of one configuration (other releases of the same recipe) collapse to their median measured
    number, so the rank asks only what a search asks, which layout and settings are faster. Returns
    (first row of the group, configurations, rho) per group."""
    out = []
    for idx in rank_groups(rows, mask):
        configs = defaultdict(list)
        for i in idx:
            configs[configuration(rows[i])].append(i)
        if len(configs) < 3:
            continue
        m = [float(np.median(meas[c])) for c in configs.values()]
        p = [float(np.mean(pred[c])) for c in configs.values()]
        out.append((idx[0], len(configs), spearman(m, p)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=None, help="published table (default: the shipped copy)")
    ap.add_argument("--no-lomo", action="store_true", help="skip the leave-one-model/-source-out refits")
    args = ap.parse_args()
    kept, skipped = published_measurements(args.csv)
    rows = seed_measurements() + kept
    meas = np.array([m.tokens_per_s_per_gpu for m in rows])
    raw, cal = by_kind(rows, Calibration), by_kind(rows, load_calibration)
    nan = np.full(len(rows), np.nan)
    lomo = nan if args.no_lomo else held_out(rows, lambda m: m.model)
    loso = nan if args.no_lomo else held_out(rows, source_of)
    peak, cap = peaks(rows)
    err = lambda p: 100 * (p / meas - 1)  # noqa: E731
    print(f"{'row':<56}{'gpu':>6}{'prec':>8}{'measured':>9}{'uncal%':>7}{'pred':>8}{'err%':>7}{'LOMO%':>7}"
          f"{'LOSO%':>7}{'peak/HBM GiB':>13}  source")
    for i, m in enumerate(rows):
        print(f"{m.label()[:55]:<56}{m.gpu:>6}{m.precision[:7]:>8}{meas[i]:>9,.0f}{err(raw)[i]:>+7.1f}{cal[i]:>8,.0f}"
              f"{err(cal)[i]:>+7.1f}{err(lomo)[i]:>+7.1f}{err(loso)[i]:>+7.1f}"
              f"{peak[i] / 2**30:>8.0f}/{cap[i] / 2**30:<4.0f}  {m.source.split(';')[0][:40]}")

    def mape(p, mask):
        return float(np.mean(np.abs(err(p)[mask]))) if mask.any() else float("nan")

    fam, prec = np.array([family(m.gpu) for m in rows]), np.array([m.precision for m in rows])
    skip_fp = [(family(gpu_kind(r.get("gpu", ""))[0]), precision_of(r.get("precision") or "", r.get("source") or "")[0])
               for r, _ in skipped]
    with_tp = len(kept) + sum(1 for r, _ in skipped if r.get("tokens_per_s_per_gpu") or r.get("tflops_per_gpu"))
    print(f"\nrows expressed: {len(kept)} of the {with_tp} published rows with a throughput "
          f"({100 * len(kept) / with_tp:.0f}%), plus the 3 seed rows; {len(skipped)} skipped")
    flagged = np.array([bool(m.regression) for m in rows])

    # the shipped calibration was fitted on the shipped table: in-sample there, out of sample on another --csv
    shipped = "in-sample" if args.csv is None else "shipped"

    def table(keep: np.ndarray) -> None:
        print(f"{'family':<10}{'precision':<16}{'rows':>5}{'skip':>5}{'uncal':>7}{shipped:>10}{'LOMO':>7}"
              f"{'LOSO':>7}{'rank':>7}{'groups':>7}{'pub rank':>9}{'groups':>7}{'lay rank':>9}{'groups':>7}"
              f"{'no fit':>7}")
        for f, p in [(f, p) for f in ("hopper", "blackwell") for p in PRECISIONS] + [("all", "all")]:
            mask = keep & (np.ones(len(rows), bool) if f == "all" else (fam == f) & (prec == p))
            nsk = len(skipped) if f == "all" else sum(1 for sf, sp in skip_fp if sf == f and sp == p)
            if not mask.any() and not nsk:
                continue
            rc, rp = ([r for r in (spearman(meas[idx], cal[idx]) for idx in rank_groups(rows, mask, pub)) if r == r]
                      for pub in (False, True))
            rl = [r for _, _, r in layout_ranks(rows, mask & ~flagged, meas, cal) if r == r]
            print(f"{f:<10}{p:<16}{mask.sum():>5}{nsk:>5}{mape(raw, mask):>6.1f}%{mape(cal, mask):>9.1f}%"
                  f"{mape(lomo, mask):>6.1f}%{mape(loso, mask):>6.1f}%{np.mean(rc) if rc else np.nan:>+7.2f}"
                  f"{len(rc):>7}{np.mean(rp) if rp else np.nan:>+9.2f}{len(rp):>7}{np.mean(rl) if rl else np.nan:>+9.2f}"
                  f"{len(rl):>7}{int((peak[mask] > cap[mask]).sum()):>7}")

    print()
    table(np.ones(len(rows), bool))
    if args.csv is not None:
        print("  shipped: predicted with the calibration autotune ships (fitted on its own table and the seed page),\n"
              "  not refitted on this table: out of sample for rows it has not seen; LOMO / LOSO refit on this table")
    print("  MAPE of tokens/s/GPU; rank: mean Spearman within the (model, GPU, seq len) groups of 3+ rows (rows of\n"
          "  several releases and pages: software changes between them that no layout explains); pub rank: the same\n"
          "  within one page and release, where only the layout and precision differ; lay rank: within the\n"
          "  (model, GPU, seq len) groups of 3+ distinct configurations, each configuration's repeats in other\n"
          "  releases collapsed to their median, known regressions left out (what a search ranks: layouts and\n"
          "  settings, not releases);\n"
          "  no fit: published rows (they ran) predicted not to fit. Skipped rows of unknown GPUs count under 'all'.")
    sig = sigmas(rows)
    print(f"\nthe predicted interval (cost.uncertainty: the calibration's RMS log error x HELD_OUT, median "
          f"{np.median(sig):.3f}), known regressions left out:\n  {shipped}: {coverage(meas, cal, sig, ~flagged)}")
    if not args.no_lomo:
        print(f"  LOMO: {coverage(meas, lomo, sig, ~flagged)}")
    known_regressions(rows, meas, cal, lomo, flagged)
    unpriced = [i for i, m in enumerate(rows) if m.unpriced]
    if unpriced:
        print(f"\nrows of models the time model cannot yet price (kept out of every fit): {len(unpriced)}")
        for i in unpriced:
            print(f"  {rows[i].label()[:52]:<53}{rows[i].gpu:>6}  measured {meas[i]:>7,.0f}  pred {cal[i]:>7,.0f} "
                  f"({err(cal)[i]:+.1f}%)  {rows[i].source.split(';')[0][:45]}")
        for why in sorted({rows[i].unpriced for i in unpriced}):
            print(f"      {why}")
    if flagged.any():
        print(f"\nthe same, without the {int(flagged.sum())} known-regression rows:")
        table(~flagged)
    settings(rows, mape, cal, lomo, ~flagged, shipped)
    precision_pairs(rows, meas, cal, lomo, flagged)
    print("\nrows predicted not to fit (they ran): predicted peak / HBM (GiB)")
    for i in np.flatnonzero(peak > cap):
        print(f"  {rows[i].label()[:70]:<71}{rows[i].precision:<15}{peak[i] / 2**30:5.0f}/{cap[i] / 2**30:<4.0f} "
              f"{rows[i].source.split(';')[0][:45]}")
    print("\nwithin-group rank correlation, (model, GPU, seq len) groups of 3+ rows: calibrated, LOMO")
    for idx in rank_groups(rows, np.ones(len(rows), bool)):
        m = rows[idx[0]]
        print(f"  {m.model:<22} {m.gpu:<6} {m.seq_len:>6}  n={len(idx):<3} {spearman(meas[idx], cal[idx]):+.2f}"
              f"  {spearman(meas[idx], lomo[idx]):+.2f}")
    print("\nthe same within one page and release (groups of 3+ rows): calibrated, LOMO")
    for idx in rank_groups(rows, np.ones(len(rows), bool), by_publication=True):
        m = rows[idx[0]]
        print(f"  {m.model:<22} {m.gpu:<6} {m.seq_len:>6}  n={len(idx):<3} {spearman(meas[idx], cal[idx]):+.2f}"
              f"  {spearman(meas[idx], lomo[idx]):+.2f}  {publication(m)[:60]}")
    print("\nthe same over distinct configurations (repeats in other releases collapsed to their median, known"
          " regressions left out; groups of 3+ configurations): calibrated, LOMO")
    lomo_of = {i: r for i, _, r in layout_ranks(rows, ~flagged, meas, lomo)}
    for i, n, r in layout_ranks(rows, ~flagged, meas, cal):
        m = rows[i]
        print(f"  {m.model:<22} {m.gpu:<6} {m.seq_len:>6}  configurations={n:<3} {r:+.2f}  {lomo_of[i]:+.2f}")
    seeds = [i for i, m in enumerate(rows) if m.source.startswith("seed page")]
    if len(seeds) != 3:
        raise SystemExit(f"expected the 3 seed rows, found {len(seeds)}: the seed measurements lost their source")
    order = all(cal[a] > cal[b] for a, b in zip(seeds, seeds[1:]))
    print("\nseed rows (H200, measured order #1 > #2 > #3):")
    for r, i in enumerate(seeds, 1):
        print(f"  #{r} measured {meas[i]:,.1f}  predicted {cal[i]:,.1f}  ({err(cal)[i]:+.1f}%)  "
              f"{rows[i].source.split(': ')[-1]}")
    print(f"  predicted in the measured order: {order}; all within 3%: {bool(np.all(np.abs(err(cal)[seeds]) < 3))}")
    other_gpus()
    print(f"\nskipped {len(skipped)} rows, by reason:")
    for why, n in Counter(re.sub(r" \(Megatron-Bridge recipe .*\)$", "", why) for _, why in skipped).most_common():
        print(f"  {n:4d}  {why[:110]}")


def known_regressions(rows, meas, cal, lomo, flagged) -> None:
    """Rows their publisher filed as a performance regression of their release (cost/_sources.known_regression):
    predicted, left out of every fit; each beside the same source's rows of its model and GPU in other releases."""
    if not flagged.any():
        return
    print(f"\nknown regressions (the publisher's own issue; kept out of the fit): {int(flagged.sum())} rows")
    release = lambda m: m.source.split(";")[0].split(":")[-1].strip()  # noqa: E731
    family_src = lambda m: re.split(r"[:;(]", m.source, maxsplit=1)[0]  # noqa: E731
    for i in np.flatnonzero(flagged):
        m = rows[i]
        print(f"  {m.label()[:52]:<53}{release(m):>9}  measured {meas[i]:>7,.0f}  pred {cal[i]:>7,.0f} "
              f"({100 * (cal[i] / meas[i] - 1):+.1f}%, LOMO {100 * (lomo[i] / meas[i] - 1):+.1f}%)")
        for j, o in enumerate(rows):
            if (not flagged[j] and o.model == m.model and o.gpu == m.gpu and family_src(o) == family_src(m)):
                print(f"      same source, {release(o):>9}: {o.label()[:50]:<51}{o.precision[:8]:>9}  measured "
                      f"{meas[j]:>7,.0f}  pred {cal[j]:>7,.0f} ({100 * (cal[j] / meas[j] - 1):+.1f}%)")
        print(f"      {m.regression}")


def settings(rows, mape, cal, lomo, keep, shipped: str = "in-sample") -> None:
    """Rows per setting the published rows vary beyond the layout (from their notes or their source's recipe), known
    regressions left out (`keep`: a release's own slowdown is no error of the setting's model)."""
    checks = [("EP overlap", lambda m: m.layout.ep_overlap), ("TP comm overlap", lambda m: m.layout.tp_overlap),
              ("CUDA graphs (router/attn)", lambda m: m.layout.cuda_graphs in ("router", "attn")),
              ("CUDA graphs (full)", lambda m: m.layout.cuda_graphs == "full"),
              ("token drop (capacity factor)", lambda m: m.layout.moe_capacity_factor > 0),
              ("activation offload", lambda m: m.layout.activation_offload_layers > 0),
              ("flex dispatcher on DeepEP", lambda m: m.layout.dispatcher == "flex"),
              ("flex dispatcher on HybridEP", lambda m: m.layout.dispatcher == "hybridep"),
              ("forced balanced routing", lambda m: m.force_balance),
              ("natural routing (MoE)", lambda m: m.spec.is_moe and not m.force_balance),
              ("FSDP", lambda m: m.layout.fsdp)]
    print(f"\n{'setting (known regressions left out)':<36}{'rows':>5}{shipped:>10}{'LOMO':>7}")
    for name, on in checks:
        mask = np.array([bool(on(m)) for m in rows]) & keep
        print(f"{name:<36}{int(mask.sum()):>5}{mape(cal, mask):>9.1f}%{mape(lomo, mask):>6.1f}%")


def precision_pairs(rows, meas, cal, lomo, flagged) -> None:
    """Rows of one page and release that differ in precision alone (same model, GPU count, layout, sequence):
    what the publisher measured a recipe to buy against what the model predicts, calibrated and held out.
    Within a page the software is one stack, so the ratio isolates the precision's cost terms."""
    groups = defaultdict(list)
    for i, m in enumerate(rows):
        if not flagged[i]:
            lay = m.layout
            groups[(publication(m), m.model, m.gpu, m.count, m.seq_len, lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep,
                    lay.etp)].append(i)
    pairs = []
    order = {p: k for k, p in enumerate(("bf16", "fp8-delayed", "fp8-tensorwise", "fp8-blockwise", "mxfp8", "nvfp4"))}
    for idx in groups.values():
        for a in idx:
            for b in idx:
                if order.get(rows[a].precision, 9) < order.get(rows[b].precision, 9):
                    pairs.append((a, b))
    if not pairs:
        return
    print("\nprecision pairs (one page and release, the same layout): faster / slower precision, tokens/s ratio")
    print(f"  {'model':<26}{'GPUs':>10} {'pair':<29}{'measured':>9}{'pred':>7}{'LOMO':>7}  page")
    logs = []
    for a, b in sorted(pairs, key=lambda ab: (rows[ab[0]].model, rows[ab[0]].gpu)):
        ma, mb = rows[a], rows[b]
        r_meas, r_cal, r_lomo = meas[b] / meas[a], cal[b] / cal[a], lomo[b] / lomo[a]
        logs.append((np.log(r_cal / r_meas), np.log(r_lomo / r_meas)))
        print(f"  {ma.model[:25]:<26}{ma.count:>5}x{ma.gpu:<6}{mb.precision + ' / ' + ma.precision:<29}"
              f"{r_meas:>9.2f}{r_cal:>7.2f}{r_lomo:>7.2f}  {publication(ma)[:40]}")
    arr = np.abs(np.array(logs))
    print(f"  {len(pairs)} pairs; mean |log(predicted / measured ratio)| calibrated {arr[:, 0].mean():.3f}, "
          f"LOMO {np.nanmean(arr[:, 1]):.3f}")


def other_gpus() -> None:
    """The seed page's other clusters give a throughput but no layout: compare with our predicted best, and
    show how the best moves if memory is tighter than the model thinks (more HBM kept free) or if the optimizer
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
        margin = space.prune.memory_margin  # the default space keeps this share of HBM free (prune.memory_margin)
        for name, ok in ((f"best ({margin:.0%} of HBM kept free)", fits),
                         ("best at 16% kept free", fits & (share <= 0.84)),
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
