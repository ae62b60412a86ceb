"""Statistics for comparing runs: evaluation estimators, paired and unpaired differences, noise decomposition, power,
rliable aggregates and ScaleRL compute curves. Formulas and sources: ../shared/docs/statistics.md.

Pure functions over numpy arrays; no MLflow, no bench imports, so every estimator is tested on fixed arrays against
scipy / statsmodels / rliable or hand values (tests/test_stats.py).

The data model of a comparison. A variant's evaluation is a matrix ``y[s, j]``: the outcome of seed ``s``'s run on
problem ``j`` (1/0 for greedy pass@1, the fraction correct for mean@k, a per-problem mean over eval steps for AUC).
Every run of a task answers the same problems in the same order, so seeds and problems are *crossed*:

    y[s, j] = μ + a_s + b_j + e_sj      (a: training seed, b: problem difficulty, e: this run on this problem)

The estimand is the expected difference between two variants over training seeds and over the problem population the
evaluation set is drawn from. Its variance has a seed part and a problem part; ``difference`` estimates both:

    Var(Δ̂) = s²_seed / n  +  τ² / M

where s²_seed is the sample variance over seeds of the per-seed differences d_s (paired: seeds matched, so a_s cancels
in part) or of each variant's per-seed means (unpaired, Welch), and τ² = Var_j(E[y_A·j − y_B·j]) is how much the
difference itself varies between problems (estimated by the method of moments, the seed noise removed; it is tiny
when the problem sets are shared). The interval is Student t with the seeds' degrees of freedom.

Why not the percentile hierarchical bootstrap (seeds, then problems): in the simulation of tests/test_stats.py (1000
problems) it covers about 87 % at 3 seeds and 93 % at 5 instead of 95 % (resampling three seeds can never show more
spread than the three have), and a t interval on the bootstrap's standard error counts the run-level noise twice
(once between seeds, once between problems) and over-covers (99 %); the interval below covers 94-97 %.
``hierarchical_bootstrap`` is kept as an option (``interval="bootstrap"``) for sweeps with many seeds; its p-value is
then read from the same replicates, so interval and p agree.

Noise. The seed-to-seed spread of a variant's run means ȳ_s· = μ + a_s + b̄ + ē_s· holds no problem-difficulty term
(every seed answers the same problems, so b̄ is common to all), and evaluation noise is Var(ē_s·) = σ²_e / M, estimated
from the seed x problem interaction mean square of the two-way layout (``noise``). A bootstrap over the problems
within one run estimates the binomial SE of that run, Var_j(y_sj) / M = (σ²_b + σ²_e) / M: it counts problem difficulty
that no seed-to-seed spread holds, and overstates evaluation noise.
Power. The problem term τ²/M of a difference does not shrink with more seeds: ``mde`` and ``seeds_needed`` hold it
fixed, and it sets a floor (``mde_floor``) below which no number of seeds detects a difference on this evaluation set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

Interval = Literal["t", "bootstrap"]
Correction = Literal["holm", "bh"]
ALPHA, POWER = 0.05, 0.8


# ---- evaluation estimators ----------------------------------------------------------------------------------------
def pass_at_k(n: np.ndarray | int, c: np.ndarray | int, k: int) -> np.ndarray:
    """Unbiased pass@k per problem (Chen et al. 2021, Eq. 1): 1 − C(n − c, k) / C(n, k) for n samples of which c are
    correct, computed as 1 − ∏_{i=n−c+1}^{n} (1 − k / i) (no large binomials). Requires k ≤ n."""
    n, c = np.broadcast_arrays(np.asarray(n, dtype=np.int64), np.asarray(c, dtype=np.int64))
    if np.any(k > n) or k < 1:
        raise ValueError(f"pass@{k} needs 1 <= k <= n samples per problem, got n = {np.unique(n).tolist()}")
    if np.any((c < 0) | (c > n)):
        raise ValueError("pass@k: the number correct must lie in 0..n")
    out = np.ones(n.shape, dtype=np.float64)
    for idx in np.ndindex(n.shape):
        ni, ci = int(n[idx]), int(c[idx])
        if ni - ci >= k:
            out[idx] = 1.0 - float(np.prod(1.0 - k / np.arange(ni - ci + 1, ni + 1, dtype=np.float64)))
    return out


def binomial_se(p: float, n: int) -> float:
    """Standard error of a mean of n Bernoulli outcomes at rate p: sqrt(p (1 − p) / n)."""
    return math.sqrt(p * (1.0 - p) / n) if n > 0 else math.nan


def mean_se(x: np.ndarray) -> float:
    """Standard error of a mean of per-problem values (e.g. mean@k): sample sd / sqrt(n)."""
    from scipy.stats import sem

    x = np.asarray(x, dtype=np.float64)
    return float(sem(x)) if len(x) > 1 else math.nan


# ---- differences between two variants ----------------------------------------------------------------------------
@dataclass
class Difference:
    """A − B with its standard error, interval and two-sided p-value."""

    estimate: float
    se: float
    df: float
    lo: float
    hi: float
    p: float
    paired: bool
    seeds: tuple[int, int]
    problems: int
    method: str
    seed_var: float = math.nan
    """The seed part of se² (s²_seed / n paired; s²_A / n_A + s²_B / n_B unpaired): shrinks with more seeds."""
    problem_var: float = 0.0
    """The problem part of se² (τ̂² / M): fixed by the evaluation set, whatever the seeds."""

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    @property
    def seed_sd(self) -> float:
        """The per-seed SD behind ``seed_var``: of the per-seed differences (paired), or the pooled per-variant SD at
        equal seeds (unpaired: s²_A / n + s²_B / n = 2 s² / n)."""
        n = min(self.seeds)
        return math.sqrt(self.seed_var * (n if self.paired else n / 2)) if self.seed_var >= 0 else math.nan

    def mde(self, seeds: int | None = None, *, alpha: float = ALPHA, power: float = POWER) -> float:
        """The difference this comparison detects with this power at level α (two-sided), at its own seeds or at
        ``seeds`` per variant: the seed part rescaled, the problem part held fixed (module function ``mde``)."""
        n = seeds or min(self.seeds)
        return mde(self.seed_sd, n, paired=self.paired, alpha=alpha, power=power, problem_var=self.problem_var)

    def mde_interval(self, *, alpha: float = ALPHA, power: float = POWER, level: float = 0.95) -> tuple[float, float]:
        """A ``level`` interval for ``mde()``: the seed SD's χ² interval on the comparison's degrees of freedom
        (n − 1 paired, Welch's unpaired), the problem part held at its estimate."""
        from scipy import stats

        if not (self.df > 0 and math.isfinite(self.seed_var)):
            return math.nan, math.nan
        q = (1 - level) / 2
        out = []
        for chi in (stats.chi2.ppf(1 - q, self.df), stats.chi2.ppf(q, self.df)):
            sd = self.seed_sd * math.sqrt(self.df / chi)
            out.append(mde(sd, min(self.seeds), paired=self.paired, alpha=alpha, power=power,
                           problem_var=self.problem_var))  # fmt: skip
        return out[0], out[1]


def _problem_term(a: np.ndarray, b: np.ndarray, paired: bool) -> float:
    """τ̂² / M: the between-problem variance of the difference (method of moments, seed noise removed), over M."""
    M = a.shape[1]
    if M < 2:
        return 0.0
    if paired:
        d = a - b  # [S, M]
        noise = d.var(axis=0, ddof=1).mean() / d.shape[0] if d.shape[0] > 1 else 0.0
        raw = d.mean(axis=0).var(ddof=1)
    else:
        noise = sum(x.var(axis=0, ddof=1).mean() / x.shape[0] for x in (a, b) if x.shape[0] > 1)
        raw = (a.mean(axis=0) - b.mean(axis=0)).var(ddof=1)
    return max(raw - noise, 0.0) / M


def difference(
    a: np.ndarray,
    b: np.ndarray,
    *,
    paired: bool,
    alpha: float = ALPHA,
    interval: Interval = "t",
    reps: int = 2000,
    seed: int = 0,
) -> Difference:
    """A − B from per-seed x per-problem outcomes ``a`` [S_a, M] and ``b`` [S_b, M] on the same M problems.

    ``paired``: row s of ``a`` and of ``b`` come from the same seed (same warm start, same prompt stream), so the
    seed-level analysis uses the per-seed differences (S − 1 degrees of freedom); otherwise Welch's unequal-variance
    analysis of the two sets of seeds. The between-problem term is added in both (module docstring).
    ``interval="bootstrap"``: the percentile interval of ``hierarchical_bootstrap`` instead (undercovers at few seeds).
    A matrix with a single column is a run-level value per seed (no per-problem outcomes): the problem term is 0.
    """
    from scipy import stats

    a, b = np.atleast_2d(np.asarray(a, np.float64)), np.atleast_2d(np.asarray(b, np.float64))
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"the two variants were evaluated on different problem sets ({a.shape[1]} vs {b.shape[1]})")
    if paired and a.shape[0] != b.shape[0]:
        raise ValueError(f"a paired difference needs the same seeds on both sides ({a.shape[0]} vs {b.shape[0]})")
    est = float(a.mean() - b.mean())
    Sa, Sb, M = a.shape[0], b.shape[0], a.shape[1]
    nan = Difference(est, math.nan, math.nan, math.nan, math.nan, math.nan, paired, (Sa, Sb), M, "too few seeds")
    if paired:
        if Sa < 2:
            return nan
        d = a.mean(1) - b.mean(1)
        seed_var, df = float(d.var(ddof=1)) / Sa, Sa - 1.0
    else:
        if Sa < 2 or Sb < 2:
            return nan
        va, vb = float(a.mean(1).var(ddof=1)) / Sa, float(b.mean(1).var(ddof=1)) / Sb
        seed_var = va + vb
        df = seed_var**2 / (va**2 / (Sa - 1) + vb**2 / (Sb - 1)) if seed_var > 0 else float(Sa + Sb - 2)
    problem_var = _problem_term(a, b, paired)
    se = math.sqrt(seed_var + problem_var)
    parts = dict(seed_var=seed_var, problem_var=problem_var)
    if se == 0:
        p = 1.0 if est == 0 else 0.0
        return Difference(est, 0.0, df, est, est, p, paired, (Sa, Sb), M, "t (no variance)", **parts)
    if interval == "bootstrap":
        reps_ = hierarchical_bootstrap(a, b, paired=paired, reps=reps, seed=seed)
        lo, hi = np.percentile(reps_, [100 * alpha / 2, 100 * (1 - alpha / 2)])
        method = "percentile hierarchical bootstrap (p from the same replicates)"
        return Difference(est, se, df, float(lo), float(hi), bootstrap_p(reps_), paired, (Sa, Sb), M, method, **parts)
    p = float(2 * stats.t.sf(abs(est) / se, df))
    q = float(stats.t.ppf(1 - alpha / 2, df))
    return Difference(est, se, df, est - q * se, est + q * se, p, paired, (Sa, Sb), M, "t (seeds x problems)", **parts)


