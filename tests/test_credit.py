"""Fine-grained credit (bench/rl/credit.py; algorithms gtpo, grpo_s, tempo, ts_grpo): the group prefix trie and TEMPO's
advantages on a hand-built group; GTPO / GRPO-S entropy weights and rewards by hand; reductions to their parents
(GTPO α2 = 0 -> DAPO-style, GRPO-S β2 = 0 -> a sequence-level clipped loss, TEMPO without branching -> GRPO, TS-GRPO
with an empty / all-answer span -> token GRPO / GSPO-token), loss and d loss / d logp to 1e-6; answer spans as token
masks (character and BPE tokenizers); behaviour entropies against a direct softmax on a real tiny model; TS-GRPO
trains on text-to-SQL."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from algorithms.grpo_s import GRPOSConfig, grpo_s_rewards, sequence_entropy_weights
from algorithms.gtpo import GTPOConfig, entropy_weights, gtpo_advantages, gtpo_token_rewards
from algorithms.tempo import TEMPOConfig, tempo_advantages
from algorithms.ts_grpo import TSGRPOConfig, ts_grpo_advantages, ts_grpo_loss
from bench.config import compose
from bench.engine.policy import char_tokenizer, load_policy
from bench.engine.rollout import Rollout
from bench.registry import ALGORITHMS, TASKS
from bench.rl.credit import (
    common_prefix_lengths,
    group_token_zscore,
    prefix_values,
    span_token_mask,
    token_char_offsets,
)
from bench.rl.losses import Norm, clipped_surrogate
from bench.rl.objective import PolicyGradientConfig, advantages, policy_loss
from bench.run.train import train
from tasks.countdown import answer_span as countdown_span
from tests.conftest import SMALL, data_root
from tests.test_critic_free import single_thread  # noqa: F401  (autouse: one intra-op thread for tiny tensors)

F64 = torch.float64
CREDIT = ("gtpo", "grpo_s", "tempo", "ts_grpo")


def t64(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def loss_grad(fn, logp: torch.Tensor):
    """(loss, d loss / d logp) of fn(leaf) for a fresh leaf copy of logp."""
    leaf = logp.clone().requires_grad_()
    loss = fn(leaf)[0]
    loss.backward()
    return loss.detach(), leaf.grad


def assert_same(got, want, what: str):
    (gl, gg), (wl, wg) = got, want
    assert math.isclose(gl.item(), wl.item(), rel_tol=1e-6, abs_tol=1e-9), f"{what}: loss {gl.item()} != {wl.item()}"
    assert torch.allclose(gg, wg, rtol=1e-6, atol=1e-9), f"{what}: grad {gg.tolist()} != {wg.tolist()}"


def batch(B: int, T: int, lengths, seed: int = 0, spread: float = 0.4) -> dict:
    """A float64 batch: ragged mask, old log-probs, logp = old + log-ratio in ±spread (clips act), junk at padding."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)).to(F64)
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3 - 0.05
    logp = old + (torch.rand(B, T, generator=g, dtype=F64) * 2 - 1) * spread
    junk = mask.bool()
    return dict(mask=mask, old=torch.where(junk, old, 40.0), logp=torch.where(junk, logp, -1e4))


# ---- the prefix trie -------------------------------------------------------------------------------------------------
# One group of G = 4, T = 4: rows 0 and 3 identical (a b c), row 1 (a b d e) leaves them at t = 2, row 2 (a z) at t = 1.
# Padding holds token 5, which row 1 has at t = 3: a padded position must never match.
IDS = [[1, 2, 3, 5], [1, 2, 4, 5], [1, 9, 5, 5], [1, 2, 3, 5]]
MASK = [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]
R = [1.0, 0.0, 0.0, 1.0]


def test_common_prefix_lengths_ignore_padding():
    """lcp[i, j] counts leading shared tokens of real positions only; lcp[i, i] = L_i."""
    lcp = common_prefix_lengths(torch.tensor(IDS), torch.tensor(MASK), 4)
    want = [[3, 2, 1, 3], [2, 4, 1, 2], [1, 1, 2, 1], [3, 2, 1, 3]]
    assert lcp.tolist() == want, lcp.tolist()


