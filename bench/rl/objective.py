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
    trust_region  none | clip (ε_low, ε_high; dual-clip with clip_ratio_c; a sequence clip with ratio=sequence) | sapo
                  | cispo | gmpo | clip_cov | kl_cov | minirl
    is_correction none | tis | seq_tis | seq_mask | icepop | m2po   (behaviour weights from π_old and the sampler μ)
    loss_agg      token-mean | seq-mean-token-mean | seq-mean-token-sum | constant-normalised | prompt-mean
    kl_placement  none | reward | loss ;  kl_estimator k1 | k2 | k3 ;  beta
    truncation    keep | mask | overlong_penalty
    dynamic_sampling   drop zero-variance groups and sample more prompts until the batch is full (DAPO)

The tables behind advantage, adv_scale, ratio, trust_region, is_correction and loss_agg are registries
(``bench.registry.Choices``): an algorithm file, in-tree or dropped in with ``--include``, adds a value with
``@TRUST_REGIONS.register("name")`` and an algorithm that selects it; docs/extending.md, "A new choice", is the example.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

import torch

from bench.engine.rollout import Rollout, sample_seed
from bench.registry import Choices
from bench.rl import losses as L
from bench.rl.module import AlgorithmConfig, RLModule

# Choice values are names in the registries below (plain strings, so a value registered outside the tree is valid);
# PolicyGradientConfig.__post_init__ checks each against its table.
Advantage = str
AdvScale = str
Ratio = str
TrustRegion = str
ISCorrection = str
RewardShaping = Literal["outcome", "process"]
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
    "is_correction",
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
    """ε_high: upper clip 1 + ε_high (DAPO's clip-higher when > ε_low). CISPO: the IS-weight cap is 1 + ε_high."""
    clip_ratio_c: float | None = None
    """Dual-clip PPO's c (> 1) for trust_region=clip: a negative-advantage token's objective is bounded below by c·A.
    None: off (verl's default is 3; the Clip-/KL-Cov authors use 10)."""
    log_ratio_cap: float | None = None
    """Clamp log π_θ − log π_old to ±cap before any ratio is formed (verl and slime use 20); the gradient is 0 where
    the cap is active. None: no cap."""
    gmpo_clip: float = 0.4
    """GMPO's c: the log-space clip [−c, c] of each token's log-ratio (ratio ∈ [e^−0.4, e^0.4] ≈ [0.67, 1.49])."""
    clip_cov_ratio: float = 2e-4
    """Clip-Cov: the fraction of valid tokens (at least 1) whose loss is zeroed."""
    clip_cov_lb: float = 1.0
    """Clip-Cov: candidates have Cov_t > lb."""
    clip_cov_ub: float = 5.0
    """Clip-Cov: candidates have Cov_t < ub."""
    kl_cov_ratio: float = 2e-3
    """KL-Cov: the fraction of valid tokens (at least 1), top by Cov_t, that get the |log-ratio| penalty. A fraction:
    the authors' 7B k_percent 0.2 (%); verl's default 2e-4 is their 32B setting."""
    kl_cov_coef: float = 1.0
    """KL-Cov: λ (the authors' ppo_kl_coef)."""
    minirl_is_cap: float = 10.0
    """MiniRL: C of the IS weight sg[min(π_θ/μ, C)] (Stable-RL's clip_ratio_c)."""
    is_correction: ISCorrection = "none"
    """Behaviour-policy correction: a weight per token from log π_old (recomputed by the learner) and log μ (the
    sampler's), constant in θ, multiplying the policy loss: none | tis | seq_tis | seq_mask | icepop | m2po."""
    tis_cap: float = 2.0
    """C of token TIS, min(π_old/μ, C) (the TIS authors' recipe)."""
    seq_tis_cap: float = 5.0
    """C of sequence TIS, min(Π_t π_old/μ, C) (SkyRL's sequence_tis_ratio_clip_high)."""
    mis_low: float = 0.5
    """Sequence-masked IS band [a, b] on Π_t π_old/μ (verl's rejection band)."""
    mis_high: float = 2.0
    icepop_low: float = 0.5
    """IcePop band [α, β] on the token ratio π_old/μ (verl and OpenRLHF presets; SkyRL and slime tests use [0.5, 2])."""
    icepop_high: float = 5.0
    m2_threshold: float = 0.04
    """M2PO's τ_M2: tokens are masked until the mean (log π_old − log μ)² of the rest is below it."""
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
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1.0:
            raise ValueError(f"clip_ratio_c (dual-clip c) must be > 1, got {self.clip_ratio_c}; None turns it off")
        if self.log_ratio_cap is not None and not self.log_ratio_cap > 0:
            raise ValueError(f"log_ratio_cap must be > 0, got {self.log_ratio_cap}; None turns it off")
        for lo, hi in (("mis_low", "mis_high"), ("icepop_low", "icepop_high")):
            if not 0 <= getattr(self, lo) <= getattr(self, hi):
                raise ValueError(
                    f"{lo} <= {hi} (a band [a, b] with a >= 0), got {getattr(self, lo)}, {getattr(self, hi)}"
                )
        for name, table in self.choice_tables().items():
            table.check(getattr(self, name))

    def choices(self) -> dict[str, str]:
        return {f.name: str(getattr(self, f.name)) for f in fields(self) if f.name in CHOICES}

    def choice_tables(self) -> dict[str, Choices]:
        """Config field -> the registry its value must be in (a family whose module computes a field itself, e.g.
        the actor-critic's advantage=gae, leaves that field out)."""
        return choice_tables()