def bootstrap_p(replicates: np.ndarray) -> float:
    """The two-sided p-value that agrees with the percentile interval of the same replicates: twice the smaller share
    of replicates on either side of 0 (ties count half), at least 1 / reps; the (1 − α) percentile interval excludes
    0 exactly when this p is at most α (up to the replicates' granularity)."""
    r = np.asarray(replicates, np.float64)
    below = (np.sum(r < 0) + 0.5 * np.sum(r == 0)) / len(r)
    return float(min(1.0, max(2 * min(below, 1 - below), 1 / len(r))))


def hierarchical_bootstrap(
    a: np.ndarray, b: np.ndarray | None = None, *, paired: bool = True, reps: int = 2000, seed: int = 0
) -> np.ndarray:
    """Bootstrap replicates of mean(a) − mean(b) (of mean(a) when ``b`` is None): resample seeds (the same seed
    indices for both variants when ``paired``), then problems. The problem indices of a replicate are shared by every
    seed and, on the same problem set, by both variants: the seeds answer the same problems (a crossed design), so
    the problems are one draw, not one per run. Vectorised: a replicate's run means are ``y @ w`` for the
    multinomial problem weights ``w``."""
    rng = np.random.default_rng(seed)
    a = np.atleast_2d(np.asarray(a, np.float64))
    M = a.shape[1]
    w = rng.multinomial(M, np.full(M, 1.0 / M), size=reps).T / M  # [M, reps] problem weights
    ia = rng.integers(0, a.shape[0], size=(reps, a.shape[0]))  # [reps, S] seed indices
    out = np.take_along_axis((a @ w).T, ia, axis=1).mean(1)  # [reps]
    if b is None:
        return out
    b = np.atleast_2d(np.asarray(b, np.float64))
    ib = ia if paired else rng.integers(0, b.shape[0], size=(reps, b.shape[0]))
    return out - np.take_along_axis((b @ w).T, ib, axis=1).mean(1)


