"""PPO: token-level actor-critic (Schulman et al. 2017, arXiv 1707.06347, Eq. 7 and Eq. 9) in the RLHF recipe of
Ziegler et al. 2019 (arXiv 1909.08593), Stiennon et al. 2020 and Ouyang et al. 2022 (KL penalty in the reward).

    r_t  = −β·sg[log π_old(y_t) − log π_ref(y_t)] + 1[t = L]·clip(score, −c, c)       (per-token reward)
    δ_t  = r_t + γ V(s_{t+1}) − V(s_t);   Â_t = Σ_l (γλ)^l δ_{t+l};   R̂_t = Â_t + V_old(s_t)     (GAE, Eq. 11-12)
    ℒ    = token-mean[ −C(ρ_t, whiten(Â)_t; ε, ε) ] + c_V · token-mean[ ½ max((V − R̂)², (clip(V, V_old ± ε_V) − R̂)²) ]

Choices: advantage=gae (critic: a value head on the policy trunk), ratio=token, trust_region=clip 0.2,
loss_agg=token-mean, KL k1 in the reward (β = 0.05), reward clip c = 2.5, γ = 1, λ = 0.95, Â whitened over the batch.
Reference: ../shared/docs/algorithms.md ("Fine-grained credit", PPO, [primary]).

Deviations from the paper
# NOTE(deviation): β = 0.05 and c = 2.5 follow MA-RLHF's PPO baseline (DeepSpeed-Chat), so that PPO and MA-PPO differ
#   only in the macro actions; Ziegler/Stiennon adapt β towards a KL target, Ouyang fix β = 0.02.
# NOTE(deviation): the value head is zero-initialised on the policy's trunk (critic=head), not a separate value
#   model initialised from a reward model (there is no reward model: the reward is verifiable); critic=model gives a
#   separate copy of the initial policy's trunk.
# NOTE(deviation): the critic's gradient is clipped separately from the policy's (update() clips the policy's);
#   with critic=head the shared trunk's gradient from the value loss is clipped with the policy's.
# NOTE(deviation): one optimizer step per rollout by default (train.ppo_epochs = 1, whole-batch minibatch, shared by
#   every algorithm in conf/config.yaml); the RLHF recipe uses 4 epochs of minibatches (set train.ppo_epochs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bench.engine.rollout import Rollout
from bench.rl.losses import AggMode, KLKind, whiten
from bench.rl.objective import AdvScale, KLPlacement, Ratio, TrustRegion, policy_loss
from bench.rl.value import ActorCritic, ActorCriticConfig, CriticKind, clipped_value_loss, gae


@dataclass
class PPOConfig(ActorCriticConfig):
    name: str = "ppo"
    advantage: Literal["gae"] = "gae"
    """Â_t = Σ_l (γλ)^l δ_{t+l}"""
    adv_scale: AdvScale = "none"
    """unused by GAE (whitening is whiten_adv)"""
    ratio: Ratio = "token"
    """ρ_t = π_θ(y_t) / π_old(y_t) (Eq. 6)"""
    trust_region: TrustRegion = "clip"
    clip_eps_low: float = 0.2
    """ε in Eq. 7"""
    clip_eps_high: float = 0.2
    """ε in Eq. 7 (symmetric)"""
    loss_agg: AggMode = "token-mean"
    kl_placement: KLPlacement = "reward"
    kl_estimator: KLKind = "k1"
    """−β·(log π_old − log π_ref) per token in the reward"""
    beta: float = 0.05
    """β of the per-token KL penalty"""
    reward_clip: float | None = 2.5
    """c: the score is clipped to ±c"""
    critic: CriticKind = "head"
    value_clip: float | None = 0.2
    """ε_V of the clipped value loss"""
    vf_coef: float = 1.0
    """c_V (Eq. 9); the ½ is inside the value loss"""
    gamma: float = 1.0
    """γ"""
    lam: float = 0.95
    """λ"""
    whiten_adv: bool = True
    """whiten Â over the batch (Ziegler et al. 2019)"""


def ppo_loss(logp, old_logp, adv, values, old_values, returns, mask, cfg: PPOConfig, norm, **behaviour):
    """Clipped token surrogate + c_V·clipped value loss, both token-mean; every tensor [B, T]. ``behaviour``: the
    keyword arguments of policy_loss (is_weight, sampler_logp, groups)."""
    pg, stats = policy_loss(logp, old_logp, adv, mask, cfg, norm, **behaviour)
    vf, vstats = clipped_value_loss(values, old_values, returns, mask, cfg.value_clip, norm)
    return pg + cfg.vf_coef * vf, {**stats, **vstats}


class PPO(ActorCritic):
    Config = PPOConfig
    multi_turn = False  # its token-level GAE runs over every completion token (turn_ppo is the multi-turn form)
    description = "PPO (Schulman 2017, RLHF recipe): value head, GAE γ=1 λ=0.95, KL in reward, token clip 0.2"

    def advantages(self, ro: Rollout):
        adv, ro.returns = gae(ro.token_rewards, ro.values, ro.mask, self.acfg.gamma, self.acfg.lam)
        self.value_stats(ro)
        return whiten(adv, ro.train_mask) if self.acfg.whiten_adv else adv

    def loss(self, rows, logp, norm):
        values = self.critic.train_values(rows)
        args = (rows["values"], rows["returns"], rows["mask"], self.acfg, norm)
        behaviour = dict(is_weight=rows.get("is_weight"), sampler_logp=rows["sampler_logp"], groups=rows["group"])
        return ppo_loss(logp, rows["old_logp"], rows["adv"], values, *args, **behaviour)
