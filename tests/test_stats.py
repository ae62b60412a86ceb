"""The statistics behind every report: each estimator against scipy / statsmodels / rliable or hand values on fixed
arrays, unbiased pass@k against brute-force enumeration, and a simulation of synthetic runs with a known effect
and known noise that checks the intervals' coverage and the tests' false-rejection rate at the seed counts the
sweeps ship (3 and 5)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from bench import stats as S


# ---- evaluation estimators ----------------------------------------------------------------------------------------
def _brute_pass_at_k(n: int, c: int, k: int) -> float:
    """The fraction of the C(n, k) size-k subsets of n samples (c correct) that hold at least one correct sample."""
    items = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(items[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_brute_force_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            got = float(S.pass_at_k(n, c, k))
            want = _brute_pass_at_k(n, c, k)
            assert got == pytest.approx(want, abs=1e-12), (n, c, k, got, want)


def test_pass_at_k_vectorised_and_checked():
    n, c = np.array([4, 4, 10]), np.array([0, 1, 3])
    # pass@2: 0; 1 − C(3,2)/C(4,2) = 1 − 3/6 = 0.5; 1 − C(7,2)/C(10,2) = 1 − 21/45 = 0.5333...
    assert S.pass_at_k(n, c, 2) == pytest.approx([0.0, 0.5, 1 - 21 / 45])
    assert S.pass_at_k(n, c, 1) == pytest.approx(c / n)  # pass@1 is the fraction correct
    with pytest.raises(ValueError, match="k <= n"):
        S.pass_at_k(n, c, 5)
    with pytest.raises(ValueError, match="0..n"):
        S.pass_at_k(4, 5, 1)


def test_standard_errors_hand_values():
    assert S.binomial_se(0.4, 200) == pytest.approx(0.0346410, abs=1e-6)  # statistics.md: 0.035
    assert S.binomial_se(0.4, 1000) == pytest.approx(0.0154919, abs=1e-6)
    x = np.array([0.0, 0.5, 1.0, 0.25])  # sd (ddof 1) = 0.4270, / 2
    assert S.mean_se(x) == pytest.approx(np.std(x, ddof=1) / 2)


# ---- differences ----------------------------------------------------------------------------------------------------
def test_run_level_paired_and_unpaired_differences_equal_scipy():
    """With one value per run (no per-problem outcomes) the intervals are the classical t tests."""
    a = np.array([[0.41], [0.45], [0.38], [0.47]])
    b = np.array([[0.40], [0.41], [0.37], [0.42]])
    p = S.difference(a, b, paired=True)
    ref = sps.ttest_rel(a[:, 0], b[:, 0])
    ci = ref.confidence_interval(0.95)
    assert p.estimate == pytest.approx(0.0275) and p.p == pytest.approx(ref.pvalue)
    assert (p.lo, p.hi) == pytest.approx((ci.low, ci.high)) and p.df == 3
    u = S.difference(a, b, paired=False)
    ref = sps.ttest_ind(a[:, 0], b[:, 0], equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert u.p == pytest.approx(ref.pvalue) and (u.lo, u.hi) == pytest.approx((ci.low, ci.high))
    assert u.df == pytest.approx(ref.df)


def test_problem_term_hand_value():
    """2 seeds x 3 problems, paired. d = a − b = [[1, 0, 0], [1, 1, 0]]: per-seed means 1/3, 2/3 (var 1/18, /2 =
    1/36); per-problem means 1, 1/2, 0 (var 1/4); per-problem variance over seeds 0, 1/2, 0 (mean 1/6, /2 seeds =
    1/12); τ̂² = 1/4 − 1/12 = 1/6, / 3 problems = 1/18. SE² = 1/36 + 1/18 = 1/12."""
    a = np.array([[1, 1, 0], [1, 1, 1]], float)
    b = np.array([[0, 1, 0], [0, 0, 1]], float)
    d = S.difference(a, b, paired=True)
    assert d.estimate == pytest.approx(0.5) and d.se == pytest.approx(math.sqrt(1 / 12)) and d.df == 1
    q = sps.t.ppf(0.975, 1)
    assert (d.lo, d.hi) == pytest.approx((0.5 - q * math.sqrt(1 / 12), 0.5 + q * math.sqrt(1 / 12)))


def test_difference_refuses_mismatched_designs():
    with pytest.raises(ValueError, match="different problem sets"):
        S.difference(np.zeros((3, 10)), np.zeros((3, 11)), paired=False)
    with pytest.raises(ValueError, match="same seeds"):
        S.difference(np.zeros((3, 10)), np.zeros((2, 10)), paired=True)
    one = S.difference(np.ones((1, 5)), np.zeros((1, 5)), paired=True)
    assert one.estimate == 1.0 and math.isnan(one.lo) and one.method == "too few seeds"


def test_hierarchical_bootstrap_variance_of_one_run_is_the_binomial_variance():
    rng = np.random.default_rng(3)
    y = (rng.random((1, 1000)) < 0.4).astype(float)
    p = y.mean()
    reps = S.hierarchical_bootstrap(y, reps=8000, seed=1)
    assert reps.mean() == pytest.approx(p, abs=0.002)
    assert reps.std() == pytest.approx(math.sqrt(p * (1 - p) / 1000), rel=0.05)
    # paired replicates of a variant against itself are all exactly 0
    assert np.all(S.hierarchical_bootstrap(y, y, paired=True, reps=50) == 0)


def _crossed(rng, S_: int, M: int, s_seed: float, s_problem: float, s_eval: float) -> np.ndarray:
    """y_sj = 0.4 + a_s + b_j + e_sj with known SDs (Gaussian): the evaluation variance of a run mean is s_eval² / M."""
    return (0.4 + rng.normal(0, s_seed, (S_, 1)) + rng.normal(0, s_problem, (1, M))
            + rng.normal(0, s_eval, (S_, M)))  # fmt: skip


def test_noise_two_way_decomposition_recovers_a_known_split():
    """Seeds x problems with a known split (training SD 0.01, problem difficulty SD 0.3, interaction SD 0.35 on 1000
    problems: evaluation SD 0.0111, its share of the seed-to-seed variance 0.55). Over 400 simulated sweeps of 5 seeds
    the two-way estimate of the evaluation variance is unbiased (mean within 3 % of the truth, whose MC SE is ~1.6 %),
    while one run's SE over its problems (the old estimate) counts the problem difficulty too: 0.0147 against 0.0111."""
    rng = np.random.default_rng(11)
    M, s_seed, s_problem, s_eval = 1000, 0.01, 0.3, 0.35
    true_eval_var = s_eval**2 / M
    est, within = [], []
    for _ in range(400):
        n = S.noise(_crossed(rng, 5, M, s_seed, s_problem, s_eval))
        est.append(n.eval_sd**2)
        within.append(n.within_run_se**2)
        assert n.observed_sd**2 == pytest.approx(n.eval_sd**2 + n.train_sd**2) or n.train_sd == 0
    assert np.mean(est) == pytest.approx(true_eval_var, rel=0.03)
    assert math.sqrt(np.mean(within)) == pytest.approx(math.sqrt((s_problem**2 + s_eval**2) / M), rel=0.02)
    assert math.sqrt(np.mean(within)) > 1.3 * math.sqrt(true_eval_var)
    true_share = true_eval_var / (s_seed**2 + true_eval_var)
    n = S.noise(_crossed(np.random.default_rng(1), 200, M, s_seed, s_problem, s_eval))  # many seeds: the share itself
    assert n.eval_share == pytest.approx(true_share, abs=0.08)
    assert n.problem_sd == pytest.approx(s_problem, rel=0.1)