def adjust(pvalues: list[float], method: Correction = "holm") -> list[float]:
    """Multiple-comparison adjusted p-values: Holm's step-down (family-wise error) or Benjamini-Hochberg (false
    discovery rate), by statsmodels; NaNs (untestable comparisons) stay NaN and do not count."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full_like(p, np.nan)
    ok = ~np.isnan(p)
    if ok.any():
        out[ok] = multipletests(p[ok], method={"holm": "holm", "bh": "fdr_bh"}[method])[1]
    return out.tolist()


# ---- noise decomposition and power -------------------------------------------------------------------------------
@dataclass
class Noise:
    """Seed-to-seed variance of a run-level value split into evaluation noise and training noise (as SDs), with the
    problem-difficulty spread that every seed shares beside it (not part of the seed-to-seed spread)."""

    observed_sd: float
    eval_sd: float
    train_sd: float
    seeds: int
    problems: int
    problem_sd: float = math.nan
    """SD of the problems' difficulty b_j (the per-problem means, seed noise removed): common to all seeds."""
    within_run_se: float = math.nan
    """One run's SE over its problems, sqrt(mean_s Var_j(y_sj) / M): counts b_j too, so it overstates eval_sd."""

    @property
    def eval_share(self) -> float:
        """Fraction of the observed seed-to-seed variance that is evaluation noise."""
        return self.eval_sd**2 / self.observed_sd**2 if self.observed_sd > 0 else math.nan


