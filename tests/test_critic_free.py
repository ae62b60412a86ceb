"""The critic-free family (bench/rl/objective.py, algorithms/*): a hand-computed golden batch per algorithm through the
full path shape_rewards -> advantages -> policy_loss (returns, advantages, loss and d loss / d logp); properties over
every algorithm (masked positions inert, padding invariance, constant-reward groups, centred group advantages, RLOO's
leave-one-out form, KL penalties >= 0); reductions between relatives; gradient-accumulation invariance for every
aggregation and every default config; reward shaping; config validation."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.registry import ALGORITHMS
from bench.rl.losses import Norm, agg_loss, terminal_rewards
from bench.rl.objective import PolicyGradientConfig, advantages, policy_loss, shape_rewards
from bench.rl.value import ActorCritic

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant-normalised")
MICRO_BATCH_DEPENDENT = {"clip_cov", "kl_cov"}  # token choices from a covariance over the micro-batch
F64 = torch.float64
NAN, INF = float("nan"), float("inf")
PROPS = settings(max_examples=30, deadline=None)
# The critic-free family: PolicyGradient configs whose advantages need no learned critic (PPO and MA-PPO share the
# config fields but read their advantages from GAE over a value head; tests/test_value_credit.py covers them). Methods
# whose advantages come from branching rollouts of the policy (VinePPO, SPO: Monte-Carlo values; TreePO, SPO-tree: the
# tree the rollout was grown as; single-stream PO: a per-prompt tracker) are not a function of the batch these property
# tests draw; their own tests cover them.
RL = [
    n
    for n in ALGORITHMS.names()
    if issubclass(ALGORITHMS.get(n).Config, PolicyGradientConfig)
    and not issubclass(ALGORITHMS.get(n), ActorCritic)
    and not getattr(ALGORITHMS.get(n), "advantages_beyond_the_batch", False)
]


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """One intra-op thread: these tensors are tiny and the machine's cores are busy with other work."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def t64(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def config(name: str, **changes) -> PolicyGradientConfig:
    """The algorithm's default (paper) config, optionally varied with dataclasses.replace."""
    cfg = ALGORITHMS.get(name).Config()
    return dataclasses.replace(cfg, **changes) if changes else cfg


class Path(NamedTuple):
    R: torch.Tensor
    adv: torch.Tensor
    loss_mask: torch.Tensor
    loss: torch.Tensor
    stats: dict
    grad: torch.Tensor


def run_path(cfg: PolicyGradientConfig, b: dict) -> Path:
    """shape_rewards -> advantages (once, on the whole batch) -> policy_loss with the batch's Norm, as the harness
    runs them; returns the intermediates and d loss / d logp."""
    logp = b["logp"].clone().requires_grad_()
    R, tr, loss_mask = shape_rewards(
        cfg, *(b[k] for k in ("scores", "mask", "lengths", "truncated", "budget", "old_logp", "ref_logp")),
        b.get("step_rewards"),
    )  # fmt: skip
    adv = advantages(cfg, R, tr, loss_mask, b["G"], b["baseline"], b.get("step_ends"))
    norm = Norm.of(loss_mask, b["budget"])
    loss, stats = policy_loss(logp, b["old_logp"], adv, loss_mask, cfg, norm, b["ref_logp"])
    loss.backward()
    return Path(R, adv, loss_mask, loss.detach(), stats, logp.grad)


# ---- the hand-built batch --------------------------------------------------------------------------------------------
# B = 4 completions in P = 2 groups of G = 2 ({0, 1}, {2, 3}), T = 3, ragged mask: L = (3, 1, 2, 3), Σm = 9.
# Generation budget L_budget = 5 (no completion hits it). Masked positions hold absurd values (logp -1e4, old 40,
# ref 1e4: ratio e^-1e4, d = 2e4) that may reach neither the loss nor the gradient.
MASK = [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]]
LENGTHS = [3, 1, 2, 3]
BUDGET = 5
OLD = [[-1.0, -2.0, -0.5], [-1.5, 0.0, 0.0], [-0.5, -1.0, 0.0], [-2.0, -0.25, -1.0]]
# Σ_t old per row: -3.5, -1.5, -1.5, -3.25
JUNK_LOGP, JUNK_OLD, JUNK_REF = -1e4, 40.0, 1e4
SQRT2 = math.sqrt(2.0)


def z2(c: float) -> float:
    """|Â| of a G = 2 group whose centred rewards are ±c: sample std = sqrt(2c²/1) = c·√2, Â = c / (c√2 + 1e-6)."""
    return c / (c * SQRT2 + 1e-6)


def k3(d: float) -> float:
    return math.exp(d) - d - 1


def sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def golden_batch(case: dict) -> dict:
    """The batch of one golden case, float64. logp = old + log ρ (or + log-ratio, or + shift); ref from
    old − (old − ref) (KL in the reward, on π_old) or logp + d (KL in the loss, d = ref − logp), else ref = old."""
    mask = t64(MASK)
    m = mask.bool()
    old = t64(OLD)
    if "rho" in case:
        logp = old + t64(case["rho"]).log()
    elif "log_ratio" in case:
        logp = old + t64(case["log_ratio"])
    else:
        logp = old + case.get("shift", 0.0)
    if "old_minus_ref" in case:
        ref = old - t64(case["old_minus_ref"])
    elif "d" in case:
        ref = logp + t64(case["d"])
    else:
        ref = old.clone()

    def junk(x, v):
        return torch.where(m, x, torch.full_like(x, v))

    return dict(
        mask=mask,
        logp=junk(logp, JUNK_LOGP),
        old_logp=junk(old, JUNK_OLD),
        ref_logp=junk(ref, JUNK_REF),
        scores=t64(case["scores"]),
        lengths=torch.tensor(LENGTHS),
        truncated=torch.zeros(4, dtype=torch.bool),
        baseline=t64(case["baseline"]) if "baseline" in case else None,
        budget=BUDGET,
        G=2,
    )


GOLDEN: dict[str, dict] = {}

# ---- REINFORCE: batch-mean baseline, plain log π surrogate, seq-mean-token-sum, no KL ----
# scores (1, 0, 0, 3) = R; b = mean = 1; A = R − 1 = (0, −1, −1, 2). logp = old (on-policy).
# ℒ = (1/B) Σ_i −A_i Σ_t logp = (1/4)(−0·(−3.5) − (−1)(−1.5) − (−1)(−1.5) − 2·(−3.25)) = (0 − 1.5 − 1.5 + 6.5)/4
#   = 0.875;  d ℒ / d logp_{i,t} = −A_i / B = (0, 0.25, 0.25, −0.5) per row.
GOLDEN["reinforce"] = dict(
    scores=[1.0, 0.0, 0.0, 3.0],
    R=[1.0, 0.0, 0.0, 3.0],
    adv=[0.0, -1.0, -1.0, 2.0],
    loss=0.875,
    grad=[[0.0, 0.0, 0.0], [0.25, 0, 0], [0.25, 0.25, 0], [-0.5, -0.5, -0.5]],
)

# ---- RLOO: sequence k1 KL in the reward (β = 0.03, on π_old), leave-one-out, plain surrogate, seq-mean-token-sum ----
# old − ref per token: row 0 (0.5, −0.5, 1) Σ 1; row 1 (1) Σ 1; row 2 (0, 2) Σ 2; row 3 (−1, 0, 0) Σ −1.
# R = score − 0.03·Σ = (1 − 0.03, 0 − 0.03, 0 − 0.06, 1 + 0.03) = (0.97, −0.03, −0.06, 1.03).
# G = 2: A_i = R_i − R_j: (0.97 + 0.03, −1, −0.06 − 1.03, 1.09) = (1.0, −1.0, −1.09, 1.09).
# logp = old + 0.5 (π_θ ≠ π_old: the KL must use π_old); Σ_t logp = (−2.0, −1.0, −0.5, −1.75).
# ℒ = (1/4)(−1·(−2) − (−1)(−1) − (−1.09)(−0.5) − 1.09·(−1.75)) = (2 − 1 − 0.545 + 1.9075)/4 = 2.3625/4 = 0.590625
# d ℒ / d logp = −A_i/4 = (−0.25, 0.25, 0.2725, −0.2725).
GOLDEN["rloo"] = dict(
    scores=[1.0, 0.0, 0.0, 1.0],
    shift=0.5,
    old_minus_ref=[[0.5, -0.5, 1.0], [1.0, 0, 0], [0.0, 2.0, 0], [-1.0, 0.0, 0.0]],
    R=[0.97, -0.03, -0.06, 1.03],
    adv=[1.0, -1.0, -1.09, 1.09],
    loss=0.590625,
    grad=[[-0.25, -0.25, -0.25], [0.25, 0, 0], [0.2725, 0.2725, 0], [-0.2725, -0.2725, -0.2725]],
)

