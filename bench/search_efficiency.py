"""How many trials and GPU-hours does each planner need to find a layout within 2% of the best, when
reality differs from the model?

A "reality" is the shipped cost model with errors of a stated family, plus 2% noise per measured trial:

  terms        every time term x its own factor U[0.7, 1.3] (the ranking barely moves)
  terms+f10    terms, and x U[0.9, 1.1] per value of each layout feature (the issue's first hard case)
  f10+int      terms, x U[0.9, 1.1] per feature value and per value of EP x nodes, PP x recompute, TP x hidden
  f20+int      the same at U[0.8, 1.2]
  lomo         terms, and lognormal factors per feature value and interaction whose spreads (drawn per
               feature, then scaled) make the total log error match the calibration's leave-one-model-out
               RMS (search/priors.lomo_residuals: measured, not chosen here)
  terms-wide   every time term x a lognormal factor whose spread is that of the shipped calibration's fitted
               per-term factors about 1 (RMS log over the Megatron GPU kinds' fitted factors: how far a kind's terms
               sit from the physics, so what a cluster of a kind, or a software stack, the calibration lacks faces)
  lomo+own     lomo, with part of that error each layout's own (shared with no other layout): the
               calibration rows' residual that no feature group explains (priors.PRIOR_WIDTHS["noise"],
               0.059 on the shipped rows, less the trial noise: 0.055), the features' spreads scaled to the
               rest of the RMS
  lomo+pairs   lomo at half its variance, the other half on every pair of eight dimensions (TP, PP, VPP, CP, EP,
               ETP, dispatcher, recompute granularity: 28 pairs) that the planner's residual model has no feature
               for (it models three interactions, search/features.INTERACTIONS): how much structure it cannot
               represent costs it

The loop is the product's: planners are driven through PlanContext/Planner; measured trials refit the
search's posterior (search/candidates.believe, the driver's own function: the residual model with the
time-term factors as columns, search/residual.py), which gives the predictions and uncertainties the next
proposal sees. The `oracle` arm is the same planner with the reality's own error distribution as its prior
(the term factors exactly, one weight per perturbed value with its true spread, and in lomo+own each layout's
own error, residual.ResidualModel's sigma_own): a floor no planner that
learns from these trials can be expected to beat. A run "reaches" the goal at the first trial
whose noise-free reality throughput is within 2% of reality's best over the candidates. GPU-hours per
trial are reality's: (start-up + 20 steps) x GPUs (acquisition.TRIAL_STARTUP_S, from the seed page).
Prints, per reality, model/cluster pair and planner: median and p90 trials and GPU-hours to the goal,
and the share of runs that reached it within the cap (a run that never did counts as cap + 1 trials and
the GPU-hours it spent; GPU-h/hit is all GPU-hours spent over the runs that reached the goal, the cost of a
success when a planner that misses must be run again). A proposal outside the candidates costs nothing
but counts toward a stall (the driver's MAX_SCREENED_IN_A_ROW, 300, in a row; GP: 30, its asks are slow).
CMA-ES is listed as not applicable: every searched dimension is categorical, which optuna's CmaEsSampler
hands to its independent (random) sampler.

    python bench/search_efficiency.py [--quick] [--seeds 30] [--cap 20] [--realities lomo,f20+int]
        [--planners model,oracle,random,tpe,gp,...] [--explain K] [--hardness] [--noisy SHARE:SE]   (default: model, oracle, random, tpe,
        gp and every other registered planner but llm, which runs only when AUTOTUNE_LLM_BASE_URL is set;
        --explain K prints, for each model-guided run not at the goal after K trials, where reality's best
        stood in its first and last belief; --hardness prints, per reality, how many layouts are at the goal
        and where the model ranks reality's best, and runs no planner; --noisy SHARE:SE makes that share of trials
        scatter with relative standard error SE and report it, as a trial reports its window's; the model-flat
        planner is the model-guided one ignoring what they report)
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys
import time

import numpy as np

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import STEP_TERMS, evaluate, load_calibration
from autotune.layout.dimensions import layout_key
from autotune.search.acquisition import STOP_CHANCE, TRIAL_STARTUP_S, chance_any_beats
from autotune.search.planners import PLANNERS, PlanContext, PlannerOptions, TrialRecord, get_planner
from autotune.search.candidates import believe, prior_belief
from autotune.search.driver import MAX_SCREENED_IN_A_ROW, MIN_TRIALS_TO_CONVERGE
from autotune.search.priors import PRIOR_WIDTHS, lomo_residuals
from autotune.search.residual import ResidualModel
from autotune.space import explore, load_space

PAIRS = [("Qwen3.5-122B-A10B", "H200", 32), ("Qwen3-235B-A22B", "H100", 64), ("Llama-3.1-70B", "H100", 32)]
REALITIES = ("terms", "terms+f10", "f10+int", "f20+int", "lomo", "lomo+own", "lomo+pairs", "terms-wide")
PAIRED = ("tp", "pp", "vpp", "cp", "ep", "etp", "dispatcher", "rc_gran")  # lomo+pairs: every pair of these
FEATURES = ("tp", "pp", "vpp", "cp", "ep", "etp", "dispatcher", "rc_gran", "rc_layers", "rc_modules", "max_tokens",
            "offload", "dist_opt", "precision_aware", "shared_overlap")
GOAL = 0.98
NOISE = 0.02  # the trials' noise the default run assumes (--noise), part of the rows' unexplained residual
# proposals outside the candidates in a row before a planner counts as stalled: the driver's allowance
# (search/driver.py), except for GP, whose asks take about a second each (wall time, not trials)
GP_SCREENED_IN_A_ROW = 30


class Reality:
    """The cluster's true throughput for every candidate, and noisy measurements of it."""

    def __init__(self, kind: str, model, cluster, workload, table, rng: np.random.Generator, lomo_rms: float,
                 term_sd: float = 0.0):
        base = load_calibration(cluster.gpu.name)
        draw = (lambda: np.exp(rng.normal(0.0, term_sd))) if kind == "terms-wide" else (lambda: rng.uniform(0.7, 1.3))
        scale = {t: base.time.scale.get(t, 1.0) * float(draw()) for t in STEP_TERMS}
        cal = dataclasses.replace(base, time=dataclasses.replace(base.time, scale=scale))
        ev = evaluate(model, workload, cluster, table, cal)
        log_f = np.zeros(len(table))
        cols = [getattr(table, f) for f in FEATURES]
        sd = np.zeros(len(cols))
        normal = kind in ("lomo", "lomo+own", "lomo+pairs")
        own = float(np.sqrt(max(PRIOR_WIDTHS["noise"] ** 2 - NOISE**2, 0.0))) if kind == "lomo+own" else 0.0
        self.own = own
        if kind not in ("terms", "terms-wide"):
            nodes = np.ceil(table.ep * table.etp / cluster.gpus_per_node)
            rc = table.rc_gran * 100 + table.rc_layers
            cols += [] if kind == "terms+f10" else [table.ep * 1000 + nodes, table.pp * 1000 + rc,
                                                    table.tp * 100_000 + model.hidden_size // 1024]
            if normal:  # per-feature spreads drawn, then scaled so the total matches the measured RMS
                sd = rng.lognormal(0.0, 0.5, len(cols))
                sd *= np.sqrt(lomo_rms**2 - own**2) / np.sqrt(np.sum(sd**2))
            if kind == "lomo+pairs":  # half the variance moves to pairs the planner has no feature for
                pairs = [getattr(table, a).astype(np.int64) * 100_000 + getattr(table, b).astype(np.int64)
                         for j, a in enumerate(PAIRED) for b in PAIRED[j + 1:]]
                sd_pairs = rng.lognormal(0.0, 0.5, len(pairs))
                sd_pairs *= lomo_rms * np.sqrt(0.5) / np.sqrt(np.sum(sd_pairs**2))
                cols, sd = cols + pairs, np.concatenate([sd * np.sqrt(0.5), sd_pairs])
            elif not normal:
                sd = np.full(len(cols), 0.2 if kind == "f20+int" else 0.1)
            for c, s in zip(cols, sd):
                vals, inv = np.unique(c, return_inverse=True)
                draw = rng.normal(0.0, s, len(vals)) if normal else np.log(rng.uniform(1 - s, 1 + s, len(vals)))
                log_f += draw[inv]
            if own:  # each layout's own error (the oracle's prior has it as each candidate's own error)
                log_f += rng.normal(0.0, own, len(table))
        # what the oracle knows: the terms' prediction and the error's structure and spread (not its draws);
        # log U[1 - s, 1 + s] has a standard deviation of about s / sqrt(3)
        self.base, self.cols = ev.time.tokens_per_s_per_gpu, cols
        self.sd = sd if normal else sd / np.sqrt(3)
        self.truth = self.base * np.exp(log_f)
        self.noise_rng = np.random.default_rng(rng.integers(1 << 31))
        step = workload.tokens_per_step / (self.truth * cluster.count)
        self.gpu_hours = (TRIAL_STARTUP_S + workload.steps * step) * cluster.count / 3600

    def measure(self, i: int, noise: float, noisy: tuple[float, float] | None = None) -> tuple[float, float | None]:
        """A trial's measurement and the standard error its trial reports: with `noisy` (share, se), that share of
        trials scatter with relative error se and report it; the others have the run-to-run noise and report
        nothing above it (None)."""
        loud = noisy is not None and self.noise_rng.random() < noisy[0]
        sd = noisy[1] if loud else noise
        return float(self.truth[i] * (1 + sd * self.noise_rng.standard_normal())), (sd if loud else None)


class Setup:
    """One model/cluster pair: its candidates and the search's prior belief, computed once."""

    def __init__(self, pair, noise: float = 0.02):
        name, gpu, count = pair
        self.name = name
        self.model, self.cluster, self.workload = load_model(name), ClusterSpec.of(gpu, count), Workload()
        res = explore(load_space(None, self.model), self.model, self.workload, self.cluster)
        self.table = res.table.take(res.kept)
        self.keys = [layout_key(self.table.row(i)) for i in range(len(self.table))]
        self.base_pred, self._prior = prior_belief(self.model, self.cluster, self.workload, self.table,
                                                   load_calibration(gpu), noise)

    def belief(self, measured: list[tuple[int, float]], noise: float, residual: ResidualModel | None = None):
        """(predictions, uncertainties, residual model) after `measured` ((candidate, tokens/s/GPU)): exactly
        what the driver believes after those trials (search/candidates.prior_belief and believe)."""
        residual = residual or copy.deepcopy(self._prior)
        pred, std = believe(self.base_pred, measured, residual, noise)
        return pred, std, residual


class Oracle:
    """The floor for the model-guided planner: its acquisition with a prior that is the reality's own error
    distribution (the time-term factors exactly, and one weight per value of each column the reality
    perturbs, with that column's spread). It knows how reality was drawn, not what was drawn."""

    def __init__(self, reality: Reality, noise: float):
        blocks = [np.ones((len(reality.base), 1))]
        std = [1.0]
        for c, sd in zip(reality.cols, reality.sd):
            _, inv = np.unique(c, return_inverse=True)
            blocks.append(np.eye(inv.max() + 1)[inv])
            std += [max(float(sd), 1e-6)] * blocks[-1].shape[1]
        self.base, self.noise = reality.base, noise
        self.residual = ResidualModel.of_design(np.hstack(blocks), np.array(std), noise, sigma_own=reality.own)

    def belief(self, measured: list[tuple], noise: float, residual=None):
        if measured:
            idx = np.array([m[0] for m in measured])
            se = np.array([m[2] if len(m) > 2 and m[2] is not None else np.nan for m in measured], dtype=float)
            self.residual.fit_candidates(idx, np.log(np.array([m[1] for m in measured]) / self.base[idx]), stderr=se)
        corr, std = self.residual.predict()
        return self.base * corr, np.maximum(std, noise), self.residual


def term_spread() -> float:
    """RMS log of the shipped calibration's fitted time-term factors (those not left at 1) over the Megatron GPU
    kinds: the spread of a kind's terms about the physics before its rows were fitted."""
    from autotune.cost.calibrate import SHIPPED, read_calibrations

    logs = [np.log(v) for kind, cal in read_calibrations(SHIPPED).items() if "+" not in kind
            for v in cal.factors.values() if abs(v - 1.0) > 1e-9]
    return float(np.sqrt(np.mean(np.square(logs))))


def planner_for(name: str, seed: int):
    if name in ("tpe", "gp"):
        return get_planner("optuna", PlannerOptions(seed=seed, sampler=name))
    return get_planner("model" if name in ("oracle", "model-flat") else name, PlannerOptions(seed=seed))


@dataclasses.dataclass
class Run:
    trials: int | None  # trials to the goal (None: not within the cap)
    gpu_hours: float  # spent until then
    measured: list  # (candidate, measured) in trial order
    pred: np.ndarray | None = None  # the last belief (planners that use the model)
    std: np.ndarray | None = None
    residual: ResidualModel | None = None
    stopped: int | None = None  # --stop-rule: trials when the driver's stop rule fired (None: not within the cap)
    chance: float | None = None  # its chance then
    first_goal: int | None = None  # --stop-rule: the first trial that reached the goal (runs go on past it)


def one_run(setup: Setup, reality: Reality, planner: str, seed: int, cap: int, noise: float, parallel: int = 1,
            noisy: tuple[float, float] | None = None, until_stop: bool = False) -> Run:
    """One search on one reality, to the goal (or the cap); `until_stop`: past the goal, until the driver's stop rule
    fires on the planner's belief (acquisition.chance_any_beats below STOP_CHANCE after MIN_TRIALS_TO_CONVERGE)."""
    goal = GOAL * reality.truth.max()
    first_goal = None
    p = planner_for(planner, seed)
    uses_model = planner not in ("random", "tpe", "gp")
    learner = Oracle(reality, noise) if planner == "oracle" else setup
    index = {k: i for i, k in enumerate(setup.keys)}
    measured: list[tuple[int, float]] = []
    history: list[TrialRecord] = []
    tried: set[str] = set()
    pred, std, residual = learner.belief([], noise) if uses_model else (setup.base_pred, 0.1, None)
    gpu_hours, screened = 0.0, 0
    stall = GP_SCREENED_IN_A_ROW if planner == "gp" else MAX_SCREENED_IN_A_ROW
    while len(measured) < cap and screened < stall:
        ctx = PlanContext(setup.model, setup.cluster, setup.workload, setup.table, pred, setup.keys, set(tried),
                          list(history), sigma=std, rng=np.random.default_rng(seed * 1000 + len(history)),
                          residual=residual, noise=noise)
        props = p.propose(ctx, min(parallel, cap - len(measured)))
        if not props:
            break
        for prop in props:
            key = layout_key(prop.layout)
            i = index.get(key)
            if i is None or key in tried:  # screened out (outside the candidates) or repeated
                rec = TrialRecord(len(history), prop.layout, "screened", "predicted", None, None)
                history.append(rec)
                p.observe(rec)
                screened += 1
                continue
            screened = 0
            v, se = reality.measure(i, noise, noisy)
            se = None if planner == "model-flat" else se  # model-flat: the product before trials reported their spread
            gpu_hours += float(reality.gpu_hours[i])
            tried.add(key)
            measured.append((i, v, se))
            rec = TrialRecord(len(history), prop.layout, "ok", "measured", v, float(pred[i]), stderr=se)
            history.append(rec)
            p.observe(rec)
            if reality.truth[i] >= goal:
                if not until_stop:
                    return Run(len(measured), gpu_hours, measured)
                first_goal = first_goal or len(measured)
        if uses_model:
            pred, std, residual = learner.belief(measured, noise, residual)
        if until_stop and len(measured) >= MIN_TRIALS_TO_CONVERGE:
            untried = np.ones(len(pred), bool)
            untried[[m[0] for m in measured]] = False
            chance = chance_any_beats(pred, std, untried, max(m[1] for m in measured), noise, residual)
            if chance < STOP_CHANCE:
                return Run(first_goal, gpu_hours, measured, pred, std, residual, len(measured), chance, first_goal)
    return Run(first_goal if until_stop else None, gpu_hours, measured, pred if uses_model else None,
               std if uses_model else None, residual, first_goal=first_goal)


def stop_rule_table(setups: list, realities: list[str], seeds: int, cap: int, noise: float, lomo_rms: float,
                    term_sd: float) -> None:
    """How the driver's stop rule does on each reality: runs go on past the goal until the rule fires (or the cap).
    Its promise is that when it fires, the chance that an untried layout beats the best measured value by more than
    the noise is under STOP_CHANCE: 'beaten' counts the stopped runs where one did, in reality's truth."""
    print(f"stop rule: stop when the chance that an untried candidate beats the best by > {noise:.0%} falls under "
          f"{STOP_CHANCE:.0%} (after >= {MIN_TRIALS_TO_CONVERGE} trials); cap {cap}; {seeds} seeds")
    print(f"{'reality':10s} {'model / cluster':32s} {'stopped':>8s} {'trials med':>10s} {'p90':>5s} {'GPU-h med':>10s} "
          f"{'at goal':>8s} {'beaten':>7s} {'best/true':>9s} {'goal trial':>10s} {'s/run':>6s}")
    for kind in realities:
        for s in setups:
            rows, t0 = [], time.time()
            for seed in range(seeds):
                reality = Reality(kind, s.model, s.cluster, s.workload, s.table, np.random.default_rng(seed),
                                  lomo_rms, term_sd)
                run = one_run(s, reality, "model", seed, cap, noise, until_stop=True)
                tried = [m[0] for m in run.measured]
                best_i, best_v = max(((m[0], m[1]) for m in run.measured), key=lambda t: t[1])
                untried = np.ones(len(reality.truth), bool)
                untried[tried] = False
                beaten = bool(np.any(reality.truth[untried] > best_v * (1 + noise))) if untried.any() else False
                rows.append((run.stopped, run.gpu_hours, reality.truth[best_i] >= GOAL * reality.truth.max(), beaten,
                             reality.truth[best_i] / reality.truth.max(), run.first_goal))
            stopped = [r for r in rows if r[0] is not None]
            n = np.array([r[0] if r[0] is not None else cap + 1 for r in rows])
            hours = np.array([r[1] for r in rows])
            goal_at = [r[5] for r in rows if r[5] is not None]
            label = f"{s.name} / {s.cluster.count} x {s.cluster.gpu.name}"
            share = lambda k: (f"{np.mean([r[k] for r in stopped]):7.0%}" if stopped else "      -")  # noqa: E731
            print(f"{kind:10s} {label:32s} {len(stopped) / len(rows):8.0%} {np.median(n):10.1f} "
                  f"{np.percentile(n, 90):5.1f} {np.median(hours):10.1f} {share(2):>8s} {share(3):>7s} "
                  f"{np.median([r[4] for r in rows]):9.1%} {np.median(goal_at) if goal_at else float('nan'):10.1f} "
                  f"{(time.time() - t0) / seeds:6.2f}", flush=True)
    print("  stopped: runs where the rule fired within the cap (trials med / p90 count a run that did not as cap + 1);\n"
          "  at goal / beaten: of those, the share whose best measured layout is within 2% of reality's best / where an\n"
          "  untried layout in truth beat the best measured value by more than the noise (the rule promises under 5%);\n"
          "  best/true: the best measured layout's truth over reality's best (median, every run); goal trial: the\n"
          "  median trial that first reached the goal, in the runs that did.")


def explain(setup: Setup, reality: Reality, run: Run, noise: float) -> str:
    """Why a run missed the goal: where reality's best stood in the first and the last belief, and how much
    of it the trials had measured."""
    best = int(np.argmax(reality.truth))
    first, _, _ = setup.belief([], noise)
    rank0 = int(np.sum(first > first[best])) + 1
    tried = [m[0] for m in run.measured]
    got = max(reality.truth[i] for i in tried) / reality.truth[best] if tried else 0.0
    line = (f"best {setup.table.row(best).label(setup.model.is_moe)}: first predicted rank {rank0} of {len(first)}; "
            f"best tried {got:.1%} of it")
    if run.pred is not None:
        untried = np.ones(len(run.pred), bool)
        untried[tried] = False
        rank = int(np.sum(run.pred[untried] > run.pred[best])) + 1
        inc = max(m[1] for m in run.measured)
        z = (np.log(run.pred[best]) - np.log(inc * (1 + noise))) / max(run.std[best], 1e-9)
        X = getattr(run.residual, "Xc", None)
        unseen = int(np.sum((X[best] > 0) & (X[tried].sum(0) == 0))) if X is not None else -1
        scale = run.residual.width_scale() if hasattr(run.residual, "width_scale") else float("nan")
        line += (f"; last belief: rank {rank} of {int(untried.sum())} untried, predicted {run.pred[best] / reality.truth[best]:.2f}x "
                 f"its truth +/-{run.std[best]:.0%} (z {z:+.1f} vs the best measured), {unseen} of its feature values "
                 f"never measured, width scale {scale:.2f}")
    return line


def hardness(setup: Setup, reality: Reality) -> tuple[int, int, bool, bool]:
    """How hard one reality is, before any planner runs: how many candidates are within the goal of its best,
    the model's predicted rank of that best (1: the model's own favourite), and whether the model's top 5 /
    top 10 hold a layout within the goal (what 5 or 10 trials that learnt nothing would reach)."""
    hit = reality.truth >= GOAL * reality.truth.max()
    order = np.argsort(-setup.base_pred, kind="stable")
    rank = int(np.flatnonzero(order == int(np.argmax(reality.truth)))[0]) + 1
    return int(hit.sum()), rank, bool(hit[order[:5]].any()), bool(hit[order[:10]].any())


def print_hardness(setups: list[Setup], realities: list[str], seeds: int, lomo_rms: float, term_sd: float) -> None:
    print(f"{'reality':10s} {'model / cluster':32s} {'candidates':>10s} {'at goal':>8s} {'rank of best med':>17s} "
          f"{'p90':>6s} {'top 5':>6s} {'top 10':>7s}")
    for kind in realities:
        for s in setups:
            rows = np.array([hardness(s, Reality(kind, s.model, s.cluster, s.workload, s.table,
                                                 np.random.default_rng(seed), lomo_rms, term_sd)) for seed in range(seeds)])
            label = f"{s.name} / {s.cluster.count} x {s.cluster.gpu.name}"
            print(f"{kind:10s} {label:32s} {len(s.table):10d} {np.median(rows[:, 0]):8.0f} {np.median(rows[:, 1]):17.0f} "
                  f"{np.percentile(rows[:, 1], 90):6.0f} {rows[:, 2].mean():6.0%} {rows[:, 3].mean():7.0%}", flush=True)
    print("  at goal: candidates within 2% of reality's best (median over seeds); rank of best: where the model's\n"
          "  prediction puts reality's best; top 5 / top 10: runs where the model's 5 / 10 favourites hold a layout\n"
          "  at the goal (trials that learn nothing).")


def default_planners() -> list[str]:
    out = ["model", "oracle", "random", "tpe", "gp"]
    for name in PLANNERS:
        if name in ("model", "random", "optuna") or (name == "llm" and not os.environ.get("AUTOTUNE_LLM_BASE_URL")):
            continue
        out.append(name)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--cap", type=int, default=20, help="trial budget per run")
    ap.add_argument("--noise", type=float, default=0.02)
    ap.add_argument("--parallel", type=int, default=1, help="proposals per round (the batch rule)")
    ap.add_argument("--noisy", default=None, metavar="SHARE:SE",
                    help="that share of trials scatter with relative standard error SE and report it (e.g. 0.3:0.1); "
                         "the model-flat planner is the model-guided one ignoring what they report")
    ap.add_argument("--planners", default=None, help="comma list (tpe and gp are the optuna planner's samplers)")
    ap.add_argument("--realities", default=",".join(REALITIES))
    ap.add_argument("--pairs", type=int, default=len(PAIRS), help="how many model/cluster pairs to run")
    ap.add_argument("--models", default=None,
                    help="comma list of model names: run only these pairs (e.g. Qwen3-235B-A22B)")
    ap.add_argument("--gp-seeds", type=int, default=10,
                    help="seeds for the GP sampler (each ask takes about a second: 30 seeds of one reality and "
                         "three pairs take about an hour on 2 cores)")
    ap.add_argument("--quick", action="store_true", help="10 seeds, model and random only, two realities")
    ap.add_argument("--explain", type=int, default=0, metavar="K",
                    help="print why each model-guided run that needed more than K trials missed (0: off)")
    ap.add_argument("--hardness", action="store_true",
                    help="only say how hard each reality is (layouts at the goal, the model's rank of the best)")
    ap.add_argument("--stop-rule", action="store_true",
                    help="only test the driver's stop rule: model-guided runs go on past the goal until it fires "
                         "(use a larger --cap, e.g. 60): when, and how often an untried layout in truth still beat the "
                         "best by more than the noise")
    args = ap.parse_args(argv)
    noisy = None
    if args.noisy:
        try:
            noisy = tuple(float(x) for x in args.noisy.split(":"))
            assert len(noisy) == 2 and 0 <= noisy[0] <= 1 and noisy[1] > 0
        except (ValueError, AssertionError):
            ap.error(f"--noisy {args.noisy}: give SHARE:SE, a share in [0, 1] and a positive standard error (0.3:0.1)")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.quick:
        args.seeds, args.realities = min(args.seeds, 10), "f20+int,lomo"
        args.planners = args.planners or "model,random"
    planners = args.planners.split(",") if args.planners else default_planners()
    pairs = PAIRS[: args.pairs]
    if args.models:
        wanted = args.models.split(",")
        unknown = sorted(set(wanted) - {p[0] for p in PAIRS})
        if unknown:
            ap.error(f"--models {','.join(unknown)}: not a benchmark pair; choose from {', '.join(p[0] for p in PAIRS)}")
        pairs = [p for p in PAIRS if p[0] in wanted]
    _, r = lomo_residuals()
    lomo_rms, term_sd = float(np.sqrt(np.mean(r**2))), term_spread()
    if args.hardness:
        print_hardness([Setup(p) for p in pairs], args.realities.split(","), args.seeds, lomo_rms, term_sd)
        return 0
    if args.stop_rule:
        stop_rule_table([Setup(p) for p in pairs], args.realities.split(","), args.seeds, args.cap, args.noise,
                        lomo_rms, term_sd)
        return 0
    print(f"goal: within {1 - GOAL:.0%} of reality's best; cap {args.cap} trials; {args.seeds} seeds; "
          f"{args.noise:.0%} noise; leave-one-model-out RMS log error {lomo_rms:.3f}; term spread (terms-wide) "
          f"{term_sd:.3f}; CMA-ES: not applicable (categorical space)")
    print(f"{'reality':10s} {'model / cluster':32s} {'planner':10s} {'trials med':>10s} {'p90':>5s} "
          f"{'GPU-h med':>10s} {'p90':>7s} {'reached':>8s} {'GPU-h/hit':>9s} {'s/run':>6s}")
    setups = [Setup(p) for p in pairs]
    summary, floor = [], []
    for kind in args.realities.split(","):
        for s in setups:
            row, medians = {}, {}
            for planner in planners:
                seeds = min(args.seeds, args.gp_seeds) if planner == "gp" else args.seeds
                trials, hours, t0 = [], [], time.time()
                notes = []
                for seed in range(seeds):
                    reality = Reality(kind, s.model, s.cluster, s.workload, s.table, np.random.default_rng(seed),
                                      lomo_rms, term_sd)
                    explaining = bool(args.explain) and planner == "model"  # only its runs stop at K to be explained
                    run = one_run(s, reality, planner, seed, args.explain if explaining else args.cap, args.noise,
                                  args.parallel, noisy)
                    if explaining and run.trials is None:
                        notes.append(f"    seed {seed}: {explain(s, reality, run, args.noise)}")
                        if args.explain < args.cap:  # the whole run again, same reality and noise, for the table
                            reality = Reality(kind, s.model, s.cluster, s.workload, s.table,
                                              np.random.default_rng(seed), lomo_rms, term_sd)
                            run = one_run(s, reality, planner, seed, args.cap, args.noise, args.parallel, noisy)
                    k, h = run.trials, run.gpu_hours
                    trials.append(k if k is not None else args.cap + 1)
                    hours.append(h)
                t, h = np.array(trials), np.array(hours)
                hits = int(np.sum(t <= args.cap))
                # GPU-hours per run that reached the goal (all spent / runs that got there): a planner that
                # stalls or misses pays for its misses; inf when none reached it
                row[planner] = per_hit = float(h.sum() / hits) if hits else float("inf")
                medians[planner] = (float(np.median(t)), float(np.percentile(t, 90)))
                label = f"{s.name} / {s.cluster.count} x {s.cluster.gpu.name}"
                print(f"{kind:10s} {label:32s} {planner:10s} {np.median(t):10.1f} {np.percentile(t, 90):5.1f} "
                      f"{np.median(h):10.1f} {np.percentile(h, 90):7.1f} {np.mean(t <= args.cap):8.0%} "
                      f"{per_hit:9.1f} {(time.time() - t0) / seeds:6.2f}", flush=True)
                for line in notes:
                    print(line, flush=True)
            base = [row[p] for p in ("random", "tpe", "gp") if p in row]
            if "model" in row and base:
                summary.append((kind, s.name, min(base) / max(row["model"], 1e-9)))
            if "model" in medians and "oracle" in medians:
                floor.append((kind, s.name, medians["model"], medians["oracle"]))
    if summary:
        print("\nGPU-hours per run that reached the goal, best of random/TPE/GP over model-guided:")
        for kind, name, ratio in summary:
            print(f"  {kind:10s} {name:24s} " + (f"{ratio:5.1f}x" if np.isfinite(ratio) else
                                                  "  inf (no baseline reached the goal in any run)"))
    if floor:
        print("\nmodel-guided against the oracle (the same planner knowing how reality was drawn), trials median / p90:")
        for kind, name, (m, m90), (o, o90) in floor:
            print(f"  {kind:10s} {name:24s} model {m:5.1f} / {m90:5.1f}   oracle {o:5.1f} / {o90:5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