def noise(y: np.ndarray) -> Noise:
    """``y`` [S, M] (seeds x the same M problems): the two-way decomposition y_sj = μ + a_s + b_j + e_sj. The spread of
    the run means over seeds has expectation σ²_a + σ²_e / M (b_j is common to every seed); evaluation variance is
    σ̂²_e / M with σ̂²_e the seed x problem interaction mean square Σ (y_sj − ȳ_s· − ȳ_·j + ȳ)² / ((S − 1)(M − 1));
    training variance is the rest (floored at 0). Needs 2 seeds and 2 problems (NaN otherwise)."""
    y = np.atleast_2d(np.asarray(y, np.float64))
    S, M = y.shape
    nan = math.nan
    within = math.sqrt(float(y.var(axis=1, ddof=1).mean()) / M) if M > 1 else nan
    if S < 2 or M < 2:
        obs = math.sqrt(float(y.mean(1).var(ddof=1))) if S > 1 else nan
        return Noise(obs, nan, nan, S, M, nan, within)
    rows, cols, grand = y.mean(1), y.mean(0), y.mean()
    ms_int = float(((y - rows[:, None] - cols[None, :] + grand) ** 2).sum()) / ((S - 1) * (M - 1))
    eval_var = ms_int / M
    obs = float(rows.var(ddof=1))
    problem_var = max(float(cols.var(ddof=1)) - ms_int / S, 0.0)
    return Noise(math.sqrt(obs), math.sqrt(eval_var), math.sqrt(max(obs - eval_var, 0.0)), S, M,
                 math.sqrt(problem_var), within)  # fmt: skip


