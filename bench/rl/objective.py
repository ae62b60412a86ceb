"""The critic-free family as explicit, orthogonal choices (see ../shared/docs/field-notes.md, "Comparability").

An algorithm is a ``PolicyGradientConfig``: one value for each choice below, each backed by one primitive in
``bench/rl/losses.py``. Every choice is a config field, so it is logged with the run (params and ``choice.*`` tags) and
can be overridden on the command line or swept. Dispatch is on the *choice's value* through small tables, never on an
algorithm's name.

    reward_shaping  outcome (the score on the last token) | process (the task's step rewards, Task.process_rewards)
    advantage     none | batch_mean | rloo | group | gpg | reinforce_pp | reinforce_pp_baseline | greedy_baseline
                  | process (GRPO's process supervision, DeepSeekMath §4.1.3; needs reward_shaping=process)
    adv_scale     none | group_std | batch_std            (divisor of the group-centred reward, for group / gpg)
    ratio         none (plain log π) | token | sequence (GSPO) | sequence_token (GSPO-token) | sequence_mean (GRPO-S)
    trust_region  none | clip (ε_low, ε_high; symmetric when equal; a sequence clip with ratio=sequence) | sapo
    loss_agg      token-mean | seq-mean-token-mean | seq-mean-token-sum | constant-normalised
    kl_placement  none | reward | loss ;  kl_estimator k1 | k2 | k3 ;  beta
    truncation    keep | mask | overlong_penalty
    dynamic_sampling   drop zero-variance groups and sample more prompts until the batch is full (DAPO)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Literal

import torch

from bench.engine.rollout import Rollout
from bench.rl import losses as L
from bench.rl.module import AlgorithmConfig, RLModule

Advantage = Literal[
    "none", "batch_mean", "rloo", "group", "gpg", "reinforce_pp", "reinforce_pp_baseline", "greedy_baseline", "process"
]
RewardShaping = Literal["outcome", "process"]
AdvScale = Literal["none", "group_std", "batch_std"]
Ratio = Literal["none", "token", "sequence", "sequence_token", "sequence_mean"]
TrustRegion = Literal["none", "clip", "sapo"]
KLPlacement = Literal["none", "reward", "loss"]
Truncation = Literal["keep", "mask", "overlong_penalty"]
CHOICES = (
    "reward_shaping",
    "advantage",
    "adv_scale",
    "ratio",
    "trust_region",
    "loss_agg",
    "kl_placement",
    "kl_estimator",
    "truncation",
    "dynamic_sampling",
)


@dataclass
class PolicyGradientConfig(AlgorithmConfig):
    """Every choice of the critic-free family. Algorithms subclass this and set their paper's defaults."""

    reward_shaping: RewardShaping = "outcome"
    """outcome: the task's score on the last token; process: the task's oracle step rewards (Task.process_rewards),
    each on its step's last token, as the per-token rewards (critics, return-to-go) and R = their sum."""
    advantage: Advantage = "group"
    """Advantage estimator."""
    step_discount: float = 1.0
    """γ over steps for advantage=process: token t of step j gets Σ_{k ≥ j} γ^{k−j} r̃_k. 1 is DeepSeekMath §4.1.3;
    0 credits each step with its own normalised reward only (the oracle for independent sub-problems)."""
    adv_scale: AdvScale = "group_std"
    """Divisor of the group-centred reward: none (Dr. GRPO), group std (GRPO), batch std."""
    adv_eps: float = 1e-6
    """ε added to the std divisor."""
    adv_std_unbiased: bool = True
    """Sample (True) or population (False) std for group_std / batch_std."""
    ratio: Ratio = "token"
    """Importance ratio level; none is the plain log-probability surrogate (REINFORCE)."""
    trust_region: TrustRegion = "clip"
    clip_eps_low: float = 0.2
    """ε_low: lower clip 1 − ε_low."""
    clip_eps_high: float = 0.2
    """ε_high: upper clip 1 + ε_high (DAPO's clip-higher when > ε_low)."""
    sapo_tau_pos: float = 1.0
    """SAPO τ for positive advantages."""
    sapo_tau_neg: float = 1.05
    """SAPO τ for negative advantages."""
    loss_agg: L.AggMode = "seq-mean-token-mean"
    kl_placement: KLPlacement = "loss"
    kl_estimator: L.KLKind = "k3"
    beta: float = 0.04
    """KL coefficient β; 0 disables the reference forward pass."""
    reward_clip: float | None = None
    """Clip scores to ±c before anything else (REINFORCE++: 10)."""
    truncation: Truncation = "keep"
    """Completions that hit the budget: kept, masked out of the loss, or penalised (DAPO, L_max = budget)."""
    overlong_buffer: int = 4
    """L_cache of DAPO's soft overlong punishment (tokens before the budget where the penalty ramps)."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and sample more prompts until P groups are kept."""
    max_sampling_rounds: int = 4
    """Dynamic sampling gives up after this many generation rounds and trains on the groups it has."""

    def __post_init__(self):
        if self.ratio == "none" and self.trust_region != "none":
            raise ValueError(
                f"trust_region={self.trust_region!r} needs an importance ratio; ratio='none' is the plain "
                "log-probability surrogate: set trust_region=none or ratio=token"
            )
        if self.advantage == "process" and self.reward_shaping != "process":
            raise ValueError("advantage='process' normalises the task's step rewards: set reward_shaping=process")
        if not 0.0 <= self.step_discount <= 1.0:
            raise ValueError(f"step_discount is a discount γ in [0, 1], got {self.step_discount}")
        if self.step_discount != 1.0 and self.advantage != "process":
            raise ValueError("step_discount discounts the step rewards of advantage='process'; set advantage=process")
        if self.clip_eps_low < 0 or self.clip_eps_high < 0:
            raise ValueError("clip_eps_low and clip_eps_high must be >= 0")

    def choices(self) -> dict[str, str]:
        return {f.name: str(getattr(self, f.name)) for f in fields(self) if f.name in CHOICES}