def test_noise_on_binary_outcomes_matches_the_binomial_truth():
    """Bernoulli outcomes with p_sj = clip(q_j + a_s): the true evaluation variance of run s's mean is
    Σ_j p_sj (1 − p_sj) / M²; the two-way estimate recovers it (5 % over 300 sweeps), one run's binomial SE (which
    reads q_j's spread as noise) does not."""
    rng = np.random.default_rng(12)
    M, S_ = 1000, 5
    q = rng.beta(0.5, 0.8, M)  # easy and hard problems, as a trained model's per-problem accuracy
    truth, est, within = [], [], []
    for _ in range(300):
        p = np.clip(q[None, :] + rng.normal(0, 0.01, (S_, 1)), 0, 1)
        y = (rng.random((S_, M)) < p).astype(float)
        n = S.noise(y)
        truth.append(float((p * (1 - p)).sum(1).mean()) / M**2)
        est.append(n.eval_sd**2)
        within.append(n.within_run_se**2)
    assert np.mean(est) == pytest.approx(np.mean(truth), rel=0.05)
    assert np.mean(within) > 1.5 * np.mean(truth)
    # by hand: run means 2/3 and 2/3 (no seed-to-seed spread), problem means 1, 1/2, 1/2; the interaction residuals are
    # 0, ∓1/2, ±1/2 in each row: MS_int = 4 · 1/4 / ((2 − 1)(3 − 1)) = 1/2, evaluation variance 1/2 / 3 problems
    n = S.noise(np.array([[1, 0, 1], [1, 1, 0]], float))
    assert n.eval_sd**2 == pytest.approx(1 / 6) and n.observed_sd == 0.0 and n.train_sd == 0.0


