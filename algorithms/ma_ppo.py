"""MA-PPO: PPO over macro actions (MA-RLHF, Chai et al., ICLR 2025, arXiv 2410.02743, §3: macro-action MDP,
termination rules, macro-level GAE and clipped objective), as in the authors' code (ernie-research/MA-RLHF,
DeepSpeed-Chat ``ppo_trainer.py``); the formulas below follow that code (the paper's equation numbers were not
checked against the PDF).

Each completion is cut into macro actions ω_1..ω_K by a termination rule (fixed n-gram, randomised n-gram,
perplexity rises, or the task's segmenter); the final token is always a macro of its own and holds the score.

    r_t  = −β·(log π_old(y_t) − log π_ref(y_t)) + 1[t = L]·clip(score, ±c)          (per-token reward, β 0.05, c 2.5)
    r_k  = Σ_{t∈ω_k} σ_t r_t;   V_k = Σ_{t∈ω_k} σ_t V_old(s_t)        (σ: equal = 1/|ω_k|, unit, position)
    Â_k  = GAE over macro steps k (γ = 1, λ = 0.95, no whitening);   R̂_k = Â_k + V_k
    ℒ    = token-mean[ −C(ρ_t, Â_{k(t)}; 0.2, 0.2) ]
         + token-mean[ ½ max((V_t − R̂_{k(t)})², (clip(V_t, V_old,t ± 0.2) − R̂_{k(t)})²) ]   (value factor 0.5)

ρ_t is the per-token ratio (the authors' code); the paper's macro-level ratio is offered as ratio=macro_product
(Π_{t∈ω} ρ_t) and ratio=macro_geomean (its |ω|-th root), each token then carrying its macro's ratio.
With n = 1 every token is its own macro and MA-PPO is PPO without whitening (tests/test_value_credit.py).
Reference: ../shared/docs/algorithms.md ("Fine-grained credit", MA-PPO, [primary: authors' code]).

Deviations from the paper
# NOTE(deviation): termination=random draws each macro's length i.i.d. from random_lengths (seeded by run seed and
#   step); the authors shuffle a list holding each length repeat_times times and make the rest one long macro.
# NOTE(deviation): termination=perplexity starts a macro at the token whose perplexity rises (ppl_t > ppl_{t−1});
#   the authors' code starts it one token earlier. It uses π_ref when the run has one (β > 0), else π_old.
# NOTE(deviation): termination=task uses the task's own segmenter (Task.segment: e.g. SQL clauses, math steps)
#   in place of the paper's constituency-parse chunks.
# NOTE(deviation): the critic is a value head on the policy trunk (critic=head), not a separate value model
#   initialised from a reward model (see algorithms/ppo.py); critic=model gives a separate trunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

import torch

from algorithms.ppo import PPO, PPOConfig
from bench.engine.rollout import Rollout, sample_seed
from bench.rl import losses as L
from bench.rl import segment as S
from bench.rl.value import clipped_value_loss, gae
from bench.task import Task

Termination = Literal["fixed", "random", "perplexity", "task"]
MacroRatio = Literal["token", "macro_product", "macro_geomean"]
MA_CHOICES = ("termination", "macro_weight")


@dataclass
class MAPPOConfig(PPOConfig):
    name: str = "ma_ppo"
    ratio: MacroRatio = "token"
    """ρ per token (authors' code) | Π_{t∈ω} ρ_t (the paper's macro ratio) | (Π_{t∈ω} ρ_t)^{1/|ω|}"""
    whiten_adv: bool = False
    """the authors' code does not whiten Â"""
    termination: Termination = "fixed"
    """ζ: the termination rule of a macro action"""
    ngram: int = 5
    """n of the fixed n-gram rule (the paper's main runs: 5)"""
    random_lengths: list[int] = field(default_factory=lambda: [1, 2, 3, 5, 10])
    """lengths of the randomised n-gram rule"""
    macro_weight: S.MacroWeight = "equal"
    """σ of the macro reward and value: equal (mean), unit (last token), position (1/(j+1), normalised)"""

    def __post_init__(self):
        super().__post_init__()
        if self.ngram < 1 or not self.random_lengths or min(self.random_lengths) < 1:
            raise ValueError(f"ngram and random_lengths must be >= 1: {self.ngram}, {self.random_lengths}")

    def choices(self) -> dict[str, str]:
        extra = {f.name: str(getattr(self, f.name)) for f in fields(self) if f.name in MA_CHOICES}
        return {**super().choices(), **extra}

    def choice_tables(self):
        return {k: v for k, v in super().choice_tables().items() if k != "ratio"}  # macro ratios: RATIOS below