# ---- advantages: (rewards [B], token_rewards [B, T], mask [B, T], G, cfg, baseline [B] | None,
#      step ends [B, T] | None) -> [B] or [B, T] ----
def _group(r, tr, m, G, cfg, base, steps):
    if cfg.adv_scale == "batch_std":
        centred = L.group_advantages(r, G, "none")
        std = r.std(unbiased=cfg.adv_std_unbiased) if r.numel() > 1 else torch.zeros((), dtype=r.dtype)
        return centred / (std + cfg.adv_eps)
    return L.group_advantages(
        r, G, "std" if cfg.adv_scale == "group_std" else "none", cfg.adv_eps, cfg.adv_std_unbiased
    )


def _gpg(r, tr, m, G, cfg, base, steps):
    """GPG: α·(r − mean_g r)/F, α = B/(B − M), M = samples in zero-variance groups, F = 1 or std."""
    B = r.shape[0]
    M = int(L.zero_variance_groups(r, G).sum()) * G
    alpha = B / (B - M) if M < B else 1.0
    return alpha * _group(r, tr, m, G, cfg, base, steps)


def _reinforce_pp(r, tr, m, G, cfg, base, steps):
    """REINFORCE++: return-to-go of the per-token rewards (terminal score, KL in reward), whitened over the batch."""
    return L.whiten(L.return_to_go(tr, m), m)


def _reinforce_pp_baseline(r, tr, m, G, cfg, base, steps):
    """REINFORCE++-baseline: subtract the group mean of the scalar reward, then whiten over the batch's tokens."""
    centred = L.group_advantages(r, G, "none").unsqueeze(-1).expand_as(m)
    return L.whiten(centred, m)