# ---- REINFORCE++: clip(score, ±10), per-token k1 KL in the reward (β = 0.01), return-to-go, batch whitening,
# token clip 0.2, token-mean ----
# scores (12, 0, −1, 1) -> clipped (10, 0, −1, 1). old − ref: row 0 (0, 10, 0), row 2 (−10, 0), else 0.
# token rewards r_t = 1[t = L]·score − 0.01·k1_t: row 0 (0, −0.1, 10); row 1 (0); row 2 (0.1, −1); row 3 (0, 0, 1).
# R = Σ_t r_t = (9.9, 0, −0.9, 1). Return-to-go: row 0 (9.9, 9.9, 10); row 1 (0); row 2 (−0.9, −1); row 3 (1, 1, 1).
# Whitening over the 9 unmasked tokens: μ = 30.9/9 = 3.4333333, population σ = 4.6516425;
# Â = (q − μ)/(σ + 1e-8) = row 0 (1.3901900, 1.3901900, 1.4116877); row 1 (−0.7380905); row 2 (−0.9315706,
#   −0.9530684); row 3 (−0.5231127 × 3).
# ρ: row 0 (1.0, 1.3, 0.5); row 1 (0.7); row 2 (1.1, 1.5); row 3 (0.9, 1.0, 1.25). C = min(ρÂ, clip(ρ, 0.8, 1.2)Â):
#   row 0 (Â > 0): 1.0Â, 1.2Â (clipped), 0.5Â (ρ < 0.8 but unclipped: min picks 0.5Â)
#   row 1 (Â < 0): 0.8Â (clipped: min(0.7Â, 0.8Â) = 0.8Â)
#   row 2 (Â < 0): 1.1Â, 1.5Â (ρ > 1.2 but unclipped: min picks 1.5Â)
#   row 3 (Â < 0): 0.9Â, 1.0Â, 1.25Â (unclipped)
# ℒ = −Σ C / 9 = 0.9283459/9 = 0.1031495; d ℒ / d logp = −ρÂ/9 unclipped, 0 at (0, 1) and (1, 0).
RPP_RETURNS = [9.9, 9.9, 10.0, 0.0, -0.9, -1.0, 1.0, 1.0, 1.0]  # unmasked tokens in row-major order
_mu, _sd = statistics.fmean(RPP_RETURNS), statistics.pstdev(RPP_RETURNS)
W = [(q - _mu) / (_sd + 1e-8) for q in RPP_RETURNS]
RPP_RHO = [1.0, 1.3, 0.5, 0.7, 1.1, 1.5, 0.9, 1.0, 1.25]
RPP_C = [1.0, 1.2, 0.5, 0.8, 1.1, 1.5, 0.9, 1.0, 1.25]  # the factor min() picks
RPP_FREE = [1, 0, 1, 0, 1, 1, 1, 1, 1]  # 1 where unclipped (the gradient flows)
_g = [-r * w / 9 * f for r, w, f in zip(RPP_RHO, W, RPP_FREE, strict=True)]
GOLDEN["reinforce_pp"] = dict(
    scores=[12.0, 0.0, -1.0, 1.0],
    rho=[[1.0, 1.3, 0.5], [0.7, 1, 1], [1.1, 1.5, 1], [0.9, 1.0, 1.25]],
    old_minus_ref=[[0.0, 10.0, 0.0], [0.0, 0, 0], [-10.0, 0.0, 0], [0.0, 0.0, 0.0]],
    R=[9.9, 0.0, -0.9, 1.0],
    adv=[[W[0], W[1], W[2]], [W[3], 0, 0], [W[4], W[5], 0], [W[6], W[7], W[8]]],
    loss=-sum(c * w for c, w in zip(RPP_C, W, strict=True)) / 9,
    grad=[[_g[0], _g[1], _g[2]], [_g[3], 0, 0], [_g[4], _g[5], 0], [_g[6], _g[7], _g[8]]],
)

# ---- REINFORCE++-baseline: group-mean baseline, token-weighted batch whitening, token clip 0.2, token-mean,
# k2 KL in the loss (β = 1e-5) ----
# scores (1, 0, 0, 1) = R; centred per group (0.5, −0.5, −0.5, 0.5), broadcast over tokens: 6 tokens at +0.5 (rows 0,
# 3), 3 at −0.5 (rows 1, 2). μ = (3 − 1.5)/9 = 1/6; deviations +1/3 (×6), −2/3 (×3); σ² = (6/9 + 12/9)/9 = 2/9,
# σ = √2/3. Â = +a on rows 0, 3, −b on rows 1, 2: a = (1/3)/(√2/3 + 1e-8) = 0.7071068, b = (2/3)/(√2/3 + 1e-8).
# ρ: row 0 (1.0, 1.1, 1.3); row 1 (0.7); row 2 (0.9, 1.4); row 3 (0.5, 1.0, 1.15). C:
#   row 0: a, 1.1a, 1.2a (clipped); row 1: −0.8b (clipped); row 2: −0.9b, −1.4b (unclipped); row 3: 0.5a, a, 1.15a
#   Σ C = a(1 + 1.1 + 1.2 + 0.5 + 1 + 1.15) − b(0.8 + 0.9 + 1.4) = 5.95a − 3.1b
# d = ref − logp: row 0 (0, 10, −10); row 1 (4); row 2 (0, 2); row 3 (−6, 0, 0); k2 = d²/2: (0, 50, 50), (8),
#   (0, 2), (18, 0, 0): Σ 128. ℒ = −(5.95a − 3.1b)/9 + 1e-5·128/9.
# d ℒ / d logp = −ρÂ/9 (unclipped) + β·(d k2/d logp = −d)/9.
BA = (1 / 3) / (SQRT2 / 3 + 1e-8)
BB = (2 / 3) / (SQRT2 / 3 + 1e-8)
B5 = 1e-5
GOLDEN["reinforce_pp_baseline"] = dict(
    scores=[1.0, 0.0, 0.0, 1.0],
    rho=[[1.0, 1.1, 1.3], [0.7, 1, 1], [0.9, 1.4, 1], [0.5, 1.0, 1.15]],
    d=[[0.0, 10.0, -10.0], [4.0, 0, 0], [0.0, 2.0, 0], [-6.0, 0.0, 0.0]],
    R=[1.0, 0.0, 0.0, 1.0],
    adv=[[BA, BA, BA], [-BB, 0, 0], [-BB, -BB, 0], [BA, BA, BA]],
    loss=-(5.95 * BA - 3.1 * BB) / 9 + B5 * 128 / 9,
    grad=[
        [-BA / 9, -1.1 * BA / 9 - 10 * B5 / 9, 10 * B5 / 9],
        [-4 * B5 / 9, 0, 0],
        [0.9 * BB / 9, 1.4 * BB / 9 - 2 * B5 / 9, 0],
        [-0.5 * BA / 9 + 6 * B5 / 9, -BA / 9, -1.15 * BA / 9],
    ],
)