# ---- termination rules: (module, rollout) -> starts [B, T] bool -----------------------------------------------------
TERMINATIONS = {
    "fixed": lambda m, ro: S.fixed_ngram_starts(ro.mask, m.acfg.ngram),
    "random": lambda m, ro: S.random_ngram_starts(
        ro.mask, m.acfg.random_lengths, torch.Generator().manual_seed(sample_seed(m.cfg.seed, m.step_count, "macros"))
    ),
    "perplexity": lambda m, ro: S.perplexity_starts(ro.old_logp if ro.ref_logp is None else ro.ref_logp, ro.mask),
    "task": lambda m, ro: S.task_starts(ro.texts, ro.completion_ids, ro.mask, m.decode_ids, m.task.segment),
}


def macro_gae(token_rewards, values, index, cfg: MAPPOConfig):
    """Per-token rewards and V_old [B, T], macro index [B, T] -> (Â, R̂) [B, T]: σ-weighted macro rewards and values,
    GAE over macro steps, each token carrying its macro's advantage and return."""
    r = S.macro_reduce(token_rewards, index, cfg.macro_weight)  # [B, K]
    v = S.macro_reduce(values, index, cfg.macro_weight)  # [B, K]
    adv, returns = gae(r, v, S.macro_mask(index), cfg.gamma, cfg.lam)
    return S.macro_expand(adv, index), S.macro_expand(returns, index)


def _macro_ratio(reduce):
    def ratio(logp, old_logp, mask, index):
        log_ratio = torch.where(mask.bool(), logp - old_logp, torch.zeros_like(logp))
        return torch.exp(S.macro_expand(reduce(log_ratio, index), index))

    return ratio


RATIOS = {
    "token": lambda logp, old_logp, mask, index: L.token_ratio(logp, old_logp, mask),
    "macro_product": _macro_ratio(S.macro_sum),
    "macro_geomean": _macro_ratio(lambda x, index: S.macro_reduce(x, index, "equal")),
}


def ma_ppo_loss(logp, old_logp, adv, values, old_values, returns, index, mask, cfg: MAPPOConfig, norm):
    """Clipped surrogate with each token's macro advantage + c_V·clipped value loss to the macro return; [B, T]."""
    ratio = RATIOS[cfg.ratio](logp, old_logp, mask, index)  # [B, T]
    surrogate, clipped = L.clipped_surrogate(ratio, adv, cfg.clip_eps_low, cfg.clip_eps_high)
    pg = L.agg_loss(-surrogate, mask, cfg.loss_agg, norm)
    vf, stats = clipped_value_loss(values, old_values, returns, mask, cfg.value_clip, norm)
    stats["stats/clip_frac"] = L.masked_mean(clipped.float(), mask).detach()
    stats["stats/ratio_mean"] = L.masked_mean(ratio.detach(), mask)
    stats["loss/policy"] = L.agg_loss(-surrogate, mask, cfg.loss_agg, L.Norm.of(mask, norm.budget)).detach()
    return pg + cfg.vf_coef * vf, stats


class MAPPO(PPO):
    Config = MAPPOConfig
    reads_behaviour_weights = False  # its own surrogate (below)
    description = "MA-PPO / MA-RLHF (Chai et al. 2025): PPO over macro actions (n-gram, random, perplexity, task)"

    def __init__(self, cfg, policy, tokenizer, task):
        super().__init__(cfg, policy, tokenizer, task)
        if self.acfg.termination == "task" and type(task).segment is Task.segment:
            raise ValueError(f"algorithm.termination=task: task {type(task).__name__} has no segmenter (Task.segment)")

    def decode_ids(self, ids: list[int]) -> str:
        """The decoding that produced ``ro.texts`` (PolicyModule.decode), for one row's token ids."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def advantages(self, ro: Rollout):
        ro.macro_index = S.macro_index(TERMINATIONS[self.acfg.termination](self, ro), ro.mask)
        adv, ro.returns = macro_gae(ro.token_rewards, ro.values, ro.macro_index, self.acfg)
        self.value_stats(ro)
        K = S.num_macros(ro.macro_index).float()
        self.step_stats["stats/macros_per_sample"] = float(K.mean())
        self.step_stats["stats/macro_len_mean"] = float(ro.mask.sum() / K.sum().clamp(min=1))
        return L.whiten(adv, ro.train_mask) if self.acfg.whiten_adv else adv

    def loss(self, rows, logp, norm):
        values = self.critic.train_values(rows)
        args = (rows["values"], rows["returns"], rows["macro_index"], rows["mask"])
        return ma_ppo_loss(logp, rows["old_logp"], rows["adv"], values, *args, self.acfg, norm)
