"""The statistics of a results table: intervals, two-arm tests, effect sizes, multiplicity, power.

These are the numbers a reviewer checks in a results section, so each one is computed by
the textbook formula and tested against scipy/statsmodels. Where a quantity is undefined
(one episode, zero variance, no discordant pairs) the functions return None rather than
NaN or an infinite t: JSON has no NaN, and "undefined" is the honest answer. Functions take
plain sequences of numbers and know nothing about episodes or polars.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
from scipy import optimize
from scipy import stats as st

CONFIDENCE = 0.95
ALPHA = 0.05
POWER = 0.8
ADJUSTMENTS = ("holm", "bh", "none")
# Below this expected count in any cell of the 2x2 table the normal approximation of the
# two-proportion z test is unreliable and Fisher's exact test is used instead (Cochran's rule).
MIN_EXPECTED = 5.0


# What the tests take: a list of numbers, or a column as a numpy array (polars' to_numpy()).
Floats: TypeAlias = "Sequence[float] | np.ndarray"
Bools: TypeAlias = "Sequence[bool] | np.ndarray"


def _arr(values: Floats) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def _spread(x: np.ndarray) -> float:
    """Sample SD (ddof 1), exactly 0 when it is rounding noise: equal rewards computed by
    different float paths must not produce a t of 10^15."""
    sd = float(x.std(ddof=1))
    return 0.0 if sd <= _RELATIVE_NOISE * float(np.max(np.abs(x))) else sd


_RELATIVE_NOISE = 1e-12


def _quantile(confidence: float) -> float:
    return 1.0 - (1.0 - confidence) / 2.0


# -- one sample ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MeanCI:
    """Mean, sample SD (ddof 1) and a t interval; sd and the interval are None below 2 values."""

    n: int
    mean: float | None
    sd: float | None
    lo: float | None
    hi: float | None


def mean_ci(values: Floats, confidence: float = CONFIDENCE) -> MeanCI:
    """Student t interval for the mean: mean ± t(q, n−1)·sd/√n."""
    x = _arr(values)
    n = len(x)
    if n == 0:
        return MeanCI(0, None, None, None, None)
    return mean_ci_from(n, float(x.mean()), _spread(x) if n > 1 else None, confidence)


def mean_ci_from(n: int, mean: float | None, sd: float | None, confidence: float = CONFIDENCE) -> MeanCI:
    """The same interval from summary statistics (n, mean, sample SD), as a group-by gives."""
    if n == 0 or mean is None:
        return MeanCI(n, None, None, None, None)
    if n == 1 or sd is None:
        return MeanCI(n, mean, None, None, None)
    half = float(st.t.ppf(_quantile(confidence), n - 1)) * sd / math.sqrt(n)
    return MeanCI(n, mean, sd, mean - half, mean + half)


def wilson(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Wilson score interval for a proportion k/n; sensible at 0/n and n/n, unlike Wald."""
    if n <= 0:
        return None
    z = float(st.norm.ppf(_quantile(confidence)))
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return lo, hi


# -- two independent samples --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Welch:
    """Welch's unequal-variance t test of mean(b) − mean(a)."""

    diff: float | None
    lo: float | None
    hi: float | None
    t: float | None
    df: float | None
    p_value: float | None


def welch(a: Floats, b: Floats, confidence: float = CONFIDENCE) -> Welch:
    """Welch t with Welch–Satterthwaite df; undefined (None) when an arm has < 2 values or
    both arms have zero variance (the standard error is 0)."""
    xa, xb = _arr(a), _arr(b)
    na, nb = len(xa), len(xb)
    diff = float(xb.mean() - xa.mean()) if na and nb else None
    if na < 2 or nb < 2:
        return Welch(diff, None, None, None, None, None)
    va, vb = _spread(xa) ** 2 / na, _spread(xb) ** 2 / nb
    se2 = va + vb
    if se2 <= 0.0:
        return Welch(diff, None, None, None, None, None)
    df = se2 * se2 / (va * va / (na - 1) + vb * vb / (nb - 1))
    se = math.sqrt(se2)
    assert diff is not None
    t = diff / se
    p = float(2.0 * st.t.sf(abs(t), df))
    half = float(st.t.ppf(_quantile(confidence), df)) * se
    return Welch(diff, diff - half, diff + half, t, df, p)


@dataclass(frozen=True, slots=True)
class EffectSize:
    """Hedges' g of b − a, its interval, and the uncorrected d and correction J behind it."""

    g: float | None
    lo: float | None
    hi: float | None
    d: float | None
    j: float | None


def hedges_j(na: int, nb: int) -> float:
    """The small-sample correction J = 1 − 3/(4(na+nb) − 9) (Hedges 1981, approximation)."""
    return 1.0 - 3.0 / (4.0 * (na + nb) - 9.0)