def _power_factor(n: int, paired: bool, alpha: float, power: float) -> float:
    """k(n): the detectable difference is k(n) x the standard error of the difference at n seeds per variant
    (statsmodels' noncentral-t solver: paired, the one-sample test on n per-seed differences; else two groups of n);
    k tends to z_{1−α/2} + z_{power} (2.80 at 0.05, 0.8) as n grows."""
    from statsmodels.stats.power import TTestIndPower, TTestPower

    if paired:
        es = TTestPower().solve_power(effect_size=None, nobs=n, alpha=alpha, power=power, alternative="two-sided")
        return float(np.asarray(es).item()) * math.sqrt(n)
    es = TTestIndPower().solve_power(effect_size=None, nobs1=n, alpha=alpha, power=power, ratio=1.0)
    return float(np.asarray(es).item()) * math.sqrt(n / 2)


def mde_floor(problem_var: float, *, alpha: float = ALPHA, power: float = POWER) -> float:
    """The detectable difference with infinitely many seeds: (z_{1−α/2} + z_{power}) · sqrt(τ²/M), set by the
    evaluation set alone (0 without a problem term)."""
    from scipy import stats

    return float((stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)) * math.sqrt(max(problem_var, 0.0)))


def mde(
    sd: float, n: int, *, paired: bool, alpha: float = ALPHA, power: float = POWER, problem_var: float = 0.0
) -> float:
    """Minimum detectable effect of a two-sided t-test at level α and this power: ``paired``, the one-sample test on
    per-seed differences of SD ``sd`` over n seeds; else two independent groups of n seeds, each of SD ``sd``.
    ``problem_var`` (τ²/M, a ``Difference``'s problem part) is added to the seed part's variance unchanged: it does
    not shrink with seeds. NaN when n is too small for a test."""
    if not (sd >= 0 and math.isfinite(sd)) or n < 2 or (sd == 0 and problem_var <= 0):
        return math.nan
    seed_var = sd**2 / n if paired else 2 * sd**2 / n
    return _power_factor(n, paired, alpha, power) * math.sqrt(seed_var + max(problem_var, 0.0))


def seeds_needed(
    delta: float,
    sd: float,
    *,
    paired: bool,
    alpha: float = ALPHA,
    power: float = POWER,
    most: int = 100_000,
    problem_var: float = 0.0,
) -> float:
    """Seeds (per variant) for a two-sided t-test to detect ``delta`` with this power: the smallest integer n with
    mde(sd, n) <= delta, the problem part held fixed. inf when ``delta`` is at or below the floor that part sets
    (``mde_floor``: no number of seeds gets there on this evaluation set) or beyond ``most`` seeds."""
    if not (sd > 0 and math.isfinite(sd)):
        return math.nan
    if delta <= mde_floor(problem_var, alpha=alpha, power=power):
        return math.inf
    kw = dict(paired=paired, alpha=alpha, power=power, problem_var=problem_var)
    lo, hi = 2, 2
    while mde(sd, hi, **kw) > delta:
        lo, hi = hi, hi * 2
        if hi > most:
            return math.inf
    while lo < hi:  # smallest n in [lo, hi] that detects delta
        mid = (lo + hi) // 2
        if mde(sd, mid, **kw) <= delta:
            hi = mid
        else:
            lo = mid + 1
    return float(hi)


# ---- rliable aggregates --------------------------------------------------------------------------------------------
def aggregates(scores: dict[str, np.ndarray], *, reps: int = 2000, seed: int = 0) -> dict[str, dict[str, tuple]]:
    """Mean and IQM of ``scores[variant]`` [runs, tasks] with rliable's stratified bootstrap CIs (runs resampled
    within each task; percentile, 95 %) -> {variant: {"mean": (point, lo, hi), "iqm": (...)}}."""
    from rliable import library as rly
    from rliable import metrics

    np.random.seed(seed)  # rliable draws from numpy's global generator
    fn = lambda x: np.array([metrics.aggregate_mean(x), metrics.aggregate_iqm(x)])  # noqa: E731
    point, ci = rly.get_interval_estimates({k: np.asarray(v, float) for k, v in scores.items()}, fn, reps=reps)
    names = ("mean", "iqm")
    return {
        k: {n: (float(point[k][i]), float(ci[k][0][i]), float(ci[k][1][i])) for i, n in enumerate(names)}
        for k in scores
    }


