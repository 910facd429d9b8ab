"""dphil.core.maths against scipy, statsmodels and hand computation; dphil.results on real episodes."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats as st
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestIndPower
from statsmodels.stats.proportion import (
    confint_proportions_2indep,
    proportion_confint,
    proportions_ztest,
)

from dphil.core import maths as stats
from dphil.core.episode import play
from dphil.core.policies import get_policy
from dphil.core.records import EpisodeConfig
from dphil.io.errors import DataError, UsageError
from dphil.results import cells, comparisons, fields, frame
from dphil.scoring.reward import RewardSpec
from dphil.scoring.score import score_record

A = np.array([0.82, 0.91, 0.77, 0.95, 0.88, 0.69, 0.93, 0.85, 0.80, 0.90])
B = np.array([0.71, 0.99, 0.64, 0.97, 0.58, 0.92, 0.61, 1.00, 0.75, 0.66, 0.83, 0.70])
APPROX = {"rel": 1e-9, "abs": 1e-12}


# -- one sample -----------------------------------------------------------------------------


def test_mean_ci_matches_scipy_t_interval():
    ci = stats.mean_ci(A)
    lo, hi = st.t.interval(0.95, len(A) - 1, loc=A.mean(), scale=st.sem(A))
    assert ci.n == 10
    assert ci.mean == pytest.approx(A.mean(), **APPROX)
    assert ci.sd == pytest.approx(A.std(ddof=1), **APPROX)
    assert (ci.lo, ci.hi) == (pytest.approx(lo, **APPROX), pytest.approx(hi, **APPROX))


def test_mean_ci_by_hand():
    # [1, 2, 3, 4]: mean 2.5, sd sqrt(5/3), t(0.975, 3) = 3.182446305
    ci = stats.mean_ci([1, 2, 3, 4])
    half = 3.182446305284263 * math.sqrt(5 / 3) / 2
    assert ci.lo == pytest.approx(2.5 - half, rel=1e-9)
    assert ci.hi == pytest.approx(2.5 + half, rel=1e-9)


def test_mean_ci_edge_cases():
    assert stats.mean_ci([]) == stats.MeanCI(0, None, None, None, None)
    one = stats.mean_ci([0.7])
    assert (one.n, one.mean, one.sd, one.lo, one.hi) == (1, 0.7, None, None, None)
    flat = stats.mean_ci([1.0] * 30)
    assert (flat.sd, flat.lo, flat.hi) == (0.0, 1.0, 1.0)


@pytest.mark.parametrize("k,n", [(0, 30), (3, 30), (15, 30), (30, 30), (1, 1), (7, 200)])
def test_wilson_matches_statsmodels(k, n):
    lo, hi = stats.wilson(k, n)
    ref = proportion_confint(k, n, alpha=0.05, method="wilson")
    assert lo == pytest.approx(ref[0], abs=1e-12)
    assert hi == pytest.approx(ref[1], abs=1e-12)


def test_wilson_by_hand_and_edges():
    z2 = st.norm.ppf(0.975) ** 2
    assert stats.wilson(0, 10) == (0.0, pytest.approx(z2 / (10 + z2), rel=1e-12))
    assert stats.wilson(10, 10) == (pytest.approx(10 / (10 + z2), rel=1e-12), 1.0)
    assert stats.wilson(0, 0) is None


# -- two samples ----------------------------------------------------------------------------


def test_welch_matches_scipy():
    w = stats.welch(A, B)
    ref = st.ttest_ind(B, A, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert w.diff == pytest.approx(B.mean() - A.mean(), **APPROX)
    assert w.t == pytest.approx(ref.statistic, **APPROX)
    assert w.df == pytest.approx(ref.df, **APPROX)
    assert w.p_value == pytest.approx(ref.pvalue, **APPROX)
    assert (w.lo, w.hi) == (pytest.approx(ci.low, **APPROX), pytest.approx(ci.high, **APPROX))


def test_welch_satterthwaite_df_by_hand():
    # a = [1,2,3]: var 1, /3; b = [2,4,6,8]: var 20/3, /4 = 5/3. se^2 = 2.
    w = stats.welch([1, 2, 3], [2, 4, 6, 8])
    df = 4.0 / ((1 / 3) ** 2 / 2 + (5 / 3) ** 2 / 3)
    assert w.df == pytest.approx(df, rel=1e-12)
    assert w.t == pytest.approx(3 / math.sqrt(2), rel=1e-12)
    assert w.p_value == pytest.approx(2 * st.t.sf(3 / math.sqrt(2), df), rel=1e-12)


def test_welch_edge_cases():
    single = stats.welch([0.5], [0.1, 0.2])
    assert single.diff == pytest.approx(-0.35)
    assert (single.lo, single.hi, single.t, single.df, single.p_value) == (None,) * 5
    assert stats.welch([], [1.0, 2.0]).diff is None
    zero = stats.welch([1.0] * 5, [0.0] * 5)
    assert zero.diff == -1.0 and zero.t is None and zero.p_value is None and zero.lo is None
    # One arm constant: df falls back to the other arm's n - 1.
    one_flat = stats.welch([1.0] * 6, [1.0, 2.0, 3.0, 4.0])
    assert one_flat.df == pytest.approx(3.0)


def test_hedges_g_by_hand():
    na, nb = len(A), len(B)
    pooled = math.sqrt(((na - 1) * A.var(ddof=1) + (nb - 1) * B.var(ddof=1)) / (na + nb - 2))
    j = 1 - 3 / (4 * (na + nb) - 9)
    es = stats.hedges_g(A, B)
    assert es.j == pytest.approx(j, rel=1e-15)
    assert es.d == pytest.approx((B.mean() - A.mean()) / pooled, rel=1e-12)
    assert es.g == pytest.approx(j * (B.mean() - A.mean()) / pooled, rel=1e-12)
    assert stats.hedges_j(30, 30) == pytest.approx(1 - 3 / 231, rel=1e-15)


def test_hedges_g_ci_inverts_the_noncentral_t():
    es = stats.hedges_g(A, B)
    na, nb = len(A), len(B)
    scale = math.sqrt(1 / na + 1 / nb)
    t_obs = es.d / scale
    df = na + nb - 2
    # The bounds are the noncentralities that put t_obs at the 97.5th and 2.5th percentiles.
    assert st.nct.cdf(t_obs, df, es.lo / es.j / scale) == pytest.approx(0.975, abs=1e-9)
    assert st.nct.cdf(t_obs, df, es.hi / es.j / scale) == pytest.approx(0.025, abs=1e-9)
    assert es.lo < es.g < es.hi


def test_hedges_g_ci_near_normal_approximation_for_large_arms():
    rng = np.random.default_rng(7)
    a, b = rng.normal(0, 1, 2000), rng.normal(0.3, 1, 2000)
    es = stats.hedges_g(a, b)
    se = math.sqrt(4000 / (2000 * 2000) + es.d**2 / (2 * 4000))
    assert es.lo == pytest.approx(es.j * (es.d - 1.959964 * se), abs=2e-3)
    assert es.hi == pytest.approx(es.j * (es.d + 1.959964 * se), abs=2e-3)


def test_hedges_g_is_antisymmetric_and_undefined_cases():
    ab, ba = stats.hedges_g(A, B), stats.hedges_g(B, A)
    assert ab.g == pytest.approx(-ba.g) and ab.lo == pytest.approx(-ba.hi, abs=1e-9)
    assert stats.hedges_g([1.0], [1.0, 2.0]).g is None
    assert stats.hedges_g([1.0, 1.0], [1.0, 1.0]).g is None


# -- two proportions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ka,na,kb,nb",
    [(3, 30, 10, 30), (12, 30, 20, 30), (0, 30, 4, 30), (30, 30, 30, 30), (0, 30, 0, 30), (25, 40, 9, 35)],
)
def test_two_proportions_interval_matches_statsmodels_newcombe(ka, na, kb, nb):
    res = stats.two_proportions(ka, na, kb, nb)
    lo, hi = confint_proportions_2indep(kb, nb, ka, na, method="newcomb", compare="diff")
    assert res.diff == pytest.approx(kb / nb - ka / na, abs=1e-15)
    assert res.lo == pytest.approx(lo, abs=1e-10)
    assert res.hi == pytest.approx(hi, abs=1e-10)


def test_two_proportions_uses_z_for_large_counts_and_fisher_for_small():
    big = stats.two_proportions(12, 30, 20, 30)
    assert big.test == "z"
    _, p = proportions_ztest([20, 12], [30, 30])
    assert big.p_value == pytest.approx(p, rel=1e-10)
    small = stats.two_proportions(1, 30, 6, 30)
    assert small.test == "fisher"
    assert small.p_value == pytest.approx(st.fisher_exact([[1, 29], [6, 24]]).pvalue, rel=1e-12)


def test_two_proportions_all_or_no_deadlocks():
    all_dl = stats.two_proportions(30, 30, 30, 30)
    none_dl = stats.two_proportions(0, 30, 0, 30)
    for res in (all_dl, none_dl):
        assert res.diff == 0.0 and res.test == "fisher" and res.p_value == 1.0
    assert stats.two_proportions(0, 0, 1, 3).p_value is None


# -- paired ---------------------------------------------------------------------------------


def test_paired_matches_scipy():
    a, b = A, B[: len(A)]
    res = stats.paired(a, b)
    ref = st.ttest_rel(b, a)
    ci = ref.confidence_interval(0.95)
    assert res.pairs == 10 and res.df == 9
    assert res.t == pytest.approx(ref.statistic, **APPROX)
    assert res.p_value == pytest.approx(ref.pvalue, **APPROX)
    assert (res.lo, res.hi) == (pytest.approx(ci.low, **APPROX), pytest.approx(ci.high, **APPROX))
    w = st.wilcoxon(b - a)
    assert res.wilcoxon_w == w.statistic and res.wilcoxon_p == pytest.approx(w.pvalue, **APPROX)


def test_paired_edge_cases():
    same = stats.paired([0.5, 0.7, 0.9], [0.5, 0.7, 0.9])
    assert same.diff == 0.0 and same.t is None and same.p_value is None
    assert (same.wilcoxon_w, same.wilcoxon_p) == (0.0, 1.0)
    shifted = stats.paired([0.1, 0.2, 0.3], [0.2, 0.3, 0.4])
    assert shifted.diff == pytest.approx(0.1) and shifted.t is None
    assert stats.paired([], []).pairs == 0
    single = stats.paired([1.0], [2.0])
    assert single.diff == 1.0 and single.t is None and single.wilcoxon_p is None
    with pytest.raises(ValueError):
        stats.paired([1.0], [1.0, 2.0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mcnemar_matches_statsmodels_exact(seed):
    rng = np.random.default_rng(seed)
    a = rng.random(40) < 0.5
    b = rng.random(40) < 0.3
    res = stats.mcnemar(a, b)
    table = [[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]]
    ref = sm_mcnemar(table, exact=True)
    assert (res.only_a, res.only_b) == (table[0][1], table[1][0])
    assert res.p_value == pytest.approx(ref.pvalue, rel=1e-12)


def test_mcnemar_without_discordant_pairs():
    assert stats.mcnemar([True, False], [True, False]) == stats.McNemar(0, 0, 1.0)


# -- multiplicity and power -----------------------------------------------------------------


@pytest.mark.parametrize("method,sm", [("holm", "holm"), ("bh", "fdr_bh")])
def test_adjust_matches_statsmodels(method, sm):
    p = [0.01, 0.04, 0.03, 0.2, 0.005, 0.5]
    assert stats.adjust(p, method) == pytest.approx(list(multipletests(p, method=sm)[1]), rel=1e-12)


def test_adjust_by_hand_with_undefined_values():
    # Holm over 3 defined values: 0.01*3, max(0.03, 0.02*2), max(0.04, 0.04*1).
    assert stats.adjust([0.02, None, 0.01, 0.04], "holm") == [
        pytest.approx(0.04),
        None,
        pytest.approx(0.03),
        pytest.approx(0.04),
    ]
    assert stats.adjust([0.02, None], "none") == [0.02, None]
    assert stats.adjust([], "holm") == []
    with pytest.raises(ValueError):
        stats.adjust([0.1], "bonferroni")


@pytest.mark.parametrize("g", [0.11, 0.3, 0.5, 0.8, 1.5, -0.5])
def test_power_and_sample_size_match_statsmodels(g):
    solver = TTestIndPower()
    assert stats.power(g, 30, 30) == pytest.approx(solver.power(abs(g), 30, 0.05), rel=1e-9)
    n = stats.sample_size(g)
    assert n == math.ceil(solver.solve_power(effect_size=abs(g), alpha=0.05, power=0.8))
    assert stats.power(g, n, n) >= 0.8 > stats.power(g, n - 1, n - 1)


def test_power_study_sizes():
    # The study's 30 per arm: only g of about 0.74 or more is seen with 80% power, and the
    # observed g = -0.11 would need about 1,300 episodes per arm.
    mde = stats.detectable_effect(30, 30)
    assert mde == pytest.approx(TTestIndPower().solve_power(nobs1=30, alpha=0.05, power=0.8), rel=1e-4)
    assert 0.72 < mde < 0.75
    assert 1250 < stats.sample_size(-0.11) < 1350
    assert stats.sample_size(0.0) is None
    assert stats.power(0.5, 1, 30) is None


# -- cells on real scored episodes ----------------------------------------------------------


def scored(policy: str, n: int, seeds, **variant) -> list[dict]:
    spec = RewardSpec()
    out = []
    for seed in seeds:
        config = EpisodeConfig(model=f"scripted:{policy}", n=n, seed=seed, variant=variant)
        out.append(score_record(play(config, get_policy(policy)), spec))
    return out


def write(path, records, *, raw_lines=()) -> str:
    with open(path, "wb") as fh:
        for r in records:
            fh.write(json.dumps(r).encode() + b"\n")
        for line in raw_lines:
            fh.write(line)
    return str(path)


@pytest.fixture(scope="module")
def grid():
    recs = []
    for policy in ("hierarchy", "naive", "random", "idle"):
        for n in (5, 10):
            recs += scored(policy, n, range(12))
    return recs


def errored(record: dict) -> dict:
    r = dict(record, status="error", error="API call failed", reward=None, metrics=None)
    return r


def test_cells_agree_with_a_direct_computation(tmp_path, grid):
    path = write(tmp_path / "ep.jsonl", grid)
    ep = frame.load([path], ["model", "n"])
    got = {(c["model"], c["n"]): c for c in cells.cell_records(ep, ["model", "n"])}
    assert len(got) == 8
    for (model, n), c in got.items():
        mine = [r for r in grid if r["model"] == model and r["n"] == n]
        rewards = np.array([r["reward"]["total"] for r in mine])
        dl = sum(r["deadlock"] for r in mine)
        turns = [t for r in mine for t in r["turns"]]
        acted = [t for t in turns if t["action"] is not None]
        assert c["episodes"] == 12 and c["errors"] == 0
        assert c["reward_mean"] == pytest.approx(rewards.mean(), rel=1e-12)
        assert c["reward_std"] == pytest.approx(rewards.std(ddof=1), abs=1e-12)
        assert c["deadlocks"] == dl
        assert c["deadlock_ci"] == pytest.approx(list(stats.wilson(dl, 12)))
        assert c["meals_mean"] == pytest.approx(np.mean([sum(r["meals"]) for r in mine]))
        assert c["degenerate_rate"] == pytest.approx(
            np.mean([not r["deadlock"] and sum(r["meals"]) == 0 for r in mine])
        )
        assert c["throughput_mean"] == pytest.approx(np.mean([r["metrics"]["throughput_per_round"] for r in mine]))
        assert c["starvation_mean"] == pytest.approx(np.mean([r["metrics"]["starvation"] for r in mine]))
        assert c["null_action_rate"] == pytest.approx(sum(t["action"] is None for t in turns) / len(turns))
        if acted:
            assert c["failed_action_rate"] == pytest.approx(sum(not t["ok"] for t in acted) / len(acted))
        else:
            assert c["failed_action_rate"] is None
        assert c["turns"] == len(turns) and c["cost"] == 0.0
    naive = got[("scripted:naive", 5)]
    assert naive["deadlock_rate"] == 1.0 and naive["deadlock_ci"][1] == 1.0  # all deadlocks
    assert naive["time_to_deadlock_mean"] == 1.0
    hier = got[("scripted:hierarchy", 5)]
    assert hier["deadlock_rate"] == 0.0 and hier["deadlock_ci"][0] == 0.0  # no deadlocks
    assert hier["time_to_deadlock_mean"] is None
    idle = got[("scripted:idle", 5)]
    assert idle["degenerate_rate"] == 1.0 and idle["null_action_rate"] == 1.0
    assert idle["reward_std"] == 0.0 and idle["reward_ci"] == [1.0, 1.0]  # zero variance


def test_degenerate_cells_warn_and_errors_are_counted_not_used(tmp_path, grid):
    recs = scored("idle", 5, range(4)) + [errored(r) for r in scored("hierarchy", 5, range(3))]
    recs += scored("hierarchy", 5, range(3, 8))
    path = write(tmp_path / "ep.jsonl", recs)
    warnings: list[str] = []
    out = cells.cell_records(frame.load([path], ["model"]), ["model"], warn=warnings.append)
    hier = next(c for c in out if c["model"] == "scripted:hierarchy")
    assert hier["episodes"] == 5 and hier["errors"] == 3
    expected = np.mean([r["reward"]["total"] for r in recs[7:]])
    assert hier["reward_mean"] == pytest.approx(expected)
    assert any("3 errored" in w for w in warnings)
    assert any("scripted:idle" in w and "4 of 4" in w and "degenerate" in w for w in warnings)
    assert not any("hierarchy" in w and "degenerate" in w for w in warnings)


def test_cell_of_one_episode_and_cell_of_only_errors(tmp_path):
    recs = scored("random", 5, [3]) + [errored(r) for r in scored("naive", 5, [1, 2])]
    out = cells.cell_records(frame.load([write(tmp_path / "e.jsonl", recs)], ["model"]), ["model"])
    one, none = out[1], out[0]
    assert one["episodes"] == 1 and one["reward_std"] is None and one["reward_ci"] is None
    assert one["deadlock_ci"] is not None
    assert none["episodes"] == 0 and none["errors"] == 2 and none["reward_mean"] is None
    assert none["deadlock_rate"] is None and none["deadlock_ci"] is None


def test_empty_input(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"\n\n")
    ep = frame.load([str(path)], ["model", "n"])
    assert ep.count == 0
    assert cells.cell_records(ep, ["model", "n"]) == []


def test_comparison_pairs_by_seed_and_matches_scipy(tmp_path):
    recs = scored("random", 5, range(20)) + scored("hierarchy", 5, range(20))
    wanted = [comparisons.Compare("model", "scripted:random", "scripted:hierarchy")]
    ep = frame.load([write(tmp_path / "ep.jsonl", recs)], ["model", "n"], compares=wanted)
    [comp] = comparisons.comparison_records(ep, ["model", "n"], wanted, power=True)
    ra = np.array([r["reward"]["total"] for r in recs[:20]])
    rb = np.array([r["reward"]["total"] for r in recs[20:]])
    ref = st.ttest_ind(rb, ra, equal_var=False)
    assert comp["n"] == 5 and comp["field"] == "model"
    assert comp["a"]["value"] == "scripted:random" and comp["b"]["episodes"] == 20
    assert comp["welch_t"] == pytest.approx(ref.statistic) and comp["df"] == pytest.approx(ref.df)
    assert comp["p_adjusted"] == comp["p_value"]  # a family of one
    assert comp["paired"] is True
    pt = comp["paired_tests"]
    assert pt["pairs"] == 20
    assert pt["p_value"] == pytest.approx(st.ttest_rel(rb, ra).pvalue)
    assert comp["power"]["episodes_per_arm"] == stats.sample_size(comp["hedges_g"])
    assert comp["power"]["effect_source"] == "observed"


def test_comparisons_unpaired_when_seeds_differ_and_holm_across_groups(tmp_path):
    recs = []
    for n in (5, 10):
        recs += scored("random", n, range(10)) + scored("greedy", n, range(100, 110))
    wanted = [comparisons.Compare("model", "scripted:random", "scripted:greedy")]
    ep = frame.load([write(tmp_path / "ep.jsonl", recs)], ["model", "n"], compares=wanted)
    comps = comparisons.comparison_records(ep, ["model", "n"], wanted)
    assert [c["n"] for c in comps] == [5, 10]
    assert all(c["paired"] is False and c["paired_tests"] is None for c in comps)
    holm = stats.adjust([c["p_value"] for c in comps], "holm")
    assert [c["p_adjusted"] for c in comps] == holm
    assert all(c["adjust"] == "holm" for c in comps)


def test_comparison_skips_a_group_missing_an_arm_and_rejects_unknown_values(tmp_path):
    recs = scored("random", 5, range(5)) + scored("random", 10, range(5))
    recs += scored("hierarchy", 5, range(5))
    wanted = comparisons.Compare("model", "scripted:random", "scripted:hierarchy")
    unknown = comparisons.Compare("model", "scripted:random", "gpt-x")
    ep = frame.load([write(tmp_path / "ep.jsonl", recs)], ["model", "n"], compares=[wanted, unknown])
    warnings: list[str] = []
    comps = comparisons.comparison_records(ep, ["model", "n"], [wanted], warn=warnings.append)
    assert [c["n"] for c in comps] == [5]
    assert any("n=10" in w and "skipped" in w for w in warnings)
    with pytest.raises(UsageError, match="no episodes with model = 'gpt-x'"):
        comparisons.comparison_records(ep, ["model", "n"], [unknown])


def test_free_fields_get_number_types_and_can_be_compared(tmp_path):
    recs = scored("random", 5, range(6), checkpoint_step=0)
    recs += scored("random", 5, range(6, 12), checkpoint_step=200)
    wanted = [comparisons.Compare("checkpoint_step", "0", "200")]
    ep = frame.load([write(tmp_path / "ep.jsonl", recs)], ["checkpoint_step"], compares=wanted)
    assert ep.types["checkpoint_step"] == pl.Int64
    out = cells.cell_records(ep, ["checkpoint_step"])
    assert [c["checkpoint_step"] for c in out] == [0, 200]
    [comp] = comparisons.comparison_records(ep, ["checkpoint_step"], wanted)
    assert comp["a"]["value"] == 0 and comp["b"]["value"] == 200 and comp["paired"] is False


def test_missing_grouping_field_is_its_own_null_group(tmp_path):
    recs = scored("random", 5, range(3), prompt="v2") + scored("random", 5, range(3))
    out = cells.cell_records(frame.load([write(tmp_path / "e.jsonl", recs)], ["prompt"]), ["prompt"])
    assert [(c["prompt"], c["episodes"]) for c in out] == [("v2", 3), (None, 3)]


def test_usage_totals(tmp_path):
    recs = scored("random", 5, range(3))
    recs[0]["usage"] = {"prompt_tokens": 1000, "completion_tokens": 50, "cost": 0.25}
    recs[1]["usage"] = {"prompt_tokens": 10, "completion_tokens": 5, "cost": None}
    [c] = cells.cell_records(frame.load([write(tmp_path / "e.jsonl", recs)], ["model"]), ["model"])
    assert (c["prompt_tokens"], c["completion_tokens"], c["cost"]) == (1010, 55, 0.25)


def test_mixed_reward_variants_are_refused(tmp_path):
    recs = scored("random", 5, range(3))
    recs += [
        score_record(
            play(EpisodeConfig(model="scripted:random", n=5, seed=9), get_policy("random")),
            RewardSpec(variant="shaped"),
        )
    ]
    ep = frame.load([write(tmp_path / "e.jsonl", recs)], ["model"])
    with pytest.raises(DataError, match="mixes reward variants paper and shaped"):
        cells.cell_records(ep, ["model"])


# -- reading: the slow path names the line; gzip, BOM and skip give the same numbers --------


def _line_error(tmp_path, grid, bad: bytes, field=("model", "n")) -> DataError:
    path = write(tmp_path / "bad.jsonl", grid[:3], raw_lines=[bad])
    with pytest.raises(DataError) as err:
        frame.load([path], list(field))
    assert err.value.source == path and err.value.line == 4
    return err.value


@pytest.mark.parametrize(
    "bad,reason",
    [
        (b'{"model": "x", "n": \n', "invalid JSON"),
        (b"[1, 2]\n", "expected a JSON object"),
        (b'{"kind": "cell", "model": "x"}\n', "kind 'cell'"),
        (b'{"status": "complete", "model": "x", "n": 5}\n', "not scored"),
        (b'{"status": "done"}\n', "'status'"),
        (b'{"status": "complete", "n": "five"}\n', "'n' should be an integer"),
        (b'{"model": "x", "n": 5, "status": "complete", "reward": {"total": NaN}}\n', "NaN"),
        (b'{"model": "x", "n": 5, "status": "complete"', "truncated"),
    ],
)
def test_malformed_line_named_with_its_line(tmp_path, grid, bad, reason):
    assert reason in _line_error(tmp_path, grid, bad).message


def test_unscored_episode_is_named(tmp_path, grid):
    raw = dict(grid[0])
    del raw["reward"], raw["metrics"]
    err = _line_error(tmp_path, grid, json.dumps(raw).encode() + b"\n")
    assert "run dphil-score first" in err.message


def test_object_grouping_field_is_refused(tmp_path, grid):
    raw = dict(grid[0], prompt={"name": "v1"})
    err = _line_error(tmp_path, grid, json.dumps(raw).encode() + b"\n", field=("prompt",))
    assert "'prompt' is an object" in err.message


def test_gzip_bom_and_skip_read_the_same(tmp_path, grid):
    plain = write(tmp_path / "a.jsonl", grid)
    data = Path(plain).read_bytes()
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(gzip.compress(data))
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + data)
    bad = write(tmp_path / "bad.jsonl", grid[:5], raw_lines=[b"{oops\n"])
    with open(bad, "ab") as fh:
        fh.write(b"".join(json.dumps(r).encode() + b"\n" for r in grid[5:]))
    by = ["model", "n"]
    want = cells.cell_records(frame.load([plain], by), by)
    assert cells.cell_records(frame.load([str(gz)], by), by) == want
    assert cells.cell_records(frame.load([str(bom)], by), by) == want
    warned: list[str] = []
    skipping = frame.load([bad], by, on_error="skip", warn=warned.append)
    assert skipping.skipped == 1 and warned and ":6:" in warned[0]
    assert cells.cell_records(skipping, by) == want


def test_slow_path_frame_equals_fast_path_frame(tmp_path, grid):
    recs = [*grid[:20], errored(grid[20])]
    recs[0]["usage"] = {"prompt_tokens": 7, "completion_tokens": 3, "cost": 0.5}
    path = write(tmp_path / "ep.jsonl", recs)
    fields = ["model", "n", "seed"]
    data = Path(path).read_bytes()
    raw = dict(frame._RAW) | {"model": pl.String(), "n": pl.Int64()}
    parsed = pl.read_ndjson(data, schema=raw)
    fast = frame._derive(parsed, fields)
    assert not frame._has_bad_rows(parsed, fast, fields)  # polars read it all
    slow, lines, skipped = frame._load_slowly(path, data, 1, fields, "fail", lambda _: None)
    assert skipped == 0
    assert fast.equals(slow)
    assert lines.tolist() == frame._row_lines(data, 1, fast.height).tolist() == list(range(1, len(recs) + 1))


def test_grouping_by_output_names_is_refused():
    for bad in ("reward", "turns", "episodes", "_seed", "model,model", ""):
        with pytest.raises(UsageError):
            fields.parse_by(bad)
    assert fields.parse_by("model, n,protocol") == ["model", "n", "protocol"]


def test_grouping_by_seed_gives_integer_seeds(tmp_path):
    recs = scored("random", 5, [4, 2]) + scored("hierarchy", 5, [4])
    out = cells.cell_records(frame.load([write(tmp_path / "e.jsonl", recs)], ["seed"]), ["seed"])
    assert [(c["seed"], c["episodes"]) for c in out] == [(2, 1), (4, 2)]


def test_plot_without_n_draws_one_point_per_cell(tmp_path, grid):
    from dphil.results import figure

    ep = frame.load([write(tmp_path / "e.jsonl", grid)], ["model"])
    target = tmp_path / "by-model.svg"
    figure.plot(cells.cell_records(ep, ["model"]), ["model"], str(target))
    svg = target.read_text()
    assert svg.startswith("<?xml") and "scripted:hierarchy" in svg


def test_hedges_g_ci_for_an_enormous_effect_stays_finite():
    # t of about 10^5: scipy's noncentral t CDF gives NaN there; the interval falls back to
    # the large-sample approximation instead of failing.
    a = np.tile([0.0, 0.01, 0.02], 40_000)
    b = a + 1.0 + np.tile([0.0, 0.0, 0.001], 40_000)
    es = stats.hedges_g(a, b)
    assert es.g is not None and math.isfinite(es.lo) and math.isfinite(es.hi)
    assert es.lo < es.g < es.hi