# ---- ReMax: greedy-rollout baseline, plain surrogate, seq-mean-token-sum ----
# scores (1, 0, 0, 1), greedy rewards (1, 0) per prompt -> baseline (1, 1, 0, 0); A = (0, −1, 0, 1); logp = old.
# ℒ = (1/4)(0 − (−1)(−1.5) − 0 − 1·(−3.25)) = (−1.5 + 3.25)/4 = 0.4375; d ℒ / d logp = −A_i/4 = (0, 0.25, 0, −0.25).
GOLDEN["remax"] = dict(
    scores=[1.0, 0.0, 0.0, 1.0],
    baseline=[1.0, 1.0, 0.0, 0.0],
    R=[1.0, 0.0, 0.0, 1.0],
    adv=[0.0, -1.0, 0.0, 1.0],
    loss=0.4375,
    grad=[[0.0, 0.0, 0.0], [0.25, 0, 0], [0.0, 0.0, 0], [-0.25, -0.25, -0.25]],
)

# ---- GRPO: group z-score, token clip 0.2, seq-mean-token-mean, k3 in the loss (β = 0.04) ----
# scores (1, 0 | 0, 2): group 0 centred ±0.5 -> a1 = z2(0.5) = 0.7071058; group 1 centred ∓1 -> a2 = z2(1) = 0.7071063.
# Â = (a1, −a1, −a2, a2). ρ (shared with Dr. GRPO): row 0 (1.0, 1.1, 1.5); row 1 (0.5); row 2 (0.9, 1.5);
# row 3 (0.5, 1.15, 1.0). C = min(ρÂ, clip(ρ, 0.8, 1.2)Â):
#   row 0 (+a1): a1, 1.1a1, 1.2a1 (clipped)        -> row mean 3.3a1/3 = 1.1a1
#   row 1 (−a1): −0.8a1 (clipped)                   -> −0.8a1
#   row 2 (−a2): −0.9a2, −1.5a2 (unclipped)         -> −2.4a2/2 = −1.2a2
#   row 3 (+a2): 0.5a2 (unclipped), 1.15a2, a2      -> 2.65a2/3
# policy ℒ = −(1/4)(1.1a1 − 0.8a1 − 1.2a2 + 2.65a2/3) = −(0.3a1 − 0.95a2/3)/4.
# d = ref − logp: row 0 (0, 1, −1); row 1 (0.5); row 2 (2, 0); row 3 (−2, 0.25, 0); k3 = e^d − d − 1, row means
#   ((e − 2) + 1/e)/3, k3(0.5), k3(2)/2, (k3(−2) + k3(0.25))/3; KL term = their sum / 4; ℒ += 0.04·KL.
# d ℒ / d logp = [−Â ρ (unclipped) + 0.04(1 − e^d)] / (B L_i).
A1, A2 = z2(0.5), z2(1.0)
RHO_CLIP = [[1.0, 1.1, 1.5], [0.5, 1, 1], [0.9, 1.5, 1], [0.5, 1.15, 1.0]]
GD = [[0.0, 1.0, -1.0], [0.5, 0, 0], [2.0, 0.0, 0], [-2.0, 0.25, 0.0]]
_kl = ((k3(1) + k3(-1)) / 3 + k3(0.5) + k3(2) / 2 + (k3(-2) + k3(0.25)) / 3) / 4
GOLDEN["grpo"] = dict(
    scores=[1.0, 0.0, 0.0, 2.0],
    rho=RHO_CLIP,
    d=GD,
    R=[1.0, 0.0, 0.0, 2.0],
    adv=[A1, -A1, -A2, A2],
    loss=-(0.3 * A1 - 0.95 * A2 / 3) / 4 + 0.04 * _kl,
    grad=[
        [-A1 / 12, (-1.1 * A1 + 0.04 * (1 - math.e)) / 12, 0.04 * (1 - math.exp(-1)) / 12],
        [0.04 * (1 - math.exp(0.5)) / 4, 0, 0],
        [(0.9 * A2 + 0.04 * (1 - math.exp(2))) / 8, 1.5 * A2 / 8, 0],
        [(-0.5 * A2 + 0.04 * (1 - math.exp(-2))) / 12, (-1.15 * A2 + 0.04 * (1 - math.exp(0.25))) / 12, -A2 / 12],
    ],
)

# ---- Dr. GRPO: group-centred (no std), token clip 0.2, constant-normalised (L_budget = 5), no KL ----
# scores (1, 0 | 0, 2): A = (0.5, −0.5, −1, 1). ρ = RHO_CLIP. Σ_t C per row:
#   row 0: 0.5(1 + 1.1 + 1.2) = 1.65; row 1: −0.5·0.8 = −0.4 (clipped); row 2: −(0.9 + 1.5) = −2.4; row 3: 0.5 + 1.15
#   + 1 = 2.65. ℒ = −(1/B) Σ_i Σ_t C / L_budget = −(1.65 − 0.4 − 2.4 + 2.65)/(4·5) = −1.5/20 = −0.075.
# d ℒ / d logp = −Aρ/20 unclipped: row 0 (−0.025, −0.0275, 0); row 1 (0); row 2 (0.045, 0.075);
#   row 3 (−0.025, −0.0575, −0.05).
GOLDEN["dr_grpo"] = dict(
    scores=[1.0, 0.0, 0.0, 2.0],
    rho=RHO_CLIP,
    R=[1.0, 0.0, 0.0, 2.0],
    adv=[0.5, -0.5, -1.0, 1.0],
    loss=-0.075,
    grad=[[-0.025, -0.0275, 0.0], [0.0, 0, 0], [0.045, 0.075, 0], [-0.025, -0.0575, -0.05]],
)

# ---- DAPO: soft overlong penalty (L_max = 5, L_cache = 4), group z-score, clip (0.2, 0.28), token-mean, no KL ----
# lengths (3, 1, 2, 3): penalty = clamp(−(|y| − (5 − 4))/4, −1, 0) = (−0.5, 0, −0.25, −0.5).
# scores (1, 1 | 0, 0) -> R = (0.5, 1.0, −0.25, −0.5): the penalty alone makes group 1 informative.
# group 0: mean 0.75, centred (−0.25, +0.25) -> p = z2(0.25); group 1: mean −0.375, centred (+0.125, −0.125) ->
#   q = z2(0.125). Â = (−p, p, q, −q). ρ: row 0 (1.0, 0.7, 1.5); row 1 (1.25); row 2 (1.3, 0.5); row 3 (0.9, 1.1, 1.0).
# C = min(ρÂ, clip(ρ, 0.8, 1.28)Â):
#   row 0 (−p): −p, −0.8p (clipped), −1.5p (unclipped)     row 1 (+p): 1.25p (inside clip-higher; 1.2 would clip)
#   row 2 (+q): 1.28q (clipped), 0.5q (unclipped)          row 3 (−q): −0.9q, −1.1q, −q
# Σ C = −3.3p + 1.25p + 1.78q − 3.0q = −2.05p − 1.22q; ℒ = −Σ C/9 = (2.05p + 1.22q)/9.
# d ℒ / d logp = −ρÂ/9 unclipped: row 0 (p/9, 0, 1.5p/9); row 1 (−1.25p/9); row 2 (0, −0.5q/9); row 3 (0.9q, 1.1q, q)/9.
DP, DQ = z2(0.25), z2(0.125)
GOLDEN["dapo"] = dict(
    scores=[1.0, 1.0, 0.0, 0.0],
    rho=[[1.0, 0.7, 1.5], [1.25, 1, 1], [1.3, 0.5, 1], [0.9, 1.1, 1.0]],
    R=[0.5, 1.0, -0.25, -0.5],
    adv=[-DP, DP, DQ, -DQ],
    loss=(2.05 * DP + 1.22 * DQ) / 9,
    grad=[
        [DP / 9, 0.0, 1.5 * DP / 9],
        [-1.25 * DP / 9, 0, 0],
        [0.0, -0.5 * DQ / 9, 0],
        [0.9 * DQ / 9, 1.1 * DQ / 9, DQ / 9],
    ],
)