def choice_tables() -> dict[str, Choices]:
    """Config field -> its registry (the tables are defined below; an algorithm file may have extended them)."""
    return {
        "advantage": ADVANTAGES,
        "adv_scale": ADV_SCALES,
        "ratio": RATIOS,
        "trust_region": TRUST_REGIONS,
        "is_correction": CORRECTIONS,
        "loss_agg": L.AGGREGATIONS,
    }


# ---- advantages: (rewards [B], token_rewards [B, T], mask [B, T], G, cfg, baseline [B] | None,
#      step ends [B, T] | None) -> [B] or [B, T] ----
ADV_SCALES = Choices(
    "adv_scale",
    "bench.rl.objective.ADV_SCALES",
    {  # (rewards [B], G, cfg) -> the group-centred reward divided by the scale
        "none": lambda r, G, cfg: L.group_advantages(r, G, "none", cfg.adv_eps, cfg.adv_std_unbiased),
        "group_std": lambda r, G, cfg: L.group_advantages(r, G, "std", cfg.adv_eps, cfg.adv_std_unbiased),
        "batch_std": lambda r, G, cfg: (
            L.group_advantages(r, G, "none")
            / ((r.std(unbiased=cfg.adv_std_unbiased) if r.numel() > 1 else r.new_zeros(())) + cfg.adv_eps)
        ),
    },
)


def _group(r, tr, m, G, cfg, base, steps):
    return ADV_SCALES[cfg.adv_scale](r, G, cfg)


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


ADVANTAGES = Choices(
    "advantage",
    "bench.rl.objective.ADVANTAGES",
    {
        "none": lambda r, tr, m, G, cfg, base, steps: r,
        "batch_mean": lambda r, tr, m, G, cfg, base, steps: r - r.mean(),
        "rloo": lambda r, tr, m, G, cfg, base, steps: L.rloo_advantages(r, G),
        "group": _group,
        "gpg": _gpg,
        "reinforce_pp": _reinforce_pp,
        "reinforce_pp_baseline": _reinforce_pp_baseline,
        "greedy_baseline": lambda r, tr, m, G, cfg, base, steps: r - base,
        "process": _process,
    },
)


def advantages(
    cfg: PolicyGradientConfig, rewards, token_rewards, mask, group_size, baseline=None, steps=None
) -> torch.Tensor:
    return ADVANTAGES[cfg.advantage](rewards, token_rewards, mask, group_size, cfg, baseline, steps)


# ---- behaviour corrections: (log π_old [B, T], log μ [B, T], mask [B, T], cfg) -> weight [B, T], constant in θ ----
CORRECTIONS = Choices(
    "is_correction",
    "bench.rl.objective.CORRECTIONS",
    {
        "none": lambda old, mu, m, cfg: torch.ones_like(old),
        "tis": lambda old, mu, m, cfg: L.token_tis(old, mu, m, cfg.tis_cap),
        "seq_tis": lambda old, mu, m, cfg: L.sequence_tis(old, mu, m, cfg.seq_tis_cap),
        "seq_mask": lambda old, mu, m, cfg: L.sequence_masked_is(old, mu, m, cfg.mis_low, cfg.mis_high),
        "icepop": lambda old, mu, m, cfg: L.icepop(old, mu, m, cfg.icepop_low, cfg.icepop_high),
        # the unclipped surrogate against μ with the extreme tokens masked: w = M·π_old/μ times ρ = π_θ/π_old
        "m2po": lambda old, mu, m, cfg: L.m2po_mask(old, mu, m, cfg.m2_threshold) * L.token_ratio(old, mu, m),
    },
)