def _process(r, tr, m, G, cfg, base, steps):
    """DeepSeekMath §4.1.3: step rewards normalised over the group, each token credited with the steps from it on."""
    return L.process_advantages(tr, steps, m, G, cfg.adv_eps, cfg.adv_std_unbiased, cfg.step_discount)


ADVANTAGES: dict[str, Callable] = {
    "none": lambda r, tr, m, G, cfg, base, steps: r,
    "batch_mean": lambda r, tr, m, G, cfg, base, steps: r - r.mean(),
    "rloo": lambda r, tr, m, G, cfg, base, steps: L.rloo_advantages(r, G),
    "group": _group,
    "gpg": _gpg,
    "reinforce_pp": _reinforce_pp,
    "reinforce_pp_baseline": _reinforce_pp_baseline,
    "greedy_baseline": lambda r, tr, m, G, cfg, base, steps: r - base,
    "process": _process,
}


def advantages(
    cfg: PolicyGradientConfig, rewards, token_rewards, mask, group_size, baseline=None, steps=None
) -> torch.Tensor:
    return ADVANTAGES[cfg.advantage](rewards, token_rewards, mask, group_size, cfg, baseline, steps)


# ---- the surrogate ---------------------------------------------------------------------------------------------
RATIOS: dict[str, Callable] = {
    "token": L.token_ratio,
    "sequence": lambda logp, old, m: L.sequence_ratio(logp, old, m).unsqueeze(-1).expand_as(logp),
    "sequence_token": L.sequence_token_ratio,
    "sequence_mean": lambda logp, old, m: L.sequence_mean_ratio(logp, old, m).unsqueeze(-1).expand_as(logp),
}


def _clip(ratio, adv, cfg):
    return L.clipped_surrogate(ratio, adv, cfg.clip_eps_low, cfg.clip_eps_high)


TRUST_REGIONS: dict[str, Callable] = {
    "none": lambda ratio, adv, cfg: (ratio * adv, torch.zeros_like(adv, dtype=torch.bool)),
    "clip": _clip,
    "sapo": lambda ratio, adv, cfg: (
        L.sapo_gate(ratio, adv, cfg.sapo_tau_pos, cfg.sapo_tau_neg),
        torch.zeros_like(adv, dtype=torch.bool),
    ),
}


def policy_loss(logp, old_logp, adv, mask, cfg: PolicyGradientConfig, norm: L.Norm, ref_logp=None):
    """ℒ_{i,t} = −TR(ρ_{i,t}, A_{i,t}) [+ β·KL_{i,t}], aggregated by ``cfg.loss_agg`` with the step's denominators.

    logp, old_logp, mask, ref_logp: [B, T]; adv: [B] (sequence) or [B, T] (token).
    """
    adv = adv.unsqueeze(-1).expand_as(logp) if adv.dim() == 1 else adv  # [B, T]
    if cfg.ratio == "none":
        objective, clipped = adv * logp, torch.zeros_like(mask, dtype=torch.bool)  # plain log-prob surrogate
        ratio = L.token_ratio(logp.detach(), old_logp, mask)  # for logging only
    else:
        ratio = RATIOS[cfg.ratio](logp, old_logp, mask)
        objective, clipped = TRUST_REGIONS[cfg.trust_region](ratio, adv, cfg)
    per_token = -objective
    stats = {
        "stats/clip_frac": L.masked_mean(clipped.float(), mask).detach(),
        "stats/ratio_mean": L.masked_mean(ratio.detach(), mask),
    }
    if cfg.kl_placement == "loss" and cfg.beta > 0:
        m = mask.bool()  # select before estimating: a non-finite value at a masked position must not reach backward
        zero = torch.zeros_like(logp)
        kl = L.kl_estimate(torch.where(m, logp, zero), torch.where(m, ref_logp, zero), cfg.kl_estimator)
        per_token = per_token + cfg.beta * kl
        stats["stats/kl"] = L.masked_mean(kl, mask).detach()
    loss = L.agg_loss(per_token, mask, cfg.loss_agg, norm)
    stats["loss/policy"] = L.agg_loss(-objective, mask, cfg.loss_agg, L.Norm.of(mask, norm.budget)).detach()
    return loss, stats