# ---- GSPO: group z-score, sequence ratio s_i = exp(mean_t ℓ), sequence clip [1 − 3e-4, 1 + 4e-4], no KL ----
# scores (1, 0 | 0, 2) -> Â = (a1, −a1, −a2, a2). Log-ratios ℓ: row 0 (0.003, −0.003, 0.0003) mean 1e-4;
# row 1 (0.001); row 2 (−0.002, 0) mean −0.001; row 3 (0.0006, 0.0006, 0.0009) mean 7e-4.
#   row 0 (+a1): s0 = e^1e-4 = 1.0001 inside -> C = s0·a1
#   row 1 (−a1): s1 = e^1e-3 > 1.0004, Â < 0 -> C = −s1·a1 (unclipped: min picks s1Â)
#   row 2 (−a2): s2 = e^−1e-3 < 0.9997, Â < 0 -> C = −0.9997·a2 (clipped)
#   row 3 (+a2): s3 = e^7e-4 > 1.0004, Â > 0 -> C = 1.0004·a2 (clipped)
# Every token of row i carries C_i, so seq-mean-token-mean = (1/4) Σ_i −C_i.
# d s_i / d logp_t = s_i / L_i: d ℒ / d logp = −Â s_i/(4 L_i) on unclipped rows: row 0 −a1 s0/12; row 1 +a1 s1/4.
S0, S1 = math.exp(1e-4), math.exp(1e-3)
GSPO_CASE = dict(
    scores=[1.0, 0.0, 0.0, 2.0],
    log_ratio=[[0.003, -0.003, 0.0003], [0.001, 0, 0], [-0.002, 0.0, 0], [0.0006, 0.0006, 0.0009]],
    R=[1.0, 0.0, 0.0, 2.0],
    adv=[A1, -A1, -A2, A2],
    loss=-(S0 * A1 - S1 * A1 - 0.9997 * A2 + 1.0004 * A2) / 4,
    grad=[[-A1 * S0 / 12] * 3, [A1 * S1 / 4, 0, 0], [0.0, 0.0, 0], [0.0, 0.0, 0.0]],
)
GOLDEN["gspo"] = GSPO_CASE
# ---- GSPO-token: s_{i,t} = sg[s_i]·π_θ(y_t)/sg[π_θ(y_t)]: value s_i, d s_{i,t}/d logp_t = s_i (own token only),
# clipped on its value like GSPO. Per token −C(s_{i,t}, Â_i), row mean over L_i: the same value as GSPO, and
# d ℒ / d logp_t = −Â_i s_i/(B L_i) where unclipped: the numbers above.
GOLDEN["gspo_token"] = GSPO_CASE

# ---- SAPO: group z-score, soft gate f_τ(ρ) = (4/τ)σ(τ(ρ − 1)), τ = 1 (Â > 0) or 1.05, seq-mean-token-mean ----
# scores (1, 0 | 0, 2) -> Â = (a1, −a1, −a2, a2). ρ: row 0 (1.0, 1.5, 0.5); row 1 (2.0); row 2 (0.8, 1.2);
# row 3 (1.0, 1.0, 3.0). ℒ = −(1/4) Σ_i (Â_i/L_i) Σ_t f_τi(ρ_it).
# d f/d logp = (4/τ)·σ'(x)·τ·ρ = 4σ(x)(1 − σ(x))·ρ with x = τ(ρ − 1): d ℒ / d logp = −Â_i·4σ(1 − σ)ρ/(4 L_i).
SAPO_RHO = [[1.0, 1.5, 0.5], [2.0, 1, 1], [0.8, 1.2, 1], [1.0, 1.0, 3.0]]
SAPO_A = [A1, -A1, -A2, A2]
SAPO_TAU = [1.0, 1.05, 1.05, 1.0]


def sapo_f(rho: float, tau: float) -> float:
    return 4 / tau * sig(tau * (rho - 1))


def sapo_df(rho: float, tau: float) -> float:
    s = sig(tau * (rho - 1))
    return 4 * s * (1 - s) * rho


GOLDEN["sapo"] = dict(
    scores=[1.0, 0.0, 0.0, 2.0],
    rho=SAPO_RHO,
    R=[1.0, 0.0, 0.0, 2.0],
    adv=SAPO_A,
    loss=-sum(
        a / n * sum(sapo_f(r, tau) for r in row[:n])
        for a, n, row, tau in zip(SAPO_A, LENGTHS, SAPO_RHO, SAPO_TAU, strict=True)
    )
    / 4,
    grad=[
        [-a * sapo_df(r, tau) / (4 * n) if t < n else 0.0 for t, r in enumerate(row)]
        for a, n, row, tau in zip(SAPO_A, LENGTHS, SAPO_RHO, SAPO_TAU, strict=True)
    ],
)

# ---- GPG: α·(r − mean_g r), α = B/(B − M), F = 1, plain surrogate, token-mean ----
# scores (1, 0 | 0.5, 0.5): group 1 has zero variance, M = 2, α = 4/(4 − 2) = 2; A = 2·(0.5, −0.5, 0, 0) =
# (1, −1, 0, 0). logp = old. ℒ = −(1/9) Σ_i A_i Σ_t logp = −(1·(−3.5) + (−1)(−1.5))/9 = 2/9.
# d ℒ / d logp = −A_i/9 = (−1/9, 1/9, 0, 0).
GOLDEN["gpg"] = dict(
    scores=[1.0, 0.0, 0.5, 0.5],
    R=[1.0, 0.0, 0.5, 0.5],
    adv=[1.0, -1.0, 0.0, 0.0],
    loss=2 / 9,
    grad=[[-1 / 9] * 3, [1 / 9, 0, 0], [0.0, 0.0, 0], [0.0, 0.0, 0.0]],
)


def test_golden_covers_the_family():
    """Every critic-free algorithm named by the issue has a hand-computed golden case and is registered."""
    names = {"reinforce", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax", "grpo", "dr_grpo", "dapo"}
    names |= {"gspo", "gspo_token", "sapo", "gpg"}
    assert names == set(GOLDEN), f"golden cases {sorted(GOLDEN)} != {sorted(names)}"
    assert names <= set(RL), f"not registered as critic-free: {sorted(names - set(RL))}"


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_full_path(name):
    """The default config, through shape_rewards -> advantages -> policy_loss on the hand-built batch, gives the
    hand-computed returns, advantages, loss and d loss / d logp (exactly 0 and finite at masked positions)."""
    case = GOLDEN[name]
    got = run_path(config(name), golden_batch(case))
    mask = t64(MASK).bool()
    assert torch.allclose(got.R, t64(case["R"]), rtol=1e-12, atol=1e-12), f"{name}: R {got.R.tolist()}"
    assert torch.equal(got.loss_mask, t64(MASK)), f"{name}: loss mask {got.loss_mask.tolist()}"
    assert torch.allclose(got.adv, t64(case["adv"]), rtol=1e-9, atol=1e-12), f"{name}: Â {got.adv.tolist()}"
    assert math.isclose(got.loss.item(), case["loss"], rel_tol=1e-9, abs_tol=1e-12), (
        f"{name}: loss {got.loss.item()} != {case['loss']}"
    )
    assert torch.allclose(got.grad, t64(case["grad"]), rtol=1e-9, atol=1e-12), (
        f"{name}: grad {got.grad.tolist()} != {case['grad']}"
    )
    assert (got.grad[~mask] == 0).all() and torch.isfinite(got.grad).all(), f"{name}: {got.grad.tolist()}"


def test_golden_kl_terms_are_live():
    """The KL paths of the goldens are not vacuous: dropping β changes R (RLOO, REINFORCE++) and the loss (GRPO,
    REINFORCE++-baseline) by the hand-computed amount."""
    rloo = run_path(config("rloo", beta=0.0), golden_batch(GOLDEN["rloo"]))
    assert torch.equal(rloo.R, t64([1.0, 0.0, 0.0, 1.0])), f"RLOO β=0: R {rloo.R.tolist()}"
    rpp = run_path(config("reinforce_pp", beta=0.0), golden_batch(GOLDEN["reinforce_pp"]))
    assert torch.equal(rpp.R, t64([10.0, 0.0, -1.0, 1.0])), f"REINFORCE++ β=0: R {rpp.R.tolist()}"
    base = run_path(config("reinforce_pp_baseline", beta=0.0), golden_batch(GOLDEN["reinforce_pp_baseline"]))
    want = GOLDEN["reinforce_pp_baseline"]["loss"] - B5 * 128 / 9
    assert math.isclose(base.loss.item(), want, rel_tol=1e-12), f"{base.loss.item()} != {want}"
    grpo = run_path(config("grpo", beta=0.0), golden_batch(GOLDEN["grpo"]))
    want = GOLDEN["grpo"]["loss"] - 0.04 * _kl
    assert math.isclose(grpo.loss.item(), want, rel_tol=1e-12), f"{grpo.loss.item()} != {want}"


# ---- properties over every algorithm ---------------------------------------------------------------------------------
SCORES = st.sampled_from([0.0, 1.0, 0.5, 0.7, -1.0, 3.0, 12.0])
GARBAGE = (1e30, -1e30, 1e4, -1e4, 88.0, -88.0, 700.0, 0.0)


@st.composite
def rl_batches(draw, P: int | None = None, G: int | None = None, max_T: int = 4, log_ratio: float = 0.6):
    """A float64 batch of P groups of G (every row non-empty, ragged), old/ref log-probs near logp, scores, a greedy
    baseline per prompt, lengths = L_i and truncated = (L_i >= budget)."""
    G = G or draw(st.sampled_from([2, 4]))
    P = P or draw(st.integers(1, 2))
    T = draw(st.integers(1, max_T))
    B = P * G
    lengths = torch.tensor(draw(st.lists(st.integers(1, T), min_size=B, max_size=B)))

    def floats(lo, hi):
        return t64(draw(st.lists(st.floats(lo, hi), min_size=B * T, max_size=B * T))).view(B, T)

    old = floats(-6.0, -0.01)
    logp = old + floats(-log_ratio, log_ratio)
    budget = T + draw(st.integers(0, 2))
    ends = t64(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=B * T, max_size=B * T))).view(B, T).bool()
    steps = t64(draw(st.lists(st.sampled_from([0.0, 0.25, 1.0]), min_size=B * T, max_size=B * T))).view(B, T)
    return dict(
        step_rewards=torch.where(ends, steps, 0.0),  # a task's oracle step rewards (reward_shaping=process)
        step_ends=ends,
        mask=(torch.arange(T) < lengths.unsqueeze(-1)).to(F64),
        logp=logp,
        old_logp=old,
        ref_logp=old + floats(-1.0, 1.0),
        scores=t64(draw(st.lists(SCORES, min_size=B, max_size=B))),
        baseline=t64(draw(st.lists(SCORES, min_size=P, max_size=P))).repeat_interleave(G),
        lengths=lengths,
        truncated=lengths >= budget,
        budget=budget,
        G=G,
    )