def hedges_g(a: Floats, b: Floats, confidence: float = CONFIDENCE) -> EffectSize:
    """Hedges' g = J·(mean b − mean a)/pooled SD, with an exact interval.

    The interval inverts the noncentral t distribution of the two-sample t statistic
    (Steiger & Fouladi) to bound d, then applies J to both ends; it is exact under
    normality, where the usual ±1.96·SE interval is too narrow for 30 episodes per arm.
    """
    xa, xb = _arr(a), _arr(b)
    na, nb = len(xa), len(xb)
    if na < 2 or nb < 2:
        return EffectSize(None, None, None, None, None)
    df = na + nb - 2
    pooled = math.sqrt(((na - 1) * _spread(xa) ** 2 + (nb - 1) * _spread(xb) ** 2) / df)
    if pooled <= 0.0:
        return EffectSize(None, None, None, None, None)
    d = float(xb.mean() - xa.mean()) / pooled
    j = hedges_j(na, nb)
    scale = math.sqrt(1.0 / na + 1.0 / nb)
    t_obs = d / scale
    q = _quantile(confidence)
    ncp_lo = _nct_ncp(t_obs, df, q)
    ncp_hi = _nct_ncp(t_obs, df, 1.0 - q)
    return EffectSize(j * d, j * ncp_lo * scale, j * ncp_hi * scale, d, j)


def _nct_ncp(t_obs: float, df: float, cdf: float) -> float:
    """The noncentrality parameter at which P(T <= t_obs) = cdf (decreasing in ncp).

    The search starts from the large-sample approximation t ∓ z·√(1 + t²/2df), so few
    evaluations of the (slow, for large t) noncentral t CDF are needed. Where scipy's CDF
    breaks down numerically (t in the tens of thousands: effects no interval is needed
    to see) that approximation is returned."""

    def f(ncp: float) -> float:
        value = float(st.nct.cdf(t_obs, df, ncp)) - cdf
        if not math.isfinite(value):
            raise ArithmeticError
        return value

    spread = math.sqrt(1.0 + t_obs * t_obs / (2.0 * df))
    guess = t_obs - float(st.norm.ppf(cdf)) * spread
    try:
        step = 0.25 * spread + 0.1
        lo, hi = guess - step, guess + step
        for _ in range(60):
            if f(lo) > 0:
                break
            lo -= step
            step *= 2
        step = 0.25 * spread + 0.1
        for _ in range(60):
            if f(hi) < 0:
                break
            hi += step
            step *= 2
        return float(optimize.brentq(f, lo, hi, xtol=1e-12, rtol=1e-12))
    except (ArithmeticError, ValueError):
        return guess


# -- two proportions ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProportionTest:
    """Difference of two proportions (b − a), Newcombe's interval, and a two-sided test."""

    diff: float | None
    lo: float | None
    hi: float | None
    test: str | None
    p_value: float | None


def two_proportions(ka: int, na: int, kb: int, nb: int, confidence: float = CONFIDENCE) -> ProportionTest:
    """kb/nb − ka/na with Newcombe's hybrid score interval (method 10, from Wilson intervals),
    tested by the pooled two-proportion z test, or Fisher's exact test when any expected
    count of the 2×2 table is below 5 (all-or-nothing outcomes always go to Fisher)."""
    if na <= 0 or nb <= 0:
        return ProportionTest(None, None, None, None, None)
    pa, pb = ka / na, kb / nb
    diff = pb - pa
    wa, wb = wilson(ka, na, confidence), wilson(kb, nb, confidence)
    assert wa is not None and wb is not None
    lo = diff - math.sqrt((pb - wb[0]) ** 2 + (wa[1] - pa) ** 2)
    hi = diff + math.sqrt((wb[1] - pb) ** 2 + (pa - wa[0]) ** 2)
    total = na + nb
    events = ka + kb
    expected = min(r * c / total for r in (na, nb) for c in (events, total - events))
    if expected < MIN_EXPECTED:
        p = float(st.fisher_exact([[ka, na - ka], [kb, nb - kb]]).pvalue)
        test = "fisher"
    else:
        pooled = events / total
        z = diff / math.sqrt(pooled * (1 - pooled) * (1 / na + 1 / nb))
        p = float(2.0 * st.norm.sf(abs(z)))
        test = "z"
    return ProportionTest(diff, lo, hi, test, min(1.0, p))


# -- paired samples -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Paired:
    """Paired t test and Wilcoxon signed-rank test of the differences b − a."""

    pairs: int
    diff: float | None
    lo: float | None
    hi: float | None
    t: float | None
    df: int | None
    p_value: float | None
    wilcoxon_w: float | None
    wilcoxon_p: float | None


