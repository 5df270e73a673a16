"""One suite for every registered planner: it proposes only untried candidates that are legal, at most k
of them, copes with an empty or exhausted context, and learns through observe() without repeating."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.layout import violations
from autotune.layout.dimensions import layout_key
from autotune.search.candidates import Candidates
from autotune.search.planners import PLANNERS, PlannerOptions, TrialRecord, get_planner
from autotune.space import load_space

# planners that need an endpoint are exercised by their own tests
OFFLINE = [name for name in PLANNERS if name != "llm"]


@pytest.fixture(scope="module")
def cands():
    model = load_model("Qwen3.5-122B-A10B")
    cluster = ClusterSpec.of("H200", 32)
    return Candidates(model, cluster, Workload(), load_space(None, model))


@pytest.fixture(params=OFFLINE)
def planner(request, tmp_path):
    return get_planner(request.param, PlannerOptions(seed=3, sampler="tpe", out_dir=tmp_path / "planner"))


def _finish(cands, lay, number: int) -> TrialRecord:
    i = cands.index.get(layout_key(lay))
    value = float(cands.pred[i]) if i is not None else None
    return TrialRecord(number, lay, "ok" if value else "screened", "predicted", value, value)


def test_proposes_at_most_k_legal_untried_candidates(planner, cands):
    history: list[TrialRecord] = []
    seen: set[str] = set()
    for round_ in range(6):
        props = planner.propose(cands.context(history, 0), 2)
        assert len(props) <= 2 and props, f"round {round_}: nothing proposed with {len(cands):,} open candidates"
        keys = [layout_key(p.layout) for p in props]
        assert len(set(keys)) == len(keys), "the same layout twice in one batch"
        for p, key in zip(props, keys):
            assert key not in seen, f"{p.layout.label()} proposed again after it was tried"
            assert violations(cands.model, cands.workload, p.layout) == []
            assert p.why and "\n" not in p.why
            seen.add(key)
            rec = _finish(cands, p.layout, len(history))
            history.append(rec)
            planner.observe(rec)
    # the model-guided and random planners only ever name candidates
    if planner.name in ("model", "random"):
        assert all(k in cands.index for k in seen)


def test_exhausted_context_gives_nothing(planner, cands):
    ctx = cands.context([], 0)
    ctx.tried = set(ctx.keys)  # every candidate tried
    history = [_finish(cands, cands.table.row(i), i) for i in range(3)]
    ctx.history = history
    for rec in history:
        planner.observe(rec)
    props = planner.propose(ctx, 3)
    assert all(layout_key(p.layout) not in ctx.keys for p in props)


def test_k_zero_is_empty(planner, cands):
    assert planner.propose(cands.context([], 0), 0) == []


def test_model_planner_spends_the_first_trial_on_the_best_optimistic_candidate(cands):
    p = get_planner("model").propose(cands.context([], 0), 1)[0]
    score = cands.pred * (1 + cands.pred_std)
    assert layout_key(p.layout) == cands.keys[int(np.argmax(score))]


def test_unknown_planner_is_a_one_line_bad_input():
    from autotune.errors import BadInput

    with pytest.raises(BadInput, match="choose one of"):
        get_planner("abacus")


def test_model_planner_moves_after_a_measurement_that_contradicts_the_model():
    # the planner's first pick A, and a candidate B that differs from A in one layout value only: when B
    # measures as predicted the planner goes one way; when B is 40% slower than predicted, every layout
    # with B's value loses belief and the next pick moves
    model = load_model("Qwen3.5-122B-A10B")
    fresh = lambda: Candidates(model, ClusterSpec.of("H200", 32), Workload(), load_space(None, model))  # noqa: E731
    c0 = fresh()
    planner = get_planner("model")
    a = c0.index[layout_key(planner.propose(c0.context([], 0), 1)[0].layout)]
    X, groups = c0.residual.Xc, np.array(c0.residual.groups)
    main = np.array(["_x_" not in g and not g.startswith("term:") for g in groups])  # layout values
    one_off = [i for i in range(len(X)) if len(set(groups[(X[i] != X[a]) & main])) == 1]
    b = max(one_off, key=lambda i: c0.pred[i])
    value = np.flatnonzero((X[b] != X[a]) & main & (X[b] > 0))[0]  # B's own value of the group they differ in
    picks, preds = [], []
    for factor in (1.0, 0.6):
        c = fresh()
        history = []
        for n, i in enumerate((a, b)):
            v = float(c0.pred[i] * (factor if i == b else 1.0))
            c.learn(c.table.row(i), v)
            history.append(TrialRecord(n, c.table.row(i), "ok", "measured", v, float(c0.pred[i])))
        picks.append(layout_key(planner.propose(c.context(history, 0), 1)[0].layout))
        preds.append(c.pred.copy())
    assert picks[0] != picks[1]
    drop = np.log(preds[1] / preds[0])
    has = X[:, value] > 0
    assert drop[has].mean() < drop[~has].mean() - 0.1


def test_the_first_model_guided_proposal_does_not_compare_a_layout_with_itself(cands):
    """With no trial yet there is no incumbent: the rationale says so instead of giving the pick's chance to beat
    its own prediction; once a trial is in, it gives the chance to beat that trial."""
    from autotune.search.planners import get_planner

    p = get_planner("model")
    first = p.propose(cands.context([], 0), 1)[0]
    assert "no trial yet" in first.why and "chance to beat" not in first.why
    rec = _finish(cands, first.layout, 0)
    second = p.propose(cands.context([rec], 0), 1)[0]
    assert "chance to beat the best simulated trial" in second.why


def test_the_optuna_mirror_samples_a_split_among_its_pp_and_vpps_own():
    """Qwen3-235B-A22B's candidates hold many layer splits, each fitting one PP x VPP. The mirror's layer_split is a
    position among the splits of the sampled PP x VPP (a handful), every candidate maps there and back, and a
    position a pair lacks maps to nothing rather than to another pair's split."""
    from autotune.layout.dimensions import layout_params
    from autotune.layout.splits import legal_splits, parse_split

    model = load_model("Qwen3-235B-A22B")
    space = load_space(None, model)
    space.dimensions.recompute, space.dimensions.optimizer_offload = ["full:uniform:1"], [0.0]
    c = Candidates(model, ClusterSpec.of("H100", 64), Workload(), space)
    opt = get_planner("optuna", PlannerOptions(seed=1, sampler="tpe"))
    ctx = c.context([], 0)
    opt._start(ctx)
    names = {layout_params(c.table.row(i))["layer_split"] for i in range(len(c.table))}
    assert len(names) > 10 and len(opt.dists["layer_split"].choices) <= 7
    for i in range(0, len(c.table), max(1, len(c.table) // 200)):
        p = layout_params(c.table.row(i))
        assert opt._from_mirror(opt._to_mirror(p)) == p
    for (pp, vpp), splits in opt.splits.items():
        for k in opt.dists["layer_split"].choices:
            got = opt._from_mirror({"pp": pp, "vpp": vpp, "layer_split": k})
            assert (got is None) == (k >= len(splits))
            if got is not None and got["layer_split"] != "even":
                assert parse_split(got["layer_split"]) in legal_splits(94, pp, vpp)
