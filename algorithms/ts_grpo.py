"""TS-GRPO: two-span GRPO from Thinkquel (arXiv 2510.00186, as summarised from the first author's code in
../shared/docs/algorithms.md).

A completion splits into the answer span M_seq (the task's ``answer_span``: the first ```sql block for text-to-SQL)
and the planning span M_tok (the other tokens). Two rewards, each z-scored in the group with the population std: the
answer reward gives A^seq_i, a planning reward A^tok_i.

    A_{i,t}  = A^seq_i·M_seq + α_aux·A^tok_i·M_tok
    s_{i,t}  = sg[s_i]·π_θ(y_t)/sg[π_θ(y_t)],  s_i = exp(mean_{t∈M_seq} ℓ_{i,t})     (GSPO-token over the answer only)
    ρ_{i,t}  = exp(ℓ_{i,t})                                                          (planning: the token ratio)
    L_seq = 1/B Σ_i 1/|M_seq,i| Σ_{t∈M_seq} −C(s_{i,t}, A_{i,t}; ε^a_low, ε^a_high)
    L_tok = 1/B Σ_i 1/|M_tok,i| Σ_{t∈M_tok} −C(ρ_{i,t}, A_{i,t}; ε_low, ε_high)
    ℒ = α_seq·L_seq + α_tok·L_tok

With an empty answer span this is token-level GRPO (clip 0.2 / 0.28, no KL); with an all-answer span, GSPO-token.
α_aux = 1, α_seq = 2, α_tok = 1; answer clip 0.28 / 0.25, planning clip 0.2 / 0.28.
Reference: ../shared/docs/algorithms.md (TS-GRPO, [primary: first author's code]).

Deviations from the paper
# NOTE(deviation): the planning reward is not public: ``planning_reward`` defaults to the answer reward ("answer") and
#   may name any reward component the task logs (e.g. "format", "parses").
# NOTE(deviation): a completion without an answer span is all answer (``no_span=answer``, pure GSPO, as the authors
#   do) or all planning (``no_span=planning``). Token positions come from decoding prefixes (bench/rl/credit.py).
# NOTE(deviation): the answer clip is read as ε_low = 0.28, ε_high = 0.25 (the authors' config comment suggests
#   0.05-0.15); both losses divide by the optimizer step's B, so a row without tokens in a span adds 0 to that span.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from bench.rl import losses as L
from bench.rl.credit import span_token_mask
from bench.rl.losses import AggMode
from bench.rl.objective import (
    Advantage,
    AdvScale,
    KLPlacement,
    PolicyGradient,
    PolicyGradientConfig,
    Ratio,
    TrustRegion,
    advantages,
)


@dataclass
class TSGRPOConfig(PolicyGradientConfig):
    name: str = "ts_grpo"
    advantage: Advantage = "group"
    adv_scale: AdvScale = "group_std"
    adv_std_unbiased: bool = False
    """Population std for both z-scores."""
    ratio: Ratio = "token"
    """Planning span: ρ_{i,t}; the answer span always uses GSPO-token over its own tokens."""
    trust_region: TrustRegion = "clip"
    clip_eps_low: float = 0.2
    """Planning span ε_low."""
    clip_eps_high: float = 0.28
    """Planning span ε_high."""
    answer_clip_low: float = 0.28
    """Answer span ε_low."""
    answer_clip_high: float = 0.25
    """Answer span ε_high."""
    loss_agg: AggMode = "seq-mean-token-mean"
    kl_placement: KLPlacement = "none"
    beta: float = 0.0
    alpha_seq: float = 2.0
    """α_seq: weight of the answer-span loss."""
    alpha_tok: float = 1.0
    """α_tok: weight of the planning-span loss."""
    alpha_aux: float = 1.0
    """α_aux: weight of the planning advantage A^tok."""
    planning_reward: str = "answer"
    """Reward behind A^tok: "answer" (the answer reward) or the name of a task reward component."""
    no_span: Literal["answer", "planning"] = "answer"
    """A completion without an answer span is all answer (pure GSPO) or all planning."""

    def __post_init__(self):
        super().__post_init__()
        if self.ratio != "token" or self.trust_region != "clip":
            raise ValueError("ts_grpo writes its loss out: the planning span needs ratio=token and trust_region=clip")
        if self.kl_placement == "loss" and self.beta > 0:
            raise ValueError("ts_grpo has no KL term in its loss: use kl_placement=reward or beta=0")

    def choices(self) -> dict[str, str]:
        return {**super().choices(), "planning_reward": self.planning_reward, "no_span": self.no_span}


def ts_grpo_advantages(a_seq, a_tok, answer_mask, cfg: TSGRPOConfig) -> torch.Tensor:
    """[B], [B], [B, T] -> [B, T]: A^seq on answer tokens, α_aux·A^tok on planning tokens."""
    return a_seq.unsqueeze(-1) * answer_mask + cfg.alpha_aux * a_tok.unsqueeze(-1) * (1 - answer_mask)


def ts_grpo_loss(logp, old_logp, adv, answer_mask, mask, cfg: TSGRPOConfig, norm: L.Norm):
    """ℒ = α_seq·L_seq + α_tok·L_tok; all inputs [B, T]. Returns (loss, stats)."""
    m_seq, m_tok = mask * answer_mask, mask * (1 - answer_mask)
    s = L.sequence_token_ratio(logp, old_logp, m_seq)  # value exp(mean over the answer), gradient of a token ratio
    c_seq, clip_seq = L.clipped_surrogate(s, adv, cfg.answer_clip_low, cfg.answer_clip_high)
    rho = L.token_ratio(logp, old_logp, m_tok)
    c_tok, clip_tok = L.clipped_surrogate(rho, adv, cfg.clip_eps_low, cfg.clip_eps_high)
    loss_seq = L.agg_loss(-c_seq, m_seq, cfg.loss_agg, norm)
    loss_tok = L.agg_loss(-c_tok, m_tok, cfg.loss_agg, norm)
    loss = cfg.alpha_seq * loss_seq + cfg.alpha_tok * loss_tok
    clipped = torch.where(answer_mask.bool(), clip_seq, clip_tok)
    stats = {
        "loss/answer": loss_seq.detach(),
        "loss/planning": loss_tok.detach(),
        "loss/policy": loss.detach(),
        "stats/clip_frac": L.masked_mean(clipped.float(), mask).detach(),
        "stats/ratio_mean": L.masked_mean(torch.where(answer_mask.bool(), s, rho).detach(), mask),
    }
    return loss, stats


class TSGRPO(PolicyGradient):
    Config = TSGRPOConfig
    multi_turn = False  # it reads the task's answer span
    reads_behaviour_weights = False  # its own surrogate (below)
    description = "TS-GRPO (Thinkquel 2025): GSPO-token on the answer span, token GRPO on the planning span"

    def planning_rewards(self, ro) -> torch.Tensor:
        name = self.acfg.planning_reward
        if name == "answer":
            return ro.rewards
        if name not in ro.components:
            raise KeyError(f"planning_reward={name!r}: not a reward component; have {sorted(ro.components)}")
        return ro.components[name].to(ro.rewards)

    def advantages(self, ro):
        cfg, G = self.acfg, ro.group_size
        spans = [self.task.answer_span(text) for text in ro.texts]
        missing = 1.0 if cfg.no_span == "answer" else 0.0
        ro.answer_mask = span_token_mask(self.tokenizer, ro.completion_ids, ro.mask, spans, missing)
        a_seq = advantages(cfg, ro.rewards, None, ro.train_mask, G)  # [B]
        a_tok = advantages(cfg, self.planning_rewards(ro), None, ro.train_mask, G)  # [B]
        self.step_stats["stats/answer_token_frac"] = float(L.masked_mean(ro.answer_mask, ro.train_mask))
        return ts_grpo_advantages(a_seq, a_tok, ro.answer_mask, cfg)

    def loss(self, rows, logp, norm):
        return ts_grpo_loss(logp, rows["old_logp"], rows["adv"], rows["answer_mask"], rows["mask"], self.acfg, norm)
