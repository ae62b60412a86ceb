"""GSPO-token (Zheng et al. 2025, arXiv 2507.18071, Eq. 13-14).

    s_{i,t}(θ) = sg[s_i(θ)] · π_θ(y_{i,t}) / sg[π_θ(y_{i,t})]
    ℒ = 1/G Σ_i 1/|y_i| Σ_t −min(s_{i,t} Â_{i,t}, clip(s_{i,t}, 1−ε_l, 1+ε_h) Â_{i,t})

The value of the sequence ratio with a token's gradient: token-level advantages under a sequence-level trust region;
equal to GSPO when Â is constant within a sequence. Choices: as GSPO with ratio=sequence_token.
Reference: ../shared/docs/algorithms.md (GSPO-token, [framework]).

Deviations from the paper
# NOTE(deviation): as GSPO (4 minibatches per rollout in conf/algorithm/gspo_token.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass

from algorithms.gspo import GSPOConfig
from bench.rl.objective import PolicyGradient, Ratio


@dataclass
class GSPOTokenConfig(GSPOConfig):
    """GSPO's choices with the token-gradient ratio."""

    name: str = "gspo_token"
    ratio: Ratio = "sequence_token"
    """s_{i,t}, Eq. 14"""


class GSPOToken(PolicyGradient):
    Config = GSPOTokenConfig
    description = "GSPO-token (Zheng et al. 2025): sequence-ratio value, token gradient"