def test_prefix_values_by_hand():
    """V(s_t), V(s_{t+1}) = mean reward of the completions through each node; branch where a sibling leaves.
    Row 0: s_0 {0,1,2,3} 1/2, s_1 = "a" {0,1,2,3} 1/2, s_2 = "ab" {0,1,3} 2/3, s_3 = "abc" {0,3} 1.
    Row 1: s_3 = "abd" {1} 0, s_4 {1} 0. Row 2: s_2 = "az" {2} 0."""
    pv = prefix_values(torch.tensor(IDS), torch.tensor(MASK), t64(R), 4)
    h = 0.5
    before = [[h, h, 2 / 3, 0], [h, h, 2 / 3, 0], [h, h, 0, 0], [h, h, 2 / 3, 0]]
    after = [[h, 2 / 3, 1, 0], [h, 2 / 3, 0, 0], [h, 0, 0, 0], [h, 2 / 3, 1, 0]]
    branch = [[0, 1, 1, 0], [0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 0]]
    assert torch.allclose(pv.before, t64(before), atol=1e-15), pv.before.tolist()
    assert torch.allclose(pv.after, t64(after), atol=1e-15), pv.after.tolist()
    assert pv.branch.int().tolist() == branch, pv.branch.int().tolist()


def test_prefix_values_truncated_prefix_and_groups_are_independent():
    """A completion that is a strict prefix of a sibling (truncated) is a leaf inside the sibling's path: the sibling
    branches where it ends. Two groups never see each other's completions."""
    ids = torch.tensor([[1, 2, 0], [1, 2, 3], [1, 2, 3], [1, 2, 3]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1]])
    pv = prefix_values(ids, mask, t64([1.0, 0.0, 5.0, 7.0]), 2)
    assert pv.before[1].tolist() == [0.5, 0.5, 0.5] and pv.after[1].tolist() == [0.5, 0.5, 0.0], pv
    assert pv.branch[1].tolist() == [False, False, True], pv.branch.tolist()
    assert pv.before[2:].tolist() == [[6.0] * 3] * 2 and not pv.branch[2:].any(), pv  # identical pair: no branch


def test_tempo_advantages_by_hand():
    """A_{i,t} = [(r_i − μ) + V(s_{t+1}) − V(s_t)] / (σ + 1e-6), σ the sample std: μ = 0.5, σ = sqrt(1/3).
    TD (from the values above): row 0 (0, 1/6, 1/3), row 1 (0, 1/6, −2/3, 0), row 2 (0, −1/2)."""
    adv, branch = tempo_advantages(t64(R), torch.tensor(IDS), t64(MASK), 4, TEMPOConfig())
    s = math.sqrt(1 / 3) + 1e-6
    row0 = [0.5 / s, (0.5 + 1 / 6) / s, (0.5 + 1 / 3) / s, 0.0]
    want = [row0, [-0.5 / s, (-0.5 + 1 / 6) / s, (-0.5 - 2 / 3) / s, -0.5 / s], [-0.5 / s, -1.0 / s, 0, 0], row0]
    assert torch.allclose(adv, t64(want), rtol=1e-12, atol=1e-12), adv.tolist()
    assert branch.int().tolist() == [[0, 1, 1, 0], [0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 0]], branch.tolist()