# Corrections whose weight on a row reads that row alone (so they can be computed micro-batch by micro-batch); M2PO's
# mask is chosen over the whole step.
for _name in ("none", "tis", "seq_tis", "seq_mask", "icepop"):
    CORRECTIONS[_name].row_local = True


def behaviour_weights(cfg: PolicyGradientConfig, old_logp, sampler_logp, mask) -> tuple[torch.Tensor, dict]:
    """The correction's per-token weight and what it did: its mean, the share of tokens it zeroes, and the measured
    mismatch (a k1 estimate of KL(μ || π_old) from μ's own samples, and the largest |log π_old − log μ|)."""
    w = CORRECTIONS[cfg.is_correction](old_logp, sampler_logp, mask, cfg)
    m = mask.bool()
    stats = {
        "rollout/is_weight_mean": L.masked_mean(w, mask),
        "rollout/is_zeroed_frac": L.masked_mean((w == 0).float(), mask),
        "rollout/mismatch_kl": L.masked_mean(sampler_logp - old_logp, mask),
        "rollout/mismatch_logp_max": torch.where(m, (old_logp - sampler_logp).abs(), 0.0).max() if m.any() else 0.0,
    }
    return w, stats


# ---- the surrogate ---------------------------------------------------------------------------------------------
RATIOS = Choices(
    "ratio",
    "bench.rl.objective.RATIOS",
    {  # (log π_θ [B, T], log π_old [B, T], mask [B, T]) -> ρ [B, T]
        "none": lambda logp, old, m: L.token_ratio(logp.detach(), old, m),  # plain log π; the ratio is logged only
        "token": L.token_ratio,
        "sequence": lambda logp, old, m: L.sequence_ratio(logp, old, m).unsqueeze(-1).expand_as(logp),
        "sequence_token": L.sequence_token_ratio,
        "sequence_mean": lambda logp, old, m: L.sequence_mean_ratio(logp, old, m).unsqueeze(-1).expand_as(logp),
    },
)


@dataclass
class Tokens:
    """What a trust region may read besides ρ and A: log π_θ (with gradient), log π_old, the sampler's log μ, the loss
    mask, and a generator for any random choice (seeded by run, step and micro-batch)."""

    logp: torch.Tensor
    old_logp: torch.Tensor
    sampler_logp: torch.Tensor
    mask: torch.Tensor
    generator: torch.Generator | None = None


def _clip(ratio, adv, cfg, tok):
    objective, clipped = L.clipped_surrogate(ratio, adv, cfg.clip_eps_low, cfg.clip_eps_high)
    if cfg.clip_ratio_c is not None:
        objective, bounded = L.dual_clip(objective, adv, cfg.clip_ratio_c)
        clipped = clipped | bounded
    return objective, clipped


def _clip_cov(ratio, adv, cfg, tok):
    """Clip-Cov (Cui et al. 2025): the clipped surrogate, with a random few high-covariance tokens detached."""
    objective, clipped = _clip(ratio, adv, cfg, tok)
    cov = L.covariance(adv, tok.logp, tok.mask)
    gen = tok.generator or torch.Generator().manual_seed(0)  # a pure function unless the caller seeds the choice
    keep = L.clip_cov_keep(cov, clipped, tok.mask, cfg.clip_cov_ratio, cfg.clip_cov_lb, cfg.clip_cov_ub, gen)
    return objective * keep, clipped | (keep == 0)


def _kl_cov(ratio, adv, cfg, tok):
    """KL-Cov (Cui et al. 2025): the unclipped ρA, minus λ·|log π_θ − log π_old| on the top-k tokens by Cov_t."""
    chosen = L.kl_cov_select(L.covariance(adv, tok.logp.detach(), tok.mask), tok.mask, cfg.kl_cov_ratio)
    penalty = cfg.kl_cov_coef * (tok.logp - tok.old_logp).abs()
    return ratio * adv - torch.where(chosen, penalty, torch.zeros_like(penalty)), torch.zeros_like(chosen)