def test_power_against_the_t_approximation_and_its_inverse():
    """MDE ≈ (t_{1−α/2,df} + t_{1−β,df}) · SE (statistics.md); seeds_needed inverts mde."""
    for n in (5, 10, 30):
        approx = (sps.t.ppf(0.975, n - 1) + sps.t.ppf(0.8, n - 1)) * 0.05 / math.sqrt(n)
        assert S.mde(0.05, n, paired=True) == pytest.approx(approx, rel=0.08), n
        approx_u = (sps.t.ppf(0.975, 2 * n - 2) + sps.t.ppf(0.8, 2 * n - 2)) * 0.05 * math.sqrt(2 / n)
        assert S.mde(0.05, n, paired=False) == pytest.approx(approx_u, rel=0.05), n
    assert S.mde(0.05, 3, paired=True) > S.mde(0.05, 5, paired=True) > S.mde(0.05, 10, paired=True)
    assert math.isnan(S.mde(0.05, 1, paired=True)) and math.isnan(S.mde(0.0, 5, paired=True))
    for n in (3, 7, 20):
        for paired in (True, False):
            target = S.mde(0.04, n, paired=paired)
            assert S.seeds_needed(target * 1.0000001, 0.04, paired=paired) == n
    assert S.seeds_needed(1e-9, 1.0, paired=True, most=1000) == math.inf