@pytest.mark.parametrize("name", RL)
@PROPS
@given(batch=rl_batches(), data=st.data())
def test_masked_positions_are_inert(name, batch, data):
    """Huge values (±1e30, ±1e4, 700) in logp, old_logp and ref_logp at masked positions change neither R, Â, the
    loss nor the unmasked gradient, and the gradient there is exactly 0 and finite."""
    cfg = config(name)
    clean = run_path(cfg, batch)
    m = batch["mask"].bool()
    dirty = dict(batch)
    for key in ("logp", "old_logp", "ref_logp", "step_rewards"):
        junk = t64(data.draw(st.lists(st.sampled_from(GARBAGE), min_size=m.numel(), max_size=m.numel()))).view_as(m)
        dirty[key] = torch.where(m, batch[key], junk)
    got = run_path(cfg, dirty)
    assert torch.equal(got.R, clean.R), f"{name}: R {got.R.tolist()} != {clean.R.tolist()}"
    assert torch.equal(got.adv, clean.adv), f"{name}: Â {got.adv.tolist()} != {clean.adv.tolist()}"
    assert torch.equal(got.loss, clean.loss), f"{name}: loss {got.loss.item()} != {clean.loss.item()}"
    assert torch.equal(got.grad[m], clean.grad[m]), f"{name}: {got.grad.tolist()} != {clean.grad.tolist()}"
    assert (got.grad[~m] == 0).all() and torch.isfinite(got.grad).all(), f"{name}: masked grad {got.grad.tolist()}"


@pytest.mark.parametrize("name", RL)
@PROPS
@given(batch=rl_batches(), extra=st.integers(1, 3), junk=st.sampled_from(GARBAGE))
def test_padding_columns_change_nothing(name, batch, extra, junk):
    """Appending all-masked columns (any values) leaves R, Â, the loss and the gradient on the real columns
    unchanged (up to summation order), and sends exactly 0 gradient into the padding."""
    cfg = config(name)
    want = run_path(cfg, batch)
    B, T = batch["mask"].shape
    padded = dict(batch, mask=torch.cat([batch["mask"], torch.zeros(B, extra, dtype=F64)], 1))
    for key in ("logp", "old_logp", "ref_logp", "step_rewards"):
        padded[key] = torch.cat([batch[key], torch.full((B, extra), junk, dtype=F64)], 1)
    padded["step_ends"] = torch.cat([batch["step_ends"], torch.ones(B, extra, dtype=torch.bool)], 1)  # on padding
    got = run_path(cfg, padded)
    assert torch.allclose(got.R, want.R, rtol=1e-12, atol=1e-12), f"{name}: R {got.R.tolist()} != {want.R.tolist()}"
    got_adv = got.adv[:, :T] if got.adv.dim() == 2 else got.adv
    assert torch.allclose(got_adv, want.adv, rtol=1e-12, atol=1e-12), f"{name}: Â {got.adv.tolist()}"
    assert torch.allclose(got.loss, want.loss, rtol=1e-12, atol=1e-12), f"{name}: {got.loss.item()} != {want.loss}"
    assert torch.allclose(got.grad[:, :T], want.grad, rtol=1e-12, atol=1e-12), (
        f"{name}: {got.grad[:, :T].tolist()} != {want.grad.tolist()}"
    )
    assert (got.grad[:, T:] == 0).all(), f"{name}: padding gradient {got.grad[:, T:].tolist()}"


# Estimators whose baseline is the prompt's own group (or its greedy completion): a constant group gives exactly 0.
GROUP_LOCAL = [
    ("group", "group_std"),
    ("group", "none"),  # Dr. GRPO
    ("group", "batch_std"),
    ("gpg", "none"),
    ("gpg", "group_std"),
    ("rloo", "none"),
    ("greedy_baseline", "none"),  # the greedy completion scored the same as the group
]
NONDYADIC = st.sampled_from([0.7, 0.1, 0.3, 1 / 3, -0.7, 2.2, 0.0, 1.0])


@st.composite
def group_rewards(draw, dtype, constant_only: bool):
    """(rewards [P·G], constant-group flags [P], mask [P·G, T], G): each group constant (a non-dyadic value) or,
    unless constant_only, random."""
    G = draw(st.sampled_from([2, 3, 4, 8]))
    P = draw(st.integers(1, 4))
    T = draw(st.integers(1, 4))
    rows, flags = [], []
    for _ in range(P):
        if constant_only or draw(st.booleans()):
            rows += [draw(NONDYADIC)] * G
            flags.append(True)
        else:
            rows += draw(st.lists(st.floats(-3, 3), min_size=G, max_size=G))
            flags.append(len(set(rows[-G:])) == 1)
    lengths = torch.tensor(draw(st.lists(st.integers(1, T), min_size=P * G, max_size=P * G)))
    mask = (torch.arange(T) < lengths.unsqueeze(-1)).to(dtype)
    return torch.tensor(rows, dtype=dtype), torch.tensor(flags), mask, G


@pytest.mark.parametrize("advantage,scale", GROUP_LOCAL)
@PROPS
@given(data=st.data(), dtype=st.sampled_from([torch.float32, F64]))
def test_constant_groups_give_exact_zero_advantage(advantage, scale, data, dtype):
    """For every group-local estimator a constant-reward group gets Â = 0 exactly (non-dyadic rewards like 0.7
    included, fp32 and fp64, beside informative groups), and no Â is NaN."""
    r, const, mask, G = data.draw(group_rewards(dtype, constant_only=False))
    cfg = PolicyGradientConfig(advantage=advantage, adv_scale=scale)
    adv = advantages(cfg, r, terminal_rewards(r, mask), mask, G, baseline=r.clone())
    assert torch.isfinite(adv).all(), f"{advantage}/{scale}: r {r.tolist()} -> Â {adv.tolist()}"
    zero = const.repeat_interleave(G)
    assert (adv[zero] == 0).all(), f"{advantage}/{scale}: constant groups of {r.tolist()} -> Â {adv.tolist()}"