def paired(a: Floats, b: Floats, confidence: float = CONFIDENCE) -> Paired:
    """Tests on matched pairs (same seed in both arms). Wilcoxon drops zero differences
    (Wilcoxon's convention); when every difference is zero there is no evidence of a
    difference and its p value is 1. The t test is undefined when the differences are
    all equal (their SD is 0)."""
    xa, xb = _arr(a), _arr(b)
    if len(xa) != len(xb):
        raise ValueError("paired samples must have the same length")
    d = xb - xa
    n = len(d)
    if n == 0:
        return Paired(0, None, None, None, None, None, None, None, None)
    ci = mean_ci(d, confidence)
    t = p = None
    df = None
    if n >= 2:
        df = n - 1
        if ci.sd:
            t = ci.mean / (ci.sd / math.sqrt(n))  # type: ignore[operator]
            p = float(2.0 * st.t.sf(abs(t), df))
    if n < 2:
        w = wp = None
    elif not np.any(d != 0):
        w, wp = 0.0, 1.0
    else:
        res = st.wilcoxon(d)
        w, wp = float(res.statistic), float(res.pvalue)
    return Paired(n, ci.mean, ci.lo, ci.hi, t, df, p, w, wp)


@dataclass(frozen=True, slots=True)
class McNemar:
    """McNemar's exact test for paired binary outcomes (e.g. deadlock in A and in B)."""

    only_a: int
    only_b: int
    p_value: float


def mcnemar(a: Bools, b: Bools) -> McNemar:
    """Exact (binomial) McNemar test on the discordant pairs; p = 1 with none."""
    xa, xb = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if len(xa) != len(xb):
        raise ValueError("paired samples must have the same length")
    only_a = int(np.sum(xa & ~xb))
    only_b = int(np.sum(~xa & xb))
    discordant = only_a + only_b
    if discordant == 0:
        return McNemar(only_a, only_b, 1.0)
    p = float(st.binomtest(min(only_a, only_b), discordant, 0.5).pvalue)
    return McNemar(only_a, only_b, min(1.0, p))


# -- multiplicity -------------------------------------------------------------------------


def adjust(pvalues: Sequence[float | None], method: str = "holm") -> list[float | None]:
    """Holm (family-wise) or Benjamini–Hochberg (false discovery rate) adjusted p values.

    Undefined p values (None) stay None and do not count towards the family size.
    """
    if method not in ADJUSTMENTS:
        expected = ", ".join(ADJUSTMENTS)
        raise ValueError(f"unknown adjustment {method!r} (expected one of {expected})")
    out: list[float | None] = list(pvalues)
    if method == "none":
        return out
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    m = len(idx)
    order = sorted(idx, key=lambda i: pvalues[i])  # type: ignore[arg-type, return-value]
    if method == "holm":
        running = 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (m - rank) * pvalues[i]))  # type: ignore[operator]
            out[i] = running
    else:
        running = 1.0
        for rank in range(m - 1, -1, -1):
            i = order[rank]
            running = min(running, min(1.0, m / (rank + 1) * pvalues[i]))  # type: ignore[operator]
            out[i] = running
    return out


# -- power --------------------------------------------------------------------------------


def power(g: float, na: int, nb: int, alpha: float = ALPHA) -> float | None:
    """Power of the two-sided two-sample t test to detect standardised effect g with
    na and nb per arm, from the noncentral t distribution (both rejection tails)."""
    if na < 2 or nb < 2:
        return None
    df = na + nb - 2
    ncp = abs(g) * math.sqrt(na * nb / (na + nb))
    crit = float(st.t.ppf(1.0 - alpha / 2.0, df))
    return float(st.nct.sf(crit, df, ncp) + st.nct.cdf(-crit, df, ncp))


def sample_size(g: float, alpha: float = ALPHA, target: float = POWER, limit: int = 10**9) -> int | None:
    """Smallest number of episodes per arm (equal arms) whose power to detect g reaches
    `target`; None for g = 0 (no sample suffices) or beyond `limit`."""
    if not g or not math.isfinite(g):
        return None
    lo, hi = 2, 2
    while (power(g, hi, hi, alpha) or 0.0) < target:
        lo, hi = hi, hi * 2
        if hi > limit:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if (power(g, mid, mid, alpha) or 0.0) >= target:
            hi = mid
        else:
            lo = mid + 1
    return hi


def detectable_effect(na: int, nb: int, alpha: float = ALPHA, target: float = POWER) -> float | None:
    """The smallest |g| the two-sample t test detects with `target` power at na, nb:
    what a study of this size can and cannot see."""
    if na < 2 or nb < 2:
        return None

    def f(g: float) -> float:
        return (power(g, na, nb, alpha) or 0.0) - target

    hi = 1.0
    while f(hi) < 0:
        hi *= 2
        if hi > 1e6:
            return None
    return float(optimize.brentq(f, 0.0, hi, xtol=1e-10))