def _minirl(ratio, adv, cfg, tok):
    """MiniRL (Zheng et al. 2025, as re-implemented in sail-sg/Stable-RL): A·sg[min(π_θ/μ, C)]·M·log π_θ, M = 0 where
    ρ = π_θ/π_old has left [1 − ε_low, 1 + ε_high] in the advantage's direction."""
    w = L.token_ratio(tok.logp.detach(), tok.sampler_logp, tok.mask).clamp(max=cfg.minirl_is_cap)
    r = ratio.detach()
    out = ((adv > 0) & (r > 1.0 + cfg.clip_eps_high)) | ((adv < 0) & (r < 1.0 - cfg.clip_eps_low))
    return torch.where(out, torch.zeros_like(adv), w * adv * tok.logp), out


# A trust region whose value on a row depends on the micro-batch's other rows (a covariance over it) says so; the module
# then never skips zero-advantage rows (train.skip_zero_adv), which would change those statistics.
_clip_cov.row_coupled = _kl_cov.row_coupled = True
_clip_cov.draws = True  # reads tok.generator: the module seeds one per micro-batch

TRUST_REGIONS = Choices(
    "trust_region",
    "bench.rl.objective.TRUST_REGIONS",
    {  # (ρ [B, T], A [B, T], cfg, Tokens) -> (objective to maximise [B, T], tokens whose gradient is cut [B, T] bool)
        "none": lambda ratio, adv, cfg, tok: (ratio * adv, torch.zeros_like(adv, dtype=torch.bool)),
        "clip": _clip,
        "sapo": lambda ratio, adv, cfg, tok: (
            L.sapo_gate(ratio, adv, cfg.sapo_tau_pos, cfg.sapo_tau_neg),
            torch.zeros_like(adv, dtype=torch.bool),
        ),
        "cispo": lambda ratio, adv, cfg, tok: L.cispo_objective(
            tok.logp, ratio, adv, cfg.clip_eps_low, cfg.clip_eps_high
        ),
        "gmpo": lambda ratio, adv, cfg, tok: L.gmpo_objective(
            tok.logp, tok.old_logp, adv, tok.mask, cfg.gmpo_clip, cfg.gmpo_clip
        ),
        "clip_cov": _clip_cov,
        "kl_cov": _kl_cov,
        "minirl": _minirl,
    },
)


def policy_loss(
    logp,
    old_logp,
    adv,
    mask,
    cfg: PolicyGradientConfig,
    norm: L.Norm,
    ref_logp=None,
    *,
    is_weight=None,
    sampler_logp=None,
    groups=None,
    generator=None,
):
    """ℒ_{i,t} = −w_{i,t}·TR(ρ_{i,t}, A_{i,t}) [+ β·KL_{i,t}], aggregated by ``cfg.loss_agg`` with the step's
    denominators; w is the behaviour correction (``is_weight``, 1 when None).

    logp, old_logp, mask, ref_logp, is_weight, sampler_logp: [B, T]; adv: [B] (sequence) or [B, T] (token);
    groups [B]: each row's prompt (prompt-mean aggregation). ``sampler_logp`` None: μ = π_old (no mismatch).
    """
    adv = adv.unsqueeze(-1).expand_as(logp) if adv.dim() == 1 else adv  # [B, T]
    logp_r = logp  # what the ratio is formed from: log π_θ − log π_old clamped to ±cap (no gradient where clamped)
    if cfg.log_ratio_cap is not None:
        cap = cfg.log_ratio_cap
        logp_r = old_logp + torch.where(mask.bool(), logp - old_logp, torch.zeros_like(logp)).clamp(-cap, cap)
    ratio = RATIOS[cfg.ratio](logp_r, old_logp, mask)
    if cfg.ratio == "none":
        objective, clipped = adv * logp, torch.zeros_like(mask, dtype=torch.bool)  # plain log-prob surrogate
    else:
        tok = Tokens(logp, old_logp, old_logp if sampler_logp is None else sampler_logp, mask, generator)
        objective, clipped = TRUST_REGIONS[cfg.trust_region](ratio, adv, cfg, tok)
    per_token = -objective if is_weight is None else -objective * is_weight
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
    loss = L.agg_loss(per_token, mask, cfg.loss_agg, norm, groups)
    own = L.Norm.of(mask, norm.budget, groups) if groups is not None else L.Norm.of(mask, norm.budget)
    stats["loss/policy"] = L.agg_loss(-objective, mask, cfg.loss_agg, own, groups).detach()
    return loss, stats