@pytest.mark.parametrize("advantage", ["reinforce_pp_baseline", "reinforce_pp", "batch_mean", "none"])
@PROPS
@given(data=st.data())
def test_all_constant_batch_batch_level_estimators(advantage, data):
    """On a batch where every group is constant (fp64), estimators that look beyond the group are finite and:
    REINFORCE++-baseline gives exactly 0 (its centred rewards are exact zeros, whitened to 0); batch_mean gives
    r − mean(r), i.e. only the mean's rounding error (<= 1e-12 here); REINFORCE++ whitens the constant returns, so
    the mean's rounding error e becomes e/(e + 1e-8) ~ 1e-8 (<= 1e-6 here; fp32: see the xfail below); none is the
    raw reward (no baseline, by design)."""
    r, _, mask, G = data.draw(group_rewards(F64, constant_only=True))
    cfg = PolicyGradientConfig(advantage=advantage)
    adv = advantages(cfg, r, terminal_rewards(r, mask), mask, G)
    assert torch.isfinite(adv).all(), f"{advantage}: r {r.tolist()} -> Â {adv.tolist()}"
    if advantage == "reinforce_pp_baseline":
        assert (adv == 0).all(), f"{advantage}: r {r.tolist()} -> Â {adv.tolist()}"
    elif advantage == "none":
        assert torch.equal(adv, r), f"{advantage}: Â {adv.tolist()} != r {r.tolist()}"
    elif advantage == "batch_mean" and len(set(r.tolist())) == 1:
        assert adv.abs().max() <= 1e-12, f"{advantage}: r {r.tolist()} -> Â {adv.tolist()}"
    elif advantage == "reinforce_pp" and len(set(r.tolist())) == 1:
        assert adv.abs().max() <= 1e-6, f"{advantage}: r {r.tolist()} -> Â {adv.tolist()}"


def test_reinforce_pp_all_constant_fp32_batch_gives_zero_advantage():
    """REINFORCE++ on a batch whose every completion scored 0.7 (fp32, no KL, ragged lengths) has no signal:
    |Â| <= 1e-6 on every token, as in fp64."""
    mask = torch.tensor(MASK, dtype=torch.float32)
    r = torch.full((4,), 0.7, dtype=torch.float32)
    adv = advantages(config("reinforce_pp"), r, terminal_rewards(r, mask), mask, 2)
    assert adv.abs().max() <= 1e-6, f"constant 0.7 fp32 batch: Â {adv.tolist()}"


def test_batch_std_single_row_batch_is_not_nan():
    """A one-row batch (G = 1, P = 1) under adv_scale=batch_std is a constant group: Â = 0, not NaN."""
    for advantage in ("group", "gpg"):
        cfg = PolicyGradientConfig(advantage=advantage, adv_scale="batch_std")
        adv = advantages(cfg, t64([0.7]), None, None, 1)
        assert torch.equal(adv, t64([0.0])), f"{advantage}/batch_std B=1: Â {adv.tolist()}"