@pytest.mark.parametrize("G", [1, 4])
def test_tempo_without_branching_is_grpo(G):
    """Groups of identical completions (ragged between groups, junk ids at padding), or G = 1: the TD term is exactly
    0 and TEMPO's loss and gradient equal GRPO's with the same clip (0.2 / 0.28), aggregation (token-mean) and no KL."""
    P, T = 8 // G, 5
    lengths = [5 - (i // G) % 3 for i in range(P * G)]  # constant within a group
    b = batch(P * G, T, lengths, seed=G)
    ids = torch.randint(3, 50, (P, T), generator=torch.Generator().manual_seed(1)).repeat_interleave(G, 0)
    ids = torch.where(b["mask"].bool(), ids, torch.randint(3, 50, ids.shape))
    r = t64([1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 1.0, 0.7])
    tempo = TEMPOConfig()
    grpo = dataclasses.replace(ALGORITHMS.get("grpo").Config(), beta=0.0, clip_eps_high=0.28, loss_agg="token-mean")
    adv, branch = tempo_advantages(r, ids, b["mask"], G, tempo)
    assert not branch.any(), branch
    base = advantages(grpo, r, None, b["mask"], G)
    assert torch.equal(adv, torch.where(b["mask"].bool(), base.unsqueeze(-1), torch.zeros_like(adv))), adv
    norm = Norm.of(b["mask"])
    got = loss_grad(lambda lp: policy_loss(lp, b["old"], adv, b["mask"], tempo, norm), b["logp"])
    want = loss_grad(lambda lp: policy_loss(lp, b["old"], base, b["mask"], grpo, norm), b["logp"])
    assert_same(got, want, f"tempo G={G}")


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_shared_prefix_net_credit(agg):
    """Why there is no shared-prefix probe (results/credit_horizon/README.md): a prefix that every completion of a
    group shares is the same context and token in each row, so its parameter gradient is the group's sum of
    d loss / d logp at that position. On-policy (ratio 1, the harness's one update per rollout) with group-centred
    advantages that sum is Σ_i w_i A_i: exactly 0 under token-mean (w_i alike), and with unequal lengths
    −Σ_i A_i / (B |o_i|) under seq-mean-token-mean: rewards 1 0 0 1, lengths 4 8 7 5, A = ±(1/2)/sqrt(1/3), so
    −(0.8660 / 4)(1/4 − 1/8 − 1/7 + 1/5) = −0.039435 at each shared position. TEMPO's TD term is 0 on the shared
    prefix, so prefix-tree credit gives it the same. Credit differs only from the first divergence on: chain's
    problem."""
    G, shared = 4, 3
    lengths = [4, 8, 7, 5]  # the same 3 leading tokens, suffixes of different lengths
    T = max(lengths)
    mask = (torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)).to(F64)
    ids = torch.tensor([[7, 8, 9, 1 + i, 2, 3, 4, 5] for i in range(G)])
    old = -torch.rand(G, T, generator=torch.Generator().manual_seed(0), dtype=F64) - 0.1
    old[:, :shared] = old[0, :shared]  # one context: the same log-prob in every row
    r = t64([1.0, 0.0, 0.0, 1.0])
    grpo = dataclasses.replace(ALGORITHMS.get("grpo").Config(), beta=0.0, loss_agg=agg)
    tempo = dataclasses.replace(TEMPOConfig(), loss_agg=agg)
    seq_adv = advantages(grpo, r, None, mask, G)  # [G]: (r − 1/2) / (sample std + 1e-6)
    tempo_adv, _ = tempo_advantages(r, ids, mask, G, tempo)
    assert torch.allclose(tempo_adv[:, :shared], seq_adv.unsqueeze(-1).expand(G, shared), atol=1e-12)
    norm = Norm.of(mask)
    for cfg, adv in ((grpo, seq_adv), (tempo, tempo_adv)):
        _, grad = loss_grad(lambda lp, c=cfg, a=adv: policy_loss(lp, old, a, mask, c, norm), old)
        net = grad[:, :shared].sum(0)  # [shared]: what reaches the shared prefix's parameters
        if agg == "token-mean":
            assert torch.allclose(net, torch.zeros(shared, dtype=F64), atol=1e-12), (cfg.name, net)
        else:
            want = -(0.5 / math.sqrt(1 / 3) / 4) * (1 / 4 - 1 / 8 - 1 / 7 + 1 / 5)
            assert round(want, 6) == -0.039435 and torch.allclose(net, torch.full((shared,), want, dtype=F64)), net
        assert grad[:, shared].abs().min() > 0  # past the divergence every row gets its own credit


# ---- GTPO / GRPO-S ---------------------------------------------------------------------------------------------------
# G = 3, T = 3: rows 0, 1 correct (L = 3, 2), row 2 incorrect (L = 3). d_t = (2, 2, 1), h_t = (1, 1, 1).
ENT = [[1.0, 2.0, 4.0], [3.0, 2.0, 99.0], [0.5, 1.0, 2.0]]
GMASK = [[1, 1, 1], [1, 1, 0], [1, 1, 1]]
CORRECT = torch.tensor([True, True, False])


def test_gtpo_entropy_weights_and_token_rewards_by_hand():
    """O+: t0 ΣH = 4 -> (1/4, 3/4)·2; t1 ΣH = 4 -> (2/4, 2/4)·2; t2 only row 0 -> 1. O− (one row): 1 everywhere.
    r̃ = α1·r + α2·w on O+ (r = 1), −α1 − α2·w on O−; 0 at padding (the entropy 99 there is never read)."""
    w = entropy_weights(t64(ENT), CORRECT, t64(GMASK), 3, 1e-8)
    assert torch.allclose(w, t64([[0.5, 1.0, 1.0], [1.5, 1.0, 0.0], [1.0, 1.0, 1.0]]), atol=1e-7), w.tolist()
    r_tok, _ = gtpo_token_rewards(t64([1.0, 1.0, 0.0]), CORRECT, t64(ENT), t64(GMASK), 3, GTPOConfig())
    want = [[1.05, 1.1, 1.1], [1.15, 1.1, 0.0], [-1.1, -1.1, -1.1]]
    assert torch.allclose(r_tok, t64(want), atol=1e-8), r_tok.tolist()


def test_gtpo_advantages_separate_and_joint_by_hand():
    """Separate: O+ tokens (1.05, 1.1, 1.1, 1.15, 1.1) have mean 1.1 and sample std sqrt(0.005/4) -> ∓√2 at the two
    outliers, 0 elsewhere; O− tokens are all −1.1 -> exactly 0. Joint: one z-score over all 8 tokens."""
    r_tok = t64([[1.05, 1.1, 1.1], [1.15, 1.1, 0.0], [-1.1, -1.1, -1.1]])
    sep = gtpo_advantages(r_tok, CORRECT, t64(GMASK), 3, GTPOConfig())
    z = 0.05 / (math.sqrt(0.005 / 4) + 1e-6)
    assert torch.allclose(sep, t64([[-z, 0, 0], [z, 0, 0], [0, 0, 0]]), atol=1e-9), sep.tolist()
    assert (sep[2] == 0).all(), sep.tolist()
    joint = gtpo_advantages(r_tok, CORRECT, t64(GMASK), 3, GTPOConfig(adv_norm="joint"))
    vals = [1.05, 1.1, 1.1, 1.15, 1.1, -1.1, -1.1, -1.1]
    mu, sd = statistics.fmean(vals), statistics.stdev(vals)
    want = [[(v - mu) / (sd + 1e-6) for v in row] for row in ([1.05, 1.1, 1.1], [1.15, 1.1, mu], [-1.1] * 3)]
    assert torch.allclose(joint, t64(want), atol=1e-12), joint.tolist()


def test_group_token_zscore_single_token_and_empty_sets_are_zero():
    """A set of one token, an empty set and a constant set give 0, never NaN."""
    x = t64([[3.0, 0.0], [7.0, 7.0]])
    sel = torch.tensor([[True, False], [False, False]])
    assert torch.equal(group_token_zscore(x, sel, 2), torch.zeros(2, 2, dtype=F64))
    assert torch.equal(group_token_zscore(x, torch.zeros_like(sel), 1), torch.zeros(2, 2, dtype=F64))
    assert torch.equal(group_token_zscore(t64([[0.7, 0.7]] * 2), torch.ones_like(sel), 2), torch.zeros(2, 2, dtype=F64))


def test_gtpo_alpha2_zero_is_dapo_style():
    """α2 = 0, joint normalisation, population std, equal lengths: r̃_{i,t} = α1·r_i (O+) or −α1 (O−) is constant in a
    row, its token z-score is the group z-score of those rewards, and GTPO's loss and gradient equal the DAPO-style
    loss (token ratio, clip 0.2 / 0.28, token-mean, no KL) on the same rewards. With separate normalisation and binary
    rewards each set is constant: Â = 0 exactly."""
    B, T, G = 8, 4, 4
    b = batch(B, T, [T] * B, seed=3)
    scores = t64([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    correct = scores >= 1.0
    ent = torch.rand(B, T, dtype=F64, generator=torch.Generator().manual_seed(4)) * 3
    gtpo = GTPOConfig(alpha2=0.0, adv_norm="joint", adv_std_unbiased=False)
    r_tok, _ = gtpo_token_rewards(scores, correct, ent, b["mask"], G, gtpo)
    adv = gtpo_advantages(r_tok, correct, b["mask"], G, gtpo)
    dapo = dataclasses.replace(
        ALGORITHMS.get("dapo").Config(), truncation="keep", dynamic_sampling=False, adv_std_unbiased=False
    )
    seq_rewards = torch.where(correct, gtpo.alpha1 * scores, torch.full_like(scores, -gtpo.alpha1))
    base = advantages(dapo, seq_rewards, None, b["mask"], G)
    assert torch.allclose(adv, base.unsqueeze(-1).expand_as(adv), rtol=1e-12, atol=1e-12), (adv, base)
    norm = Norm.of(b["mask"])
    got = loss_grad(lambda lp: policy_loss(lp, b["old"], adv, b["mask"], gtpo, norm), b["logp"])
    want = loss_grad(lambda lp: policy_loss(lp, b["old"], base, b["mask"], dapo, norm), b["logp"])
    assert_same(got, want, "gtpo α2=0")
    separate = GTPOConfig(alpha2=0.0)
    r_sep, _ = gtpo_token_rewards(scores, correct, ent, b["mask"], G, separate)
    assert (gtpo_advantages(r_sep, correct, b["mask"], G, separate) == 0).all(), "separate, α2 = 0, binary: Â = 0"


def test_grpo_s_weights_and_rewards_by_hand():
    """Ĥ = (1, 3 | 0.5, 2), correct (1, 1 | 0, 0): w+ = Ĥ/ΣĤ·n = (0.5, 1.5); w− = (1/Ĥ)/Σ(1/Ĥ)·m = (2, 0.5)/2.5·2 =
    (1.6, 0.4); r̂ = (1.05, 1.15, −1.16, −1.04)."""
    c = torch.tensor([True, True, False, False])
    w = sequence_entropy_weights(t64([1.0, 3.0, 0.5, 2.0]), c, 4, 1e-8)
    assert torch.allclose(w, t64([0.5, 1.5, 1.6, 0.4]), atol=1e-7), w.tolist()
    r_hat, _ = grpo_s_rewards(t64([1.0, 1.0, 0.0, 0.0]), c, t64([1.0, 3.0, 0.5, 2.0]), 4, GRPOSConfig())
    assert torch.allclose(r_hat, t64([1.05, 1.15, -1.16, -1.04]), atol=1e-8), r_hat.tolist()


def test_grpo_s_beta2_zero_is_sequence_level_clip():
    """β2 = 0: r̂ = β1·r (O+) or −β1 (O−); GRPO-S's loss and gradient equal a hand-written sequence-level loss
    1/B Σ_i −min(w_i Â_i, clip(w_i, 0.8, 1.28) Â_i), w_i the arithmetic mean of the token ratios, Â the
    group z-score."""
    B, T, G = 8, 4, 4
    b = batch(B, T, [4, 2, 3, 1, 4, 4, 2, 3], seed=5)
    scores = t64([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    correct = scores >= 1.0
    cfg = GRPOSConfig(beta2=0.0)
    r_hat, _ = grpo_s_rewards(scores, correct, torch.rand(B, dtype=F64) + 0.1, G, cfg)
    adv = advantages(cfg, r_hat, None, b["mask"], G)
    m = b["mask"]

    def reference(lp):
        w = (torch.where(m.bool(), (lp - b["old"]).exp(), 0.0)).sum(-1) / m.sum(-1)  # [B]
        a = torch.where(correct, 1.0, -1.0)
        a = (a.view(-1, G) - a.view(-1, G).mean(-1, keepdim=True)) / (a.view(-1, G).std(-1, keepdim=True) + 1e-6)
        c, _ = clipped_surrogate(w, a.reshape(-1), 0.2, 0.28)
        return (-c.mean(),)

    got = loss_grad(lambda lp: policy_loss(lp, b["old"], adv, m, cfg, Norm.of(m)), b["logp"])
    assert_same(got, loss_grad(reference, b["logp"]), "grpo_s β2=0")


# ---- TS-GRPO ---------------------------------------------------------------------------------------------------------
def _ts_case(answer_fill: float):
    B, T, G = 8, 5, 4
    b = batch(B, T, [5, 2, 3, 1, 5, 4, 2, 3], seed=7, spread=0.5)
    scores = t64([1.0, 0.0, 0.0, 1.0, 0.0, 0.5, 1.0, 1.0])
    ts = TSGRPOConfig()
    a_seq = advantages(ts, scores, None, b["mask"], G)
    a_tok = advantages(ts, scores, None, b["mask"], G)  # planning reward = answer reward (default)
    answer = torch.full_like(b["mask"], answer_fill)
    adv = ts_grpo_advantages(a_seq, a_tok, answer, ts)
    norm = Norm.of(b["mask"])
    got = loss_grad(lambda lp: ts_grpo_loss(lp, b["old"], adv, answer, b["mask"], ts, norm), b["logp"])
    return b, scores, G, ts, adv, norm, got


def test_ts_grpo_empty_answer_span_is_token_grpo():
    """No answer tokens: ℒ = α_tok·L_tok = GRPO with clip 0.2 / 0.28, seq-mean-token-mean, population std, no KL."""
    b, scores, G, ts, adv, norm, got = _ts_case(0.0)
    grpo = dataclasses.replace(ALGORITHMS.get("grpo").Config(), beta=0.0, clip_eps_high=0.28, adv_std_unbiased=False)
    base = advantages(grpo, scores, None, b["mask"], G)
    assert torch.equal(adv, base.unsqueeze(-1).expand_as(adv)), (adv, base)
    want = loss_grad(lambda lp: policy_loss(lp, b["old"], base, b["mask"], grpo, norm), b["logp"])
    assert_same(got, want, "ts_grpo empty span")


def test_ts_grpo_all_answer_span_is_gspo_token():
    """All answer tokens: ℒ = α_seq·L_seq = α_seq × GSPO-token with the answer clip 0.28 / 0.25 and population std."""
    b, scores, G, ts, adv, norm, got = _ts_case(1.0)
    gspo = dataclasses.replace(
        ALGORITHMS.get("gspo_token").Config(), clip_eps_low=0.28, clip_eps_high=0.25, adv_std_unbiased=False
    )
    base = advantages(gspo, scores, None, b["mask"], G)
    assert torch.equal(adv, base.unsqueeze(-1).expand_as(adv)), (adv, base)
    loss, grad = loss_grad(lambda lp: policy_loss(lp, b["old"], base, b["mask"], gspo, norm), b["logp"])
    assert_same(got, (ts.alpha_seq * loss, ts.alpha_seq * grad), "ts_grpo all-answer span")


def test_ts_grpo_mixed_span_splits_the_loss():
    """A mixed span is the sum of its two parts: α_seq·(GSPO-token over the answer tokens only) + α_tok·(token GRPO
    over the rest), and the answer ratio uses only answer tokens (planning tokens do not move it)."""
    b, scores, G, ts, _, norm, _ = _ts_case(0.0)
    answer = torch.zeros_like(b["mask"])
    answer[:, 1:3] = 1.0
    a = advantages(ts, scores, None, b["mask"], G)
    adv = ts_grpo_advantages(a, a, answer, ts)
    total = loss_grad(lambda lp: ts_grpo_loss(lp, b["old"], adv, answer, b["mask"], ts, norm), b["logp"])
    seq = loss_grad(lambda lp: ts_grpo_loss(lp, b["old"], adv, answer, b["mask"] * answer, ts, norm), b["logp"])
    tok = loss_grad(lambda lp: ts_grpo_loss(lp, b["old"], adv, answer, b["mask"] * (1 - answer), ts, norm), b["logp"])
    assert_same(total, (seq[0] + tok[0], seq[1] + tok[1]), "ts_grpo split")
    shifted = b["logp"] + (1 - answer) * 0.3  # move planning tokens only
    moved = loss_grad(lambda lp: ts_grpo_loss(lp, b["old"], adv, answer, b["mask"] * answer, ts, norm), shifted)
    assert_same(moved, seq, "answer ratio ignores planning tokens")


# ---- answer spans as token masks -------------------------------------------------------------------------------------
def test_span_token_mask_character_tokenizer():
    """Countdown's answer span (the last <answer> block, tags included) maps to exactly its characters' tokens; EOS and
    padding are outside; a completion without a block is all answer (missing=1) or none (missing=0)."""
    tok = char_tokenizer()
    texts = ["ok <answer>1+2</answer>", "<answer>3</answer><answer>4*5</answer>x", "no block"]
    enc = [tok(t, add_special_tokens=False).input_ids + [tok.eos_token_id] for t in texts]
    T = max(map(len, enc)) + 2
    ids = torch.full((3, T), tok.pad_token_id)
    mask = torch.zeros(3, T)
    for i, e in enumerate(enc):
        ids[i, : len(e)], mask[i, : len(e)] = torch.tensor(e), 1
    spans = [countdown_span(t) for t in texts]
    assert spans == [(3, 23), (18, 38), None], spans
    got = span_token_mask(tok, ids, mask, spans, missing=1.0)
    for i, (t, s) in enumerate(zip(texts, spans, strict=True)):
        want = [float(s is None or s[0] <= k < s[1]) if k < len(t) else 0.0 for k in range(T)]
        want[len(t)] = float(s is None)  # EOS: inside only when the whole completion is the answer
        assert got[i].tolist() == want, (t, got[i].tolist())
    assert (span_token_mask(tok, ids, mask, spans, missing=0.0)[2] == 0).all()


def test_span_token_mask_bpe_tokenizer():
    """Multi-character tokens (a small BPE trained here): a token is in the span when its characters overlap it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<eos>", "<unk>"], show_progress=False)
    corpus = ["SELECT name FROM singer WHERE age > 30", "think first then ```sql SELECT count(*) FROM t```"] * 20
    raw.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    text = "think first then ```sql SELECT count(*) FROM t```"
    ids = tok(text, add_special_tokens=False).input_ids
    start = text.index("SELECT")
    span = (start, text.index("```", start))
    got = span_token_mask(tok, torch.tensor([ids]), torch.ones(1, len(ids)), [span])[0]
    pieces = [tok.decode(ids[: k + 1]) for k in range(len(ids))]
    offsets = [(len(pieces[k - 1]) if k else 0, len(pieces[k])) for k in range(len(ids))]
    want = [float(a < span[1] and b > span[0]) for a, b in offsets]
    assert got.tolist() == want and 0 < sum(want) < len(ids), (got.tolist(), offsets)
    assert text[span[0] : span[1]] in "".join(tok.decode([i]) for i, w in zip(ids, want, strict=True) if w)


# ---- behaviour entropies on a real tiny model ------------------------------------------------------------------------
def _module(name: str, store_args: list[str]):
    cfg = compose([f"algorithm={name}", "task=countdown", *SMALL, *store_args])
    obj = OmegaConf.to_object(cfg)
    policy, tok = load_policy(obj.model, obj.seed)
    task = TASKS.get("countdown")(obj.task, tok, seed=0, prompts_per_step=2)
    return ALGORITHMS.get(name)(obj, policy, tok, task), task, policy


def test_behaviour_entropy_matches_a_direct_softmax(store):
    """Algorithms that declare needs_entropy get Rollout.entropy = −Σ_v p log p of the temperature-scaled π_old at
    every generated token, from the behaviour forward; others get None. select_groups, concat and rows carry it."""
    module, task, policy = _module("gtpo", store["args"])
    assert module.needs_entropy and not _module("grpo", store["args"])[0].needs_entropy
    batch = task.collate_prompts(task.examples("train")[:2])
    ro = module.make_rollout(batch)
    module.behaviour_logprobs(ro)
    assert ro.entropy is not None and ro.entropy.shape == ro.mask.shape, ro.entropy
    with torch.no_grad():
        ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
        attn = torch.cat([ro.prompt_mask, ro.mask.long()], 1)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        T = ro.completion_ids.shape[1]
        logits = policy(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -T - 1 : -1].double()
        logp = torch.log_softmax(logits / module.cfg.rollout.temperature, -1)
        direct = -(logp.exp() * logp).sum(-1)
    m = ro.mask.bool()
    assert torch.allclose(ro.entropy[m].double(), direct[m], atol=1e-4), (ro.entropy[m] - direct[m]).abs().max()
    both = Rollout.concat([ro.select_groups(torch.tensor([False, True])), ro])
    assert torch.equal(both.entropy[: ro.group_size], ro.entropy[ro.group_size :]), "select_groups/concat entropy"
    both.adv, both.rewards = torch.zeros(both.size), torch.zeros(both.size)
    assert torch.equal(both.rows(torch.tensor([0]))["entropy"], ro.entropy[ro.group_size :][:1])


# ---- training runs ---------------------------------------------------------------------------------------------------
def test_credit_algorithms_are_registered_critic_free():
    """The four are in the registry as critic-free configs, so the registry contract trains them."""
    for name in CREDIT:
        assert issubclass(ALGORITHMS.get(name).Config, PolicyGradientConfig), name


@pytest.mark.slow
def test_ts_grpo_trains_on_text_to_sql(store):
    """TS-GRPO trains 2 steps on Spider text-to-SQL with the tiny model and logs stats/answer_token_frac."""
    root = data_root()
    if root is None or not (root / "text2sql" / "spider" / "dev.jsonl").is_file():
        pytest.skip(f"needs Spider under the data root (BENCH_DATA or ../shared/data): {root}/text2sql/spider")
    args = ["algorithm=ts_grpo", "task=text_to_sql", f"task.data_root={root}", *SMALL, "trainer.eval_every=100"]
    args.append("task.num_eval=4")
    result = train(compose([*args, *store["args"]]))
    client = MlflowClient(tracking_uri=store["uri"])
    assert client.get_run(result.run_id).info.status == "FINISHED"
    frac = [m.value for m in client.get_metric_history(result.run_id, "stats/answer_token_frac")]
    assert len(frac) == 2 and all(0.0 <= f <= 1.0 for f in frac), frac


# ---- properties ------------------------------------------------------------------------------------------------------
def _credit_advantages(name: str, ids, mask, scores, entropy, G):
    correct = scores >= 1.0
    if name == "tempo":
        return tempo_advantages(scores, ids, mask, G, TEMPOConfig())[0]
    if name == "gtpo":
        cfg = GTPOConfig()
        return gtpo_advantages(gtpo_token_rewards(scores, correct, entropy, mask, G, cfg)[0], correct, mask, G, cfg)
    answer = (ids % 3 == 0).to(mask)  # an arbitrary span
    a = advantages(TSGRPOConfig(), scores, None, mask, G)
    return ts_grpo_advantages(a, a, answer, TSGRPOConfig()) * mask


@pytest.mark.parametrize("name", ["tempo", "gtpo", "ts_grpo"])
@pytest.mark.parametrize("seed", range(5))
def test_token_advantages_ignore_padding_and_junk(name, seed):
    """Appending padded columns and writing junk (ids, entropies) at padded positions leaves the token advantages of
    real tokens unchanged and gives 0 at padding; constant-reward groups get 0 (TEMPO, TS-GRPO)."""
    g = torch.Generator().manual_seed(seed)
    G, P, T = 4, 2, 5
    lengths = torch.randint(1, T + 1, (P * G,), generator=g)
    mask = (torch.arange(T) < lengths.unsqueeze(-1)).to(F64)
    ids = torch.randint(3, 6, (P * G, T), generator=g)  # few symbols: shared prefixes are common
    scores = torch.randint(0, 2, (P * G,), generator=g).to(F64)
    scores[G:] = 1.0  # the second group is constant
    ent = torch.rand(P * G, T, generator=g, dtype=F64) * 2 + 0.01
    clean = _credit_advantages(name, ids, mask, scores, ent, G)
    m = mask.bool()
    pad = torch.cat([mask, torch.zeros(P * G, 2, dtype=F64)], 1)
    junk_ids = torch.cat([torch.where(m, ids, 4), torch.full((P * G, 2), 3)], 1)
    junk_ent = torch.cat([torch.where(m, ent, 1e6), torch.full((P * G, 2), -5.0, dtype=F64)], 1)
    dirty = _credit_advantages(name, junk_ids, pad, scores, junk_ent, G)
    assert torch.allclose(dirty[:, :T], clean, rtol=1e-12, atol=1e-12), (name, dirty, clean)
    assert (dirty[~pad.bool()] == 0).all() and torch.isfinite(dirty).all(), dirty
    if name != "gtpo":  # GTPO's entropy term moves tokens even in a constant group (see its docstring)
        assert (clean[G:] == 0).all(), clean[G:]


def test_correct_threshold_decides_o_plus():
    """correct_threshold=None uses the task's verdict; a float uses score >= threshold (partial credit)."""
    from algorithms.gtpo import correct_set

    scores, task = t64([0.2, 0.6, 1.0]), torch.tensor([False, False, True])
    assert correct_set(scores, task, None).tolist() == [False, False, True]
    assert correct_set(scores, task, 0.5).tolist() == [False, True, True]


def _byte_tokenizer():
    """One token per byte (byte-level BPE with no merges): multi-byte characters span several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<eos>"] = len(vocab)
    raw = Tokenizer(models.BPE(vocab, [], unk_token=None))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>"), vocab["<eos>"]


def test_token_char_offsets_stream_multibyte_and_invalid_byte_runs(monkeypatch):
    """Hand-computed on 'aé b€' (é: 2 bytes, €: 3): a multi-byte character belongs to the token that completes it;
    an invalid run (é's lead byte, then €'s 2nd byte) decodes to two replacement characters on the token at which the
    decoder gives up (the space after it); an incomplete run at the end goes to the last token; EOS is empty. The
    ranges tile decode(ids); one decode of the whole row, not one per prefix (O(L), not O(L²))."""
    tok, eos = _byte_tokenizer()
    ids = tok("aé b€", add_special_tokens=False).input_ids
    assert len(ids) == 8
    assert token_char_offsets(tok, ids) == [(0, 1), (1, 1), (1, 2), (2, 3), (3, 4), (4, 4), (4, 4), (4, 5)]
    bad = [ids[0], ids[1], ids[5], *ids[3:]]  # 'a', 0xC3, 0x82 (invalid after 0xC3), ' ', 'b', '€'
    assert tok.decode(bad) == "a\ufffd\ufffd b€"
    assert token_char_offsets(tok, bad) == [(0, 1), (1, 1), (1, 1), (1, 4), (4, 5), (5, 5), (5, 5), (5, 6)]
    assert token_char_offsets(tok, [*ids, ids[1]])[-1] == (5, 6)  # 'aé b€' + a lone lead byte: '\ufffd' on it
    assert token_char_offsets(tok, [*ids, eos])[-1] == (5, 5)
    calls = []
    monkeypatch.setattr(type(tok), "batch_decode", lambda *a, **k: calls.append(a) or [])
    token_char_offsets(tok, ids * 64)
    assert calls == []  # no prefix decodes
