"""Turn-level PPO: PPO on the turn-level MDP (Li, Zhou, Meng, Vadera, Li, Li; "Turn-PPO", arXiv 2512.17008,
Findings of EACL 2026). For multi-turn episodes (environment tasks, bench/engine/episode.py).

    s_h  = the history up to turn h (every earlier action and observation, then the current observation)
    a_h  = the policy's whole output at turn h;  r_h = the environment's reward for it
    V_h  = V(s_h): the critic at the position before turn h's first token (the value head reads that hidden state)
    δ_h  = r_h + γ V_{h+1} − V_h   (V_{H+1} = 0: the episode ends)
    Â_h  = Σ_l (γλ)^l δ_{h+l};   R̂_h = Â_h + V_h                      (GAE over turns, not tokens)
    ℒ    = token-mean[ −C(ρ_t, Â_{h(t)}; ε, ε) ]
         + c_V · mean_h[ ½ max((V_h − R̂_h)², (clip(V_h, V_old,h ± ε_V) − R̂_h)²) ]

Â_h is shared by every token of turn h's action; the environment's tokens carry neither advantage nor value loss;
one value per turn is the bootstrap target (the value loss is on each turn's first token only). Defaults from the
paper's reported guidance: γ = 0.99, λ = 0.9 over turns, a critic learning rate above the actor's (10x here).
On one-turn episodes Â = R − V(s_1) on every token: PPO with a single state value, the prompt's (the one-turn
counterpart, tests/test_episodes.py). On a single-turn task the completion is one turn.
Reference: ../shared/docs/algorithms-round4.md §2 ([secondary]: no official code; only the abstract and summaries
were readable).

Choice: ``ratio`` = token (each token's ρ_t, as verl's clipped loss; default) | turn_product (Π_{t∈a_h} ρ_t) |
turn_geomean (its |a_h|-th root): one summary says the paper clips a turn-level ratio, unverified.

Deviations from the paper
# NOTE(deviation): the turn ratio's form is unverified (above); the token ratio is the default, the turn ratios
#   are choices.
# NOTE(deviation): the critic is a value head on the policy's trunk (critic=head, zero-initialised) as in
#   algorithms/ppo.py; critic=model gives a separate trunk. Where the paper reads V was not verified: here the
#   position before the turn's first token (the state the turn acts in).
# NOTE(deviation): no KL to a reference (β = 0) and no advantage whitening, as GiGPO's and LOOP's comparisons run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from algorithms.ma_ppo import RATIOS as TURN_RATIOS
from bench.engine.rollout import Rollout
from bench.rl import losses as L
from bench.rl import segment as S
from bench.rl.objective import KLPlacement
from bench.rl.value import ActorCritic, ActorCriticConfig, clipped_value_loss, gae


@dataclass
class TurnPPOConfig(ActorCriticConfig):
    name: str = "turn_ppo"
    advantage: Literal["gae"] = "gae"
    ratio: Literal["token", "turn_product", "turn_geomean"] = "token"
    """ρ per token | Π_{t∈a_h} ρ_t | (Π_{t∈a_h} ρ_t)^{1/|a_h|}, each token then carrying its turn's"""
    loss_agg: L.AggMode = "token-mean"
    kl_placement: KLPlacement = "reward"
    beta: float = 0.0
    critic_lr: float | None = None
    """None: 10 x optim.lr (the paper: the critic learns faster than the actor)."""
    gamma: float = 0.99
    """γ over turns"""
    lam: float = 0.9
    """λ over turns"""
    whiten_adv: bool = False

    def choice_tables(self):
        return {k: v for k, v in super().choice_tables().items() if k != "ratio"}  # turn ratios: TURN_RATIOS below


RATIO_OF = {"token": "token", "turn_product": "macro_product", "turn_geomean": "macro_geomean"}


def turn_index_of(ro: Rollout) -> torch.Tensor:
    """[B, T] turn of each policy token, −1 elsewhere (a single-turn completion is turn 0)."""
    m = ro.train_mask.bool()
    index = ro.turn_index if ro.turn_index is not None else torch.zeros_like(m, dtype=torch.long)
    return torch.where(m, index, torch.full_like(index, -1))


def turn_gae(token_rewards, values, index, gamma: float, lam: float):
    """Per-token rewards and V_old [B, T], turn index [B, T] (−1 off the policy's tokens) -> (Â, R̂) [B, T]: the turn's
    reward is the sum of its tokens' (the environment's on its last token), its value V at its first token; GAE over
    turns; every token of a turn carries its Â and R̂."""
    r = S.macro_sum(token_rewards, index)  # [B, H]
    v = S.macro_reduce(values, index, "first")  # [B, H]
    adv, returns = gae(r, v, S.macro_mask(index), gamma, lam)
    return S.macro_expand(adv, index), S.macro_expand(returns, index)


def turn_ppo_loss(logp, old_logp, adv, values, old_values, returns, index, mask, cfg: TurnPPOConfig, norm):
    """Clipped surrogate with each token's turn advantage, token-mean; the value loss on each turn's first token."""
    ratio = TURN_RATIOS[RATIO_OF[cfg.ratio]](logp, old_logp, mask, index)
    surrogate, clipped = L.clipped_surrogate(ratio, adv, cfg.clip_eps_low, cfg.clip_eps_high)
    pg = L.agg_loss(-surrogate, mask, cfg.loss_agg, norm)
    first = S.SIGMA["first"](index) * (index >= 0).to(mask)
    vf, stats = clipped_value_loss(values, old_values, returns, first, cfg.value_clip, L.Norm.of(first, norm.budget))
    stats["stats/clip_frac"] = L.masked_mean(clipped.float(), mask).detach()
    stats["loss/policy"] = pg.detach()
    return pg + cfg.vf_coef * vf, stats


class TurnPPO(ActorCritic):
    Config = TurnPPOConfig
    multi_turn = True
    reads_behaviour_weights = False  # its own surrogate (below)
    description = "Turn-PPO (Li et al. 2025): a critic on turn states, GAE over turns (γ 0.99, λ 0.9), turn advantage"

    def __init__(self, cfg, policy, tokenizer, task):
        super().__init__(cfg, policy, tokenizer, task)
        if self.acfg.critic_lr is None:  # read by configure_optimizers
            self.acfg = replace(self.acfg, critic_lr=10 * cfg.optim.lr)

    def advantages(self, ro: Rollout):
        ro.macro_index = turn_index_of(ro)
        adv, ro.returns = turn_gae(ro.token_rewards, ro.values, ro.macro_index, self.acfg.gamma, self.acfg.lam)
        self.value_stats(ro)
        return L.whiten(adv, ro.train_mask) if self.acfg.whiten_adv else adv

    def loss(self, rows, logp, norm):
        values = self.critic.train_values(rows)
        args = (rows["values"], rows["returns"], rows["macro_index"], rows["mask"])
        return turn_ppo_loss(logp, rows["old_logp"], rows["adv"], values, *args, self.acfg, norm)