def _nct_mde(se: float, df: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The effect a two-sided t-test with ``df`` degrees of freedom detects with this power when its estimate has
    standard error ``se``, solved from the noncentral t directly (scipy; independent of the statsmodels solver
    bench/stats.py uses): P(|T| > t_crit) = power with T ~ nct(df, effect / se)."""
    from scipy.optimize import brentq

    crit = sps.t.ppf(1 - alpha / 2, df)

    def gap(effect):
        nc = effect / se
        return sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc) - power

    hi = se
    while gap(hi) < 0:  # widen until the power is reached (nct is NaN far out, so no fixed wide bracket)
        hi *= 1.5
    return brentq(gap, 1e-9 * se, hi, xtol=1e-14)


@pytest.mark.parametrize("n", [3, 5, 10, 30])  # (at 2 seeds scipy's nct is NaN in the lower tail)
def test_mde_equals_the_noncentral_t_solution_paired_and_unpaired(n):
    """Exact goldens: paired, the one-sample test on n per-seed differences (SE sd/√n, n − 1 dof); unpaired, two
    groups of n seeds (SE sd·√(2/n), 2n − 2 dof). A wrong n/2 factor (a √2 error) in the unpaired case fails."""
    sd = 0.05
    assert S.mde(sd, n, paired=True) == pytest.approx(_nct_mde(sd / math.sqrt(n), n - 1), rel=1e-5)
    assert S.mde(sd, n, paired=False) == pytest.approx(_nct_mde(sd * math.sqrt(2 / n), 2 * n - 2), rel=1e-5)


def test_mde_holds_the_problem_term_fixed_and_stops_at_its_floor():
    """MDE(n) = k(n) · sqrt(s² / n + τ²/M): more seeds shrink the seed part only; as n grows the MDE approaches the
    floor (z_.975 + z_.8) · sqrt(τ²/M), and a target at or below the floor needs infinitely many seeds."""
    sd, P = 0.03, 0.01**2
    floor = S.mde_floor(P)
    assert floor == pytest.approx((sps.norm.ppf(0.975) + sps.norm.ppf(0.8)) * 0.01)
    k5 = S.mde(sd, 5, paired=True) / (sd / math.sqrt(5))
    assert S.mde(sd, 5, paired=True, problem_var=P) == pytest.approx(k5 * math.sqrt(sd**2 / 5 + P))
    assert S.mde(sd, 10_000, paired=True, problem_var=P) == pytest.approx(floor, rel=0.01)
    assert S.seeds_needed(floor * 0.999, sd, paired=True, problem_var=P) == math.inf
    n = S.seeds_needed(0.04, sd, paired=True, problem_var=P)
    assert S.mde(sd, int(n), paired=True, problem_var=P) <= 0.04 < S.mde(sd, int(n) - 1, paired=True, problem_var=P)
    assert n > S.seeds_needed(0.04, sd, paired=True)  # the fixed term costs seeds
    # a Difference rescales its own seed part and keeps its problem part
    rng = np.random.default_rng(3)
    q = rng.random(400)  # per-problem accuracy of B; A differs from it by a problem-specific amount (τ > 0)
    qa = np.clip(q + rng.normal(0.05, 0.3, 400), 0, 1)
    a, b = (rng.random((5, 400)) < qa).astype(float), (rng.random((5, 400)) < q).astype(float)
    d = S.difference(a, b, paired=True)
    assert d.problem_var > 0
    assert d.se**2 == pytest.approx(d.seed_var + d.problem_var)
    # k(5) (the noncentral t's factor on 4 dof) times the whole SE: the seed part over 5 seeds plus the problem part
    k = _nct_mde(1.0, 4)
    assert d.mde() == pytest.approx(k * math.sqrt(d.seed_var + d.problem_var), rel=1e-5)
    assert d.seed_var == pytest.approx((a - b).mean(axis=1).var(ddof=1) / 5)
    assert d.mde(50) < d.mde() and d.mde(10**5) == pytest.approx(S.mde_floor(d.problem_var), rel=0.02)


def test_mde_interval_covers_the_true_mde():
    """The χ² interval on the seed SD (n − 1 degrees of freedom) turned into an MDE interval: over 2000 paired sweeps
    of 5 seeds it holds the MDE at the true SD 93-97 % of the time (run-level values, no problem term)."""
    rng = np.random.default_rng(4)
    true = S.mde(0.02, 5, paired=True)
    hits = 0
    for _ in range(2000):
        d = S.difference(rng.normal(0.01, 0.02, (5, 1)), np.zeros((5, 1)), paired=True)
        lo, hi = d.mde_interval()
        hits += lo <= true <= hi
    assert 0.93 <= hits / 2000 <= 0.97, hits / 2000


def test_bootstrap_interval_and_its_p_agree():
    """With interval="bootstrap" the p-value comes from the same replicates: p <= α exactly when the interval
    excludes 0 (was: the t test's p beside a bootstrap interval, which disagreed)."""
    rng = np.random.default_rng(5)
    disagree = 0
    for i in range(60):
        a = (rng.random((4, 300)) < 0.5 + 0.01 * (i % 7)).astype(float)
        b = (rng.random((4, 300)) < 0.5).astype(float)
        d = S.difference(a, b, paired=True, interval="bootstrap", reps=2000, seed=i)
        disagree += (d.p <= 0.05) != (not d.lo <= 0 <= d.hi)
    assert disagree == 0
    assert S.bootstrap_p(np.array([1.0, 2.0, 3.0, -1.0])) == pytest.approx(0.5)  # 2 x 1/4
    assert S.bootstrap_p(np.ones(100)) == pytest.approx(0.01)  # never below 1 / reps


def test_improvement_test_is_exact_mann_whitney_and_holds_its_level():
    """One task: the permutation test equals scipy's exact Mann-Whitney p (no ties). Under the null at 5 runs a side,
    over 2000 trials it rejects at most 5 % (+2 MC SE), where rliable's percentile-bootstrap interval of P(X > Y)
    excludes 0.5 more often than 5 % (7.5 % in the independent check; measured here on 400 trials)."""
    x, y = np.array([[0.3], [0.35], [0.4], [0.33], [0.31]]), np.array([[0.2], [0.25], [0.28], [0.29], [0.36]])
    assert S.improvement_test(x, y) == pytest.approx(sps.mannwhitneyu(x[:, 0], y[:, 0], method="exact").pvalue)
    rng = np.random.default_rng(6)
    rejects = sum(S.improvement_test(rng.normal(size=(5, 1)), rng.normal(size=(5, 1))) < 0.05 for _ in range(2000))
    assert rejects / 2000 <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 2000), rejects / 2000
    excluded = 0
    for i in range(400):
        _, lo, hi = S.probability_of_improvement(rng.normal(size=(5, 1)), rng.normal(size=(5, 1)), reps=500, seed=i)
        excluded += not lo <= 0.5 <= hi
    assert excluded / 400 > 0.05, excluded / 400  # why the report's claims use the test, not the interval


def test_multiple_comparison_adjustment_hand_values():
    p = [0.01, 0.04, 0.03, math.nan]
    assert S.adjust(p, "holm")[:3] == pytest.approx([0.03, 0.06, 0.06])  # 3·0.01, max(2·0.03, 0.04)
    assert S.adjust(p, "bh")[:3] == pytest.approx([0.03, 0.04, 0.04])  # 0.01·3/1, min(0.03·3/2, 0.04·3/3)
    assert math.isnan(S.adjust(p)[3])
    assert list(sps.false_discovery_control([0.01, 0.04, 0.03])) == pytest.approx(S.adjust(p[:3], "bh"))


def test_rliable_aggregates_and_probability_of_improvement():
    x = np.array([[0.1], [0.5], [0.4], [0.45], [0.42], [0.9], [0.44], [0.41]])
    agg = S.aggregates({"x": x}, reps=500)["x"]
    assert agg["mean"][0] == pytest.approx(x.mean())
    assert agg["iqm"][0] == pytest.approx(sps.trim_mean(x[:, 0], 0.25))  # the 25 % trimmed mean
    for point, lo, hi in agg.values():
        assert lo <= point <= hi
    a, b = np.array([[1.0], [2.0], [3.0]]), np.array([[0.0], [2.0], [5.0]])
    # pairs a > b: (1,0) (2,0) (3,0) (3,2) = 4, one tie (2,2) counts 1/2: 4.5 / 9
    p, lo, hi = S.probability_of_improvement(a, b, reps=500)
    u = sps.mannwhitneyu(a[:, 0], b[:, 0]).statistic / 9
    assert p == pytest.approx(0.5) and p == pytest.approx(u) and lo <= p <= hi


def test_compute_curve_fit_recovers_known_parameters_and_flags_unbent_curves():
    rng = np.random.default_rng(0)
    C = np.linspace(0, 4e6, 11)
    true = dict(A=0.7, B=2.0, C_mid=1e6, R0=0.3)
    curves = [(C, S.sigmoid(C, **true) + rng.normal(0, 0.005, C.size)) for _ in range(3)]
    fit = S.fit_compute_curve(curves, R0=0.3, reps=50)
    assert fit.determined, fit.reason
    assert fit.A == pytest.approx(0.7, abs=0.02) and fit.B == pytest.approx(2.0, rel=0.2)
    assert fit.C_mid == pytest.approx(1e6, rel=0.1)
    assert fit.ci["A"][0] <= fit.A <= fit.ci["A"][1]
    early = [(C, S.sigmoid(C, A=0.9, B=1.0, C_mid=1e9, R0=0.3) + rng.normal(0, 0.002, C.size)) for _ in range(3)]
    flat = S.fit_compute_curve(early, R0=0.3, reps=20)  # still in its linear start: the asymptote is not determined
    assert not flat.determined and "not bent" in flat.reason


# ---- simulation: coverage and false rejection ---------------------------------------------------------------------
def _simulate(rng, n: int, M: int, effect: float, *, shared: bool):
    """Two variants x n seeds x M problems with a probit skill model: problem difficulty b_j ~ N(0, 1); a seed's skill
    θ = μ_v + u_s + ε_vs (u_s shared by both variants of a seed when ``shared``: the same warm start), and the run's
    outcome on problem j is 1[θ − b_j + e > 0] with e partly shared between the variants of a seed (ρ = 0.5). The
    true difference of expected accuracy over seeds and problems is Φ(μ_A / σ) − Φ(0), σ² the total variance."""
    s_u, s_t, s_e, rho = 0.1, 0.1, 1.0, 0.5
    b = rng.normal(0, 1.0, M)
    u = rng.normal(0, s_u, n)
    z = rng.normal(0, 1, (n, M))
    out = []
    for mu in (effect, 0.0):
        seed_part = u if shared else rng.normal(0, s_u, n)
        theta = mu + seed_part + rng.normal(0, s_t, n)
        shared_e = np.sqrt(rho) * z if shared else np.sqrt(rho) * rng.normal(0, 1, (n, M))
        e = s_e * (shared_e + np.sqrt(1 - rho) * rng.normal(0, 1, (n, M)))
        out.append((theta[:, None] - b[None] + e > 0).astype(float))
    total = math.sqrt(1.0 + s_u**2 + s_t**2 + s_e**2)
    return out[0], out[1], sps.norm.cdf(effect / total) - 0.5


@pytest.mark.parametrize("n", [3, 5])
def test_intervals_cover_the_true_effect_and_tests_hold_their_level(n):
    """1000 synthetic sweeps each: the 95 % paired interval (seeds matched) and the unpaired one (independent seeds)
    cover the true effect 93-97 % of the time, and at no effect each test rejects 3-7 % of the time."""
    rng = np.random.default_rng(2026 + n)
    reps, M = 1000, 1000
    cover = {True: 0, False: 0}
    reject = {True: 0, False: 0}
    for _ in range(reps):
        for paired in (True, False):
            a, b, true = _simulate(rng, n, M, 0.25, shared=paired)
            d = S.difference(a, b, paired=paired)
            cover[paired] += d.lo <= true <= d.hi
            a0, b0, _ = _simulate(rng, n, M, 0.0, shared=paired)
            reject[paired] += S.difference(a0, b0, paired=paired).p < 0.05
    for paired in (True, False):
        kind = "paired" if paired else "unpaired"
        assert 0.93 <= cover[paired] / reps <= 0.97, f"{kind} coverage {cover[paired] / reps:.3f} at {n} seeds"
        assert 0.03 <= reject[paired] / reps <= 0.07, f"{kind} false rejections {reject[paired] / reps:.3f}"


def test_percentile_hierarchical_bootstrap_undercovers_at_three_seeds():
    """Why the report's default interval is t-based: the percentile bootstrap over 3 seeds covers far below 95 %."""
    rng = np.random.default_rng(7)
    reps = 300
    covered = 0
    for i in range(reps):
        a, b, true = _simulate(rng, 3, 1000, 0.25, shared=True)
        d = S.difference(a, b, paired=True, interval="bootstrap", reps=600, seed=i)
        covered += d.lo <= true <= d.hi
    assert covered / reps < 0.9, f"percentile bootstrap coverage {covered / reps:.3f}"