class PolicyGradient(RLModule):
    """The critic-free family's LightningModule: every hook is driven by the config's choices. An algorithm file
    subclasses it with its config (the paper's defaults) and writes nothing else unless its paper needs it."""

    Config = PolicyGradientConfig
    multi_turn = True  # the family reads scores, the loss mask and step rewards (files that read more set False)
    reads_behaviour_weights: bool = True
    """Whether ``loss`` applies ``rows["is_weight"]`` (an algorithm with its own surrogate that does not sets False,
    and a correction other than none is then refused at start-up rather than ignored)."""

    def __init__(self, cfg, policy, tokenizer, task):
        super().__init__(cfg, policy, tokenizer, task)
        if self.acfg.is_correction != "none" and not self.reads_behaviour_weights:
            raise ValueError(
                f"algorithm.is_correction={self.acfg.is_correction!r}: {type(self).__name__}'s loss has its own "
                "surrogate and does not apply behaviour weights; use is_correction=none or a policy_loss-based one"
            )

    @property
    def needs_reference(self) -> bool:
        return self.acfg.beta > 0 and self.acfg.kl_placement != "none"

    @property
    def zero_adv_rows_inert(self) -> bool:
        if getattr(TRUST_REGIONS[self.acfg.trust_region], "row_coupled", False):
            return False
        return not self.needs_reference or self.acfg.kl_placement != "loss"  # policy_loss is A·f(ρ) + β·KL

    @property
    def needs_greedy_baseline(self) -> bool:
        return self.acfg.advantage == "greedy_baseline"

    @property
    def max_sampling_rounds(self) -> int:
        return self.acfg.max_sampling_rounds if self.acfg.dynamic_sampling else 1

    def distributed_blockers(self, world: int) -> list[str]:
        out = super().distributed_blockers(world)
        if getattr(TRUST_REGIONS[self.acfg.trust_region], "row_coupled", False):
            out.append(f"trust_region={self.acfg.trust_region} selects tokens by a covariance over each micro-batch "
                       "(the authors' and verl's rule); across ranks that selection is not reduced yet.")  # fmt: skip
        return out

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
            ro.train_mask,  # episodes: the policy's tokens only (the environment's are never rewarded or trained)
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

    @property
    def reads_old_logp_before_update(self) -> bool:
        kl_in_reward = self.acfg.kl_placement == "reward" and self.acfg.beta > 0  # shape_rewards reads π_old
        return kl_in_reward or not getattr(CORRECTIONS[self.acfg.is_correction], "row_local", False)

    def correct_behaviour(self, ro: Rollout) -> None:
        """The correction's weights, and the measured mismatch whenever the sampler is not the learner."""
        if ro.old_logp is None:  # deferred to the update's forward (behaviour_rows)
            return
        if self.acfg.is_correction != "none" or not self.behaviour.is_policy:
            w, stats = behaviour_weights(self.acfg, ro.old_logp, ro.sampler_logp, ro.train_mask)
            ro.is_weight = None if self.acfg.is_correction == "none" else w
            self.step_stats.update(stats)

    def behaviour_rows(self, rows):
        if self.acfg.is_correction == "none" and self.behaviour.is_policy:
            return {}
        w, stats = behaviour_weights(self.acfg, rows["old_logp"], rows["sampler_logp"], rows["mask"])
        if self.acfg.is_correction != "none":
            rows["is_weight"] = w
        return {k: float(v) for k, v in stats.items()}  # NOTE: per micro-batch, token-weighted (the max too)

    def loss(self, rows, logp, norm):
        self.loss_calls += 1  # seeds the random choices of a trust region (Clip-Cov) per micro-batch
        gen = None
        if getattr(TRUST_REGIONS[self.acfg.trust_region], "draws", False):
            gen = torch.Generator().manual_seed(sample_seed(self.cfg.seed, self.step_count, "loss", self.loss_calls))
        return policy_loss(
            logp,
            rows["old_logp"],
            rows["adv"],
            rows["mask"],
            self.acfg,
            norm,
            rows.get("ref_logp"),
            is_weight=rows.get("is_weight"),
            sampler_logp=rows["sampler_logp"],
            groups=rows["group"],
            generator=gen,
        )


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