@pytest.mark.parametrize(
    "advantage,scale",
    [("rloo", "none"), ("group", "group_std"), ("group", "none"), ("group", "batch_std")]
    + [("gpg", "none"), ("gpg", "group_std")],
)
@PROPS
@given(
    rewards=st.lists(st.floats(-10, 10), min_size=2, max_size=32),
    G=st.sampled_from([2, 3, 4, 8]),
    unbiased=st.booleans(),
)
def test_group_advantages_sum_to_zero_per_group(advantage, scale, rewards, G, unbiased):
    """RLOO, GRPO (z-score), Dr. GRPO (centred), batch-std and GPG (α-rescaled) advantages sum to 0 in every group
    and are finite."""
    r = t64(rewards[: len(rewards) // G * G] or [0.0] * G)
    cfg = PolicyGradientConfig(advantage=advantage, adv_scale=scale, adv_std_unbiased=unbiased)
    adv = advantages(cfg, r, None, None, G)
    assert torch.isfinite(adv).all(), f"{advantage}/{scale}: r {r.tolist()} -> Â {adv.tolist()}"
    sums = adv.view(-1, G).sum(-1)
    scale_ = max(1.0, adv.abs().max().item())
    assert sums.abs().max() <= 1e-9 * scale_ * G, f"{advantage}/{scale}: r {r.tolist()}: group sums {sums.tolist()}"


@PROPS
@given(rewards=st.lists(st.floats(-10, 10), min_size=2, max_size=24), G=st.sampled_from([2, 3, 4, 8]))
def test_rloo_is_leave_one_out(rewards, G):
    """RLOO's Â_i = R_i − mean_{j≠i} R_j (an explicit loop) = G/(G − 1)·(R_i − mean_g R)."""
    r = t64(rewards[: len(rewards) // G * G] or [0.0] * G)
    adv = advantages(config("rloo"), r, None, None, G)
    loo, scaled = [], []
    for p in range(len(r) // G):
        g = r[p * G : (p + 1) * G].tolist()
        loo += [g[i] - sum(g[j] for j in range(G) if j != i) / (G - 1) for i in range(G)]
        scaled += [G / (G - 1) * (x - sum(g) / G) for x in g]
    assert torch.allclose(adv, t64(loo), rtol=1e-9, atol=1e-9), f"G={G}: {adv.tolist()} != {loo}"
    assert torch.allclose(adv, t64(scaled), rtol=1e-9, atol=1e-9), f"G={G}: {adv.tolist()} != {scaled}"


@PROPS
@given(batch=rl_batches(), data=st.data())
def test_k3_penalties_are_nonnegative(batch, data):
    """k3 >= 0 wherever it enters the objective: GRPO's β·k3 loss term raises the loss (and stats/kl >= 0), and k3
    in the reward can only lower R below the score, for log-ratio gaps up to ±50."""
    B, T = batch["mask"].shape
    gap = t64(data.draw(st.lists(st.floats(-50, 50), min_size=B * T, max_size=B * T))).view(B, T)
    batch = dict(batch, ref_logp=batch["logp"] + gap)
    with_kl = run_path(config("grpo"), batch)
    without = run_path(config("grpo", beta=0.0), batch)
    assert with_kl.loss >= without.loss, f"β·k3 lowered the loss: {with_kl.loss.item()} < {without.loss.item()}"
    assert with_kl.stats["stats/kl"] >= 0, f"stats/kl {with_kl.stats['stats/kl']}"
    cfg = config("grpo", kl_placement="reward")
    batch = dict(batch, ref_logp=batch["old_logp"] + gap)
    R, _, _ = shape_rewards(
        cfg,
        batch["scores"],
        batch["mask"],
        batch["lengths"],
        batch["truncated"],
        8,
        batch["old_logp"],
        batch["ref_logp"],
    )
    assert (R <= batch["scores"]).all(), f"k3 in the reward raised R: {R.tolist()} vs {batch['scores'].tolist()}"


@pytest.mark.parametrize("kl", ["k1", "k2", "k3"])
@pytest.mark.parametrize("junk", [NAN, INF, -INF])
@pytest.mark.parametrize("where", ["logp", "ref_logp"])
def test_nonfinite_masked_values_with_kl_in_the_loss(kl, junk, where):
    """With a KL penalty in the loss, a NaN/±inf logp or ref_logp at a masked position leaves the loss and the whole
    gradient finite, the masked gradient exactly 0 (as the ratio path guarantees)."""
    b = golden_batch(GOLDEN["grpo"])
    m = b["mask"].bool()
    b[where] = torch.where(m, b[where], torch.full_like(b[where], junk))
    got = run_path(config("grpo", kl_estimator=kl), b)
    assert torch.isfinite(got.loss), f"{kl} {where}={junk}: loss {got.loss}"
    assert torch.isfinite(got.grad).all() and (got.grad[~m] == 0).all(), f"{kl} {where}={junk}: {got.grad.tolist()}"


# ---- reductions between relatives ------------------------------------------------------------------------------------
@PROPS
@given(batch=rl_batches())
def test_dapo_reduces_to_grpo(batch):
    """DAPO with ε_high = ε_low, no dynamic sampling, truncation keep and GRPO's aggregation equals GRPO with β = 0:
    the same R, Â, loss and gradient."""
    grpo = config("grpo", beta=0.0)
    dapo = config(
        "dapo",
        clip_eps_low=grpo.clip_eps_low,
        clip_eps_high=grpo.clip_eps_low,
        dynamic_sampling=False,
        truncation="keep",
        loss_agg=grpo.loss_agg,
        beta=0.0,
    )
    a, b = run_path(dapo, batch), run_path(grpo, batch)
    assert torch.equal(a.R, b.R) and torch.equal(a.adv, b.adv), f"R {a.R} / {b.R}, Â {a.adv} / {b.adv}"
    assert torch.allclose(a.loss, b.loss, rtol=1e-12, atol=1e-12), f"DAPO {a.loss.item()} != GRPO {b.loss.item()}"
    assert torch.allclose(a.grad, b.grad, rtol=1e-12, atol=1e-12), f"DAPO {a.grad.tolist()} != GRPO {b.grad.tolist()}"


@PROPS
@given(batch=rl_batches(log_ratio=1e-3), token_shaped=st.booleans())
def test_gspo_token_with_sequence_constant_advantages_is_gspo(batch, token_shaped):
    """GSPO-token with an advantage constant within each sequence ([B], or [B, T] broadcast) equals GSPO with the
    same clip: loss and gradient (log-ratios within ±1e-3, so both sides of the tiny clip range are hit)."""
    gspo, tok = config("gspo"), config("gspo_token")
    assert (tok.clip_eps_low, tok.clip_eps_high) == (gspo.clip_eps_low, gspo.clip_eps_high), f"{tok} / {gspo}"
    adv = run_path(gspo, batch).adv  # [B] group z-score
    mask, old, ref = batch["mask"], batch["old_logp"], batch["ref_logp"]
    norm = Norm.of(mask, batch["budget"])
    out = []
    for cfg, a in ((gspo, adv), (tok, adv.unsqueeze(-1).expand_as(mask).clone() if token_shaped else adv)):
        logp = batch["logp"].clone().requires_grad_()
        loss, _ = policy_loss(logp, old, a, mask, cfg, norm, ref)
        loss.backward()
        out.append((loss.detach(), logp.grad))
    (la, ga), (lb, gb) = out
    assert torch.allclose(lb, la, rtol=1e-12, atol=1e-12), f"GSPO-token {lb.item()} != GSPO {la.item()}"
    assert torch.allclose(gb, ga, rtol=1e-12, atol=1e-12), f"GSPO-token {gb.tolist()} != GSPO {ga.tolist()}"


@PROPS
@given(batch=rl_batches(max_T=1, log_ratio=1e-3))
def test_gspo_on_one_token_completions_is_grpo(batch):
    """With T = 1 the sequence ratio is the token ratio: GSPO equals GRPO with GSPO's clip range and β = 0."""
    gspo = config("gspo")
    grpo = config("grpo", clip_eps_low=gspo.clip_eps_low, clip_eps_high=gspo.clip_eps_high, beta=0.0)
    a, b = run_path(gspo, batch), run_path(grpo, batch)
    assert torch.allclose(a.loss, b.loss, rtol=1e-12, atol=1e-12), f"GSPO {a.loss.item()} != GRPO {b.loss.item()}"
    assert torch.allclose(a.grad, b.grad, rtol=1e-12, atol=1e-12), f"GSPO {a.grad.tolist()} != GRPO {b.grad.tolist()}"


@PROPS
@given(batch=rl_batches(), mode=st.sampled_from(MODES))
def test_sapo_on_policy_is_the_policy_gradient(batch, mode):
    """At ρ = 1 (logp == old_logp) SAPO's gradient is that of −Â·logp aggregated the same way (df/dρ = 1 at ρ = 1),
    for both signs of Â (τ_pos and τ_neg)."""
    cfg = config("sapo", loss_agg=mode)
    on_policy = dict(batch, logp=batch["old_logp"].clone())
    got = run_path(cfg, on_policy)
    logp = batch["old_logp"].clone().requires_grad_()
    pg = agg_loss(-got.adv.unsqueeze(-1) * logp, got.loss_mask, mode, Norm.of(got.loss_mask, batch["budget"]))
    pg.backward()
    assert torch.allclose(got.grad, logp.grad, rtol=1e-12, atol=1e-12), (
        f"{mode}: SAPO {got.grad.tolist()} != PG {logp.grad.tolist()}"
    )


@PROPS
@given(batch=rl_batches(), mode=st.sampled_from(MODES), data=st.data())
def test_reinforce_on_policy_has_grpo_gradient(batch, mode, data):
    """Given the same advantages, REINFORCE's plain −Â·logp and GRPO's clipped ratio at ρ = 1 (clip inactive), β = 0,
    the same aggregation, have the same gradient."""
    B, T = batch["mask"].shape
    adv = t64(data.draw(st.lists(st.floats(-5, 5), min_size=B, max_size=B)))
    mask, old = batch["mask"], batch["old_logp"]
    norm = Norm.of(mask, batch["budget"])
    grads = []
    for cfg in (config("reinforce", loss_agg=mode), config("grpo", beta=0.0, loss_agg=mode)):
        logp = old.clone().requires_grad_()
        loss, _ = policy_loss(logp, old, adv, mask, cfg, norm, batch["ref_logp"])
        loss.backward()
        grads.append(logp.grad)
    assert torch.allclose(grads[0], grads[1], rtol=1e-12, atol=1e-12), (
        f"{mode}: REINFORCE {grads[0].tolist()} != GRPO {grads[1].tolist()}"
    )


@PROPS
@given(batch=rl_batches())
def test_dr_grpo_constant_normalised_is_token_sum_over_budget(batch):
    """Dr. GRPO's constant-normalised loss (and gradient) equals its seq-mean-token-sum loss divided by L_budget."""
    cfg = config("dr_grpo")
    assert cfg.loss_agg == "constant-normalised", cfg.loss_agg
    a = run_path(cfg, batch)
    b = run_path(dataclasses.replace(cfg, loss_agg="seq-mean-token-sum"), batch)
    L_budget = batch["budget"]
    assert torch.allclose(a.loss, b.loss / L_budget, rtol=1e-12, atol=1e-12), f"{a.loss} != {b.loss} / {L_budget}"
    assert torch.allclose(a.grad, b.grad / L_budget, rtol=1e-12, atol=1e-12), f"{a.grad} != {b.grad} / {L_budget}"


# ---- gradient accumulation -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", RL)
@settings(max_examples=6, deadline=None)
@given(batch=rl_batches(P=2, G=4))
def test_gradient_accumulation_matches_full_batch(name, mode, batch):
    """With Â computed once on the whole batch, the sum of 8 single-row policy_loss values (each with the whole
    batch's Norm) and their gradients equal the full-batch loss and gradient (1e-6), for every aggregation with
    every algorithm's config (its default aggregation among them). Clip-Cov and KL-Cov are left out: they choose
    their tokens by a covariance over the micro-batch, as their authors and verl do (NOTE(deviation) in their files).
    """
    if name in MICRO_BATCH_DEPENDENT:
        pytest.skip(f"{name} selects tokens per micro-batch by design (its file's NOTE(deviation))")
    cfg = config(name, loss_agg=mode)
    b = batch
    R, tr, loss_mask = shape_rewards(
        cfg, *(b[k] for k in ("scores", "mask", "lengths", "truncated", "budget", "old_logp", "ref_logp")),
        b["step_rewards"],
    )  # fmt: skip
    adv = advantages(cfg, R, tr, loss_mask, b["G"], b["baseline"], b["step_ends"])
    norm = Norm.of(loss_mask, b["budget"])
    full_in = b["logp"].clone().requires_grad_()
    full, _ = policy_loss(full_in, b["old_logp"], adv, loss_mask, cfg, norm, b["ref_logp"])
    full.backward()
    acc_in = b["logp"].clone().requires_grad_()
    total = 0.0
    for i in range(8):
        rows = slice(i, i + 1)
        part, _ = policy_loss(
            acc_in[rows], b["old_logp"][rows], adv[rows], loss_mask[rows], cfg, norm, b["ref_logp"][rows]
        )
        part.backward()
        total += part.item()
    assert math.isclose(total, full.item(), rel_tol=1e-6, abs_tol=1e-6), f"{name}/{mode}: Σ micro {total} != {full}"
    diff = (acc_in.grad - full_in.grad).abs().max().item()
    assert diff <= 1e-6, f"{name}/{mode}: max |Δgrad| = {diff}"


# ---- reward shaping --------------------------------------------------------------------------------------------------
def test_dapo_overlong_penalty_golden():
    """DAPO's R = score + soft overlong penalty with L_max = 8, L_cache = 4: 0 up to |y| = 4, then (4 − |y|)/4 down to
    −1 at |y| = 8, −1 beyond; placed on the last token. With L_cache = 0 only |y| > L_max is penalised (−1)."""
    lengths = torch.tensor([2, 4, 5, 6, 7, 8, 9])
    mask = (torch.arange(9) < lengths.unsqueeze(-1)).to(F64)
    scores = t64([1.0] * 7)
    # below (2), at L_max − L_cache (4), inside (5, 6, 7), at L_max (8), over (9)
    penalty = [0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0]
    no = torch.zeros(7, dtype=torch.bool)
    R, tr, loss_mask = shape_rewards(config("dapo"), scores, mask, lengths, no, 8)
    want = t64([1.0 + p for p in penalty])
    assert torch.equal(R, want), f"R {R.tolist()} != {want.tolist()}"
    assert torch.equal(tr, terminal_rewards(want, mask)), f"token rewards {tr.tolist()}"
    assert torch.equal(loss_mask, mask), "the overlong penalty must not mask anything"
    R0, _, _ = shape_rewards(config("dapo", overlong_buffer=0), scores, mask, lengths, no, 8)
    assert torch.equal(R0, t64([1.0] * 6 + [0.0])), f"L_cache = 0: R {R0.tolist()}"


def test_truncation_mask_zeroes_only_truncated_rows():
    """truncation=mask zeroes the loss-mask rows of truncated completions only (R and the input mask untouched), so
    they get no gradient; truncation=keep leaves the loss mask equal to the mask."""
    b = golden_batch(GOLDEN["grpo"])
    b["truncated"] = torch.tensor([False, True, False, True])
    mask_before = b["mask"].clone()
    got = run_path(config("grpo", truncation="mask"), b)
    want = t64(MASK) * t64([1, 0, 1, 0]).unsqueeze(-1)
    assert torch.equal(got.loss_mask, want), f"loss mask {got.loss_mask.tolist()}"
    assert torch.equal(b["mask"], mask_before), f"input mask mutated: {b['mask'].tolist()}"
    assert torch.equal(got.R, b["scores"]), f"R {got.R.tolist()}"
    assert (got.grad[1] == 0).all() and (got.grad[3] == 0).all(), f"truncated rows got gradient {got.grad.tolist()}"
    assert (got.grad[0, :3] != 0).any() and (got.grad[2, :2] != 0).any(), f"kept rows lost gradient {got.grad}"
    keep = run_path(config("grpo"), b)
    assert torch.equal(keep.loss_mask, t64(MASK)), f"keep: {keep.loss_mask.tolist()}"


def test_reward_clip_clamps_scores():
    """reward_clip = c clamps scores to [−c, c] before anything else (REINFORCE++: c = 10); None leaves them."""
    scores = t64([-15.0, -10.0, -3.0, 0.0, 10.0, 12.5])
    mask = torch.ones(6, 2, dtype=F64)
    old = torch.full((6, 2), -1.0, dtype=F64)
    args = (scores, mask, torch.full((6,), 2), torch.zeros(6, dtype=torch.bool), 4, old, old.clone())
    R, _, _ = shape_rewards(config("reinforce_pp"), *args)  # old == ref: no KL
    assert torch.equal(R, t64([-10.0, -10.0, -3.0, 0.0, 10.0, 10.0])), f"clip 10: R {R.tolist()}"
    R, _, _ = shape_rewards(config("reinforce_pp", reward_clip=2.5), *args)
    assert torch.equal(R, t64([-2.5, -2.5, -2.5, 0.0, 2.5, 2.5])), f"clip 2.5: R {R.tolist()}"
    R, _, _ = shape_rewards(config("grpo"), *args)
    assert torch.equal(R, scores), f"no clip: R {R.tolist()}"


# d = ref − old on the unmasked tokens: row 0 (1, −1, 0), row 1 (2); β = 0.1, scores (1, 0).
#   k1 = −d: Σ row 0 = 0, row 1 = −2    -> R = (1 − 0, 0 + 0.2) = (1, 0.2)
#   k2 = d²/2: Σ 0.5 + 0.5 + 0 = 1, 2    -> R = (0.9, −0.2)
#   k3 = e^d − d − 1: (e − 2) + 1/e = 1.0861613, e² − 3 = 4.3890561 -> R = (1 − 0.10861613, −0.43890561)
KL_D = [[1.0, -1.0, 0.0], [2.0, 0.0, 0.0]]
KL_MASK = [[1, 1, 1], [1, 0, 0]]
KL_CASES = {
    "k1": ([[-1.0, 1.0, 0.0], [-2.0, 0, 0]], [1.0, 0.2]),
    "k2": ([[0.5, 0.5, 0.0], [2.0, 0, 0]], [0.9, -0.2]),
    "k3": ([[k3(1), k3(-1), 0.0], [k3(2), 0, 0]], [1 - 0.1 * (k3(1) + k3(-1)), -0.1 * k3(2)]),
}


@pytest.mark.parametrize("kind", sorted(KL_CASES))
def test_kl_in_the_reward_golden(kind):
    """KL in the reward: r_t = 1[t = L]·score − β·KL_t(π_old || π_ref) on unmasked tokens, R_i = score_i − β Σ_t KL_t;
    junk at masked positions is ignored."""
    per_token, want_R = KL_CASES[kind]
    mask = t64(KL_MASK)
    old = t64([[-1.0, -2.0, -0.5], [-1.5, 1e30, NAN]])  # masked: absurd
    ref = torch.where(mask.bool(), old + t64(KL_D), t64([[0.0, 0.0, 0.0], [0.0, -1e30, INF]]))
    cfg = config("rloo", kl_estimator=kind, beta=0.1)
    scores = t64([1.0, 0.0])
    R, tr, _ = shape_rewards(cfg, scores, mask, torch.tensor([3, 1]), torch.zeros(2, dtype=torch.bool), 3, old, ref)
    assert torch.allclose(R, t64(want_R), rtol=1e-12, atol=1e-15), f"{kind}: R {R.tolist()} != {want_R}"
    want_tr = terminal_rewards(scores, mask) - 0.1 * t64(per_token)
    assert torch.allclose(tr, want_tr, rtol=1e-12, atol=1e-15), f"{kind}: r_t {tr.tolist()} != {want_tr.tolist()}"


# ---- config validation -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("trust_region", ["clip", "sapo"])
def test_ratio_none_with_a_trust_region_raises(trust_region):
    """ratio='none' (the plain log π surrogate) with a trust region is rejected with a ValueError naming both
    choices, on construction and on dataclasses.replace of a default config."""
    with pytest.raises(ValueError) as err:
        PolicyGradientConfig(ratio="none", trust_region=trust_region)
    msg = str(err.value)
    assert f"trust_region={trust_region!r}" in msg and "ratio='none'" in msg, msg
    with pytest.raises(ValueError, match="ratio='none'"):
        config("reinforce", trust_region=trust_region)


@pytest.mark.parametrize("name", RL)
def test_default_configs_validate(name):
    """Every critic-free default config constructs, and its ratio/trust-region pair is a valid one."""
    cfg = config(name)
    assert cfg.ratio != "none" or cfg.trust_region == "none", f"{name}: {cfg.ratio} / {cfg.trust_region}"