class PolicyGradient(RLModule):
    """The critic-free family's LightningModule: every hook is driven by the config's choices. An algorithm file
    subclasses it with its config (the paper's defaults) and writes nothing else unless its paper needs it."""

    Config = PolicyGradientConfig

    @property
    def needs_reference(self) -> bool:
        return self.acfg.beta > 0 and self.acfg.kl_placement != "none"

    @property
    def zero_adv_rows_inert(self) -> bool:
        return not self.needs_reference or self.acfg.kl_placement != "loss"  # policy_loss is A·f(ρ) + β·KL

    @property
    def needs_greedy_baseline(self) -> bool:
        return self.acfg.advantage == "greedy_baseline"

    @property
    def max_sampling_rounds(self) -> int:
        return self.acfg.max_sampling_rounds if self.acfg.dynamic_sampling else 1

    def keep_groups(self, ro: Rollout):
        if not self.acfg.dynamic_sampling:
            return None
        return ~L.zero_variance_groups(ro.scores, ro.group_size)  # DAPO: 0 < #correct < G

    @property
    def needs_process_rewards(self) -> bool:
        return self.acfg.reward_shaping == "process"

    def shape_rewards(self, ro: Rollout) -> None:
        ro.rewards, ro.token_rewards, ro.loss_mask = shape_rewards(
            self.acfg,
            ro.scores,
            ro.mask,
            ro.lengths,
            ro.truncated,
            self.cfg.rollout.max_new_tokens,
            ro.old_logp,
            ro.ref_logp,
            ro.step_rewards,
        )

    def advantages(self, ro: Rollout) -> torch.Tensor:
        return advantages(
            self.acfg, ro.rewards, ro.token_rewards, ro.loss_mask, ro.group_size, ro.baseline, ro.step_ends
        )

    def loss(self, rows, logp, norm):
        return policy_loss(logp, rows["old_logp"], rows["adv"], rows["mask"], self.acfg, norm, rows.get("ref_logp"))


def shape_rewards(
    cfg: PolicyGradientConfig,
    scores,
    mask,
    lengths,
    truncated,
    budget: int,
    old_logp=None,
    ref_logp=None,
    step_rewards=None,
):
    """scores [B] -> (sequence returns R [B], per-token rewards [B, T], loss mask [B, T]).

    Order: clip the score (with reward_shaping=process: each step reward, ``step_rewards`` [B, T], in place of the
    terminal score); truncation policy (mask truncated rows out of the loss, or add DAPO's overlong penalty on the
    last token); KL in the reward: r_t −= β·KL_t (sg, from π_old vs π_ref), so R_i = Σ_t r_{i,t}.
    """
    clip = (lambda x: x) if cfg.reward_clip is None else (lambda x: x.clamp(-cfg.reward_clip, cfg.reward_clip))
    process = cfg.reward_shaping == "process"
    r = torch.zeros_like(scores) if process else clip(scores)
    loss_mask = mask
    if cfg.truncation == "overlong_penalty":
        r = r + L.overlong_penalty(lengths, budget, cfg.overlong_buffer).to(r)
    elif cfg.truncation == "mask":
        loss_mask = mask * (~truncated).unsqueeze(-1).to(mask)
    token_rewards = L.terminal_rewards(r, mask)
    if process:
        m = mask.bool()
        token_rewards = token_rewards + torch.where(m, clip(step_rewards).to(token_rewards), 0.0)
    if cfg.kl_placement == "reward" and cfg.beta > 0:
        kl = L.kl_estimate(old_logp, ref_logp, cfg.kl_estimator)
        token_rewards = token_rewards - cfg.beta * torch.where(mask.bool(), kl, torch.zeros_like(kl))
    return L.masked_sum(token_rewards, mask, dim=-1), token_rewards, loss_mask