def probability_of_improvement(
    x: np.ndarray, y: np.ndarray, *, reps: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """P(X > Y) (Mann-Whitney U / (n_x n_y), ties count one half, averaged over tasks) with rliable's stratified
    bootstrap 95 % CI; ``x``, ``y`` [runs, tasks]."""
    from rliable import library as rly
    from rliable import metrics

    np.random.seed(seed)
    point, ci = rly.get_interval_estimates(
        {"pair": [np.asarray(x, float), np.asarray(y, float)]},
        lambda a, b: np.array([metrics.probability_of_improvement(a, b)]),
        reps=reps,
    )
    return float(point["pair"][0]), float(ci["pair"][0][0]), float(ci["pair"][1][0])


def _p_greater(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) with ties one half, over the last axis of x [..., n_x] against y [..., n_y]."""
    d = x[..., :, None] - y[..., None, :]
    return ((d > 0) + 0.5 * (d == 0)).mean(axis=(-2, -1))


def improvement_test(x: np.ndarray, y: np.ndarray, *, reps: int = 20_000, seed: int = 0) -> float:
    """Two-sided p-value for P(X > Y) = 1/2 (``x``, ``y`` [runs, tasks]): a permutation test of the statistic
    mean over tasks of P(X > Y), the runs' labels permuted within each task. Exact (every split enumerated) when one
    task's splits number at most ``reps``; for one task that is the exact Mann-Whitney test, ties included. Otherwise
    ``reps`` random permutations (p = (1 + hits) / (1 + reps)). Unlike the percentile-bootstrap interval of
    ``probability_of_improvement`` (which excludes 0.5 in about 7.5 % of null trials at 5 runs a side,
    tests/test_stats.py), its level holds at any number of runs."""
    import itertools

    x, y = np.atleast_2d(np.asarray(x, np.float64)), np.atleast_2d(np.asarray(y, np.float64))
    nx, ny, T = x.shape[0], y.shape[0], x.shape[1]
    pooled = np.concatenate([x, y]).T  # [T, n]
    n = nx + ny
    observed = abs(float(_p_greater(x.T, y.T).mean()) - 0.5)
    if T == 1 and math.comb(n, nx) <= reps:
        idx = np.array(list(itertools.combinations(range(n), nx)))  # [K, nx]
        rest = np.array([[j for j in range(n) if j not in set(row)] for row in idx])
        stat = np.abs(_p_greater(pooled[0][idx], pooled[0][rest]) - 0.5)
        return float(np.mean(stat >= observed - 1e-12))
    rng = np.random.default_rng(seed)
    perm = np.argsort(rng.random((reps, T, n)), axis=-1)  # a permutation per replicate and task
    z = np.take_along_axis(np.broadcast_to(pooled, (reps, T, n)), perm, axis=-1)
    stat = np.abs(_p_greater(z[..., :nx], z[..., nx:]).mean(-1) - 0.5)
    return float((1 + np.sum(stat >= observed - 1e-12)) / (1 + reps))


# ---- compute curves (ScaleRL) --------------------------------------------------------------------------------------
@dataclass
class CurveFit:
    """R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) (Khatri et al. 2025, ScaleRL, Eq. 1), with seed-bootstrap CIs."""

    A: float
    B: float
    C_mid: float
    R0: float
    ci: dict[str, tuple[float, float]]
    determined: bool
    reason: str
    points: int


def sigmoid(C: np.ndarray, A: float, B: float, C_mid: float, R0: float) -> np.ndarray:
    """R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B), written R0 + (A − R0) · expit(B (ln C − ln C_mid)) (no overflow)."""
    from scipy.special import expit

    C = np.asarray(C, np.float64)
    return R0 + (A - R0) * expit(B * (np.log(np.maximum(C, 1e-300)) - math.log(C_mid)))


def _fit_once(C: np.ndarray, R: np.ndarray, R0: float, start: tuple | None = None) -> tuple[float, float, float] | None:
    """Least squares in (A, B, L = ln C_mid) within the bounds 0 <= A <= 1, 0.01 <= B <= 10, C_mid within 10^±3 of
    the compute observed, with the analytic Jacobian: from three starting midpoints (the fit is not convex), or from
    ``start`` alone (a bootstrap refit started at the point estimate)."""
    from scipy.optimize import curve_fit
    from scipy.special import expit

    lnC = np.log(C)

    def f(_, A, B, L):
        return R0 + (A - R0) * expit(B * (lnC - L))

    def jac(_, A, B, L):
        g = expit(B * (lnC - L))
        dg = g * (1.0 - g)
        return np.stack([g, (A - R0) * dg * (lnC - L), -(A - R0) * dg * B], axis=1)

    cmax = float(C.max())
    lo, hi = [0.0, 1e-2, math.log(cmax * 1e-3)], [1.0, 10.0, math.log(cmax * 1e3)]
    if start is not None:
        starts = [[start[0], start[1], math.log(start[2])]]
    else:
        a0 = min(max(float(R.max()), 1e-3), 1.0 - 1e-3)
        starts = [[a0, 1.0, math.log(cmax * m)] for m in (0.25, 1.0, 4.0)]
    best = None
    for p0 in starts:
        p0 = [min(max(x, l_ + 1e-9), h - 1e-9) for x, l_, h in zip(p0, lo, hi, strict=True)]
        try:
            p, _ = curve_fit(f, C, R, p0=p0, bounds=(lo, hi), jac=jac, maxfev=400 if start is not None else 2000)
        except (RuntimeError, ValueError):
            continue
        sse = float(((f(C, *p) - R) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, p)
    if best is None:
        return None
    A, B, L = best[1]
    return float(A), float(B), float(math.exp(L))


def fit_compute_curve(
    curves: list[tuple[np.ndarray, np.ndarray]], R0: float, *, reps: int = 100, seed: int = 0
) -> CurveFit | None:
    """Fit the ScaleRL sigmoid to every seed's (compute, value) points pooled, with R0 fixed to the measured start
    (the shared warm start's value) and points at C = 0 left out; CIs from refitting on seeds resampled with
    replacement. Not determined (flagged, with the reason) when the fit fails, the midpoint lies beyond the compute
    observed (the curve has not bent yet), the asymptote sits on a bound, the gain's interval holds 0, or the
    midpoint's interval spans more than a factor of 10."""
    C = np.concatenate([np.asarray(c, np.float64) for c, _ in curves])
    R = np.concatenate([np.asarray(r, np.float64) for _, r in curves])
    keep = C > 0
    C, R = C[keep], R[keep]
    if len(C) < 4 or len(np.unique(C)) < 3:
        return None
    fit = _fit_once(C, R, R0)
    if fit is None:
        return CurveFit(math.nan, math.nan, math.nan, R0, {}, False, "the fit did not converge", len(C))
    A, B, C_mid = fit
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(reps if len(curves) > 1 else 0):
        pick = [curves[i] for i in rng.integers(0, len(curves), len(curves))]
        c = np.concatenate([np.asarray(x, np.float64) for x, _ in pick])
        r = np.concatenate([np.asarray(y, np.float64) for _, y in pick])
        got = _fit_once(c[c > 0], r[c > 0], R0, start=fit) if (c > 0).sum() >= 4 else None
        if got is not None:
            draws.append(got)
    ci = {}
    if draws:
        arr = np.array(draws)
        for i, name in enumerate(("A", "B", "C_mid")):
            ci[name] = (float(np.percentile(arr[:, i], 2.5)), float(np.percentile(arr[:, i], 97.5)))
    reasons = []
    if C_mid > C.max():
        reasons.append("the midpoint lies beyond the compute observed (the curve has not bent yet)")
    if A >= 1.0 - 1e-3 or A <= 1e-3:
        reasons.append("the asymptote sits on its bound")
    if "A" in ci and ci["A"][0] <= R0 <= ci["A"][1]:
        reasons.append("the gain A − R0 is not distinguishable from 0")
    if "C_mid" in ci and ci["C_mid"][1] > 10 * ci["C_mid"][0]:
        reasons.append("the midpoint is not pinned down (its interval spans more than a factor of 10)")
    return CurveFit(A, B, C_mid, R0, ci, not reasons, "; ".join(reasons) or "ok", len(C))
