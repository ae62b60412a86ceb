"""Actor-critic machinery: a critic V(s_t) for every completion token, GAE, the clipped value loss, and the
``ActorCritic`` base module that PPO-style algorithms subclass (algorithms/ppo.py, algorithms/ma_ppo.py).

    δ_t = r_t + γ V(s_{t+1}) − V(s_t)          (V = 0 after the last generated token: the episode ends there)
    Â_t = Σ_l (γλ)^l δ_{t+l}                    (GAE, Schulman et al. 2016, Eq. 16)
    R̂_t = Â_t + V_old(s_t)                      (value targets)
    ℒ_V = ½ max((V − R̂)², (clip(V, V_old − ε_V, V_old + ε_V) − R̂)²)   (PPO2's clipped value loss)

The critic is either a scalar head on the policy's trunk (``critic=head``: shares the transformer, one extra
Linear) or a separate copy of the trunk with its own head (``critic=model``); either way it is a submodule of the
LightningModule, so it is saved and restored with the checkpoint, and it is not part of the policy, so generation,
evaluation and the exported HF policy are unchanged. Its parameters form their own optimizer group (``critic_lr``).
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass, fields
from typing import Literal

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from bench.engine.policy import position_ids
from bench.engine.rollout import Rollout
from bench.rl import losses as L
from bench.rl.objective import PolicyGradient, PolicyGradientConfig

CriticKind = Literal["head", "model"]
ACTOR_CRITIC_CHOICES = ("critic", "whiten_adv")


# ---- GAE --------------------------------------------------------------------------------------------------------
def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float):
    """GAE over right-padded steps (tokens or macro actions): rewards, values, mask [B, N] -> (Â, R̂) [B, N], 0 on
    padding. Vectorised: Â = δ·Dᵀ with the discount matrix D[t, s] = (γλ)^{s−t} for s ≥ t (one [N, N] matrix
    shared by the batch; memory O(N²))."""
    m = mask.bool()
    zero = torch.zeros_like(values)
    v = torch.where(m, values, zero)  # where(), not *mask: a non-finite value on padding must not leak
    next_v = torch.cat([v[:, 1:], zero[:, :1]], dim=1)  # V(s_{t+1}); 0 past the last step
    delta = torch.where(m, torch.where(m, rewards, zero) + gamma * next_v - v, zero)  # [B, N]
    N = delta.shape[1]
    t = torch.arange(N, device=delta.device)
    gap = t.unsqueeze(0) - t.unsqueeze(1)  # [N, N]: s − t
    decay = torch.tensor(gamma * lam, dtype=delta.dtype, device=delta.device)
    D = torch.where(gap >= 0, decay.pow(gap.clamp(min=0)), 0.0)
    adv = torch.where(m, delta @ D.T, zero)  # [B, N]
    return adv, torch.where(m, adv + v, zero)


def gae_reference(rewards, values, mask, gamma: float, lam: float):
    """The slow reference: the textbook reversed loop, per row, in plain Python floats (tests only)."""
    B, N = len(rewards), len(rewards[0])
    adv = [[0.0] * N for _ in range(B)]
    ret = [[0.0] * N for _ in range(B)]
    for b in range(B):
        n = int(sum(float(x) for x in mask[b]))
        last = 0.0
        for t in reversed(range(n)):
            next_v = float(values[b][t + 1]) if t + 1 < n else 0.0
            delta = float(rewards[b][t]) + gamma * next_v - float(values[b][t])
            last = delta + gamma * lam * last
            adv[b][t] = last
            ret[b][t] = last + float(values[b][t])
    return adv, ret


# ---- value loss and diagnostics -----------------------------------------------------------------------------------
def clipped_value_loss(values, old_values, returns, mask, clip: float | None, norm: L.Norm):
    """½ max((V − R̂)², (clip(V, V_old ± ε_V) − R̂)²), token-mean over the step ([B, T] each) -> (loss, stats).
    ``clip=None``: the plain ½(V − R̂)². A non-finite value or return at a masked (padded) position is replaced before
    any arithmetic, not after: where() after the square would pass a finite loss but a NaN gradient (0 · ∂NaN²)."""
    m = mask.bool()
    values, old_values, returns = (torch.where(m, x, torch.zeros_like(x)) for x in (values, old_values, returns))
    unclipped = (values - returns).square()
    if clip is None:
        per_token, was_clipped = unclipped, torch.zeros_like(mask, dtype=torch.bool)
    else:
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (v_clipped - returns).square()
        per_token, was_clipped = torch.maximum(unclipped, clipped), clipped > unclipped
    loss = L.agg_loss(0.5 * per_token, mask, "token-mean", norm)
    stats = {
        "stats/value_loss": L.agg_loss(0.5 * per_token, mask, "token-mean").detach(),
        "stats/value_clip_frac": L.masked_mean(was_clipped.float(), mask).detach(),
    }
    return loss, stats


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 − Var[R̂ − V] / Var[R̂] over the unmasked entries (1: perfect critic, 0: no better than a constant); NaN,
    which the metric logger drops, when every return is equal."""
    var_r = L.masked_mean((returns - L.masked_mean(returns, mask)).square(), mask)
    err = returns - values
    var_e = L.masked_mean((err - L.masked_mean(err, mask)).square(), mask)
    return float(1.0 - var_e / var_r) if float(var_r) > 0 else float("nan")


# ---- critics ------------------------------------------------------------------------------------------------------
def _trunk(policy: nn.Module) -> nn.Module:
    """The policy's transformer without its LM head (through a peft wrapper when there is one)."""
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    return base.get_decoder()


class _Critic(nn.Module):
    reads_policy_forward = False
    """Whether the update's values come from the policy's own training forward (which must then be one forward over
    prompt + completion)."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.head = nn.Linear(policy.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)  # V ≡ 0 at the start: GAE begins as discounted reward-to-go
        nn.init.zeros_(self.head.bias)

    def trunk(self) -> nn.Module:
        raise NotImplementedError

    def project(self, hidden: torch.Tensor, T: int) -> torch.Tensor:
        """Hidden states [B, S, H] (prompt + completion) -> V(s_t) [B, T]: the position before completion token t."""
        with torch.autocast(hidden.device.type, enabled=False):  # under bf16-mixed too: float32 values and loss
            return self.head(hidden[:, -T - 1 : -1].float()).squeeze(-1)

    def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
        """V(s_t) for every completion token [B, T] from a forward of the critic's trunk (0 on padding)."""
        ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [B, Tp + T]
        attn = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
        hidden = self.trunk()(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn))[0]
        return self.project(hidden, completion_ids.shape[1]) * completion_mask

    def train_values(self, rows: dict[str, torch.Tensor]) -> torch.Tensor:
        """V(s_t) [B, T] with gradient, for the rows whose loss is being computed."""
        return self(rows["prompt_ids"], rows["prompt_mask"], rows["completion_ids"], rows["completion_mask"])


class ValueHead(_Critic):
    """critic=head: a Linear on the policy trunk's last hidden state. In the update the hidden states come from the
    policy's own forward (a forward hook on the trunk keeps the latest output), so the value costs no extra pass."""

    reads_policy_forward = True

    def __init__(self, policy: nn.Module):
        super().__init__(policy)
        self._trunk = [_trunk(policy)]  # a list: not a submodule (the trunk belongs to the policy)
        self._hidden: torch.Tensor | None = None
        me, trunk = weakref.ref(self), weakref.ref(self._trunk[0])

        def keep_hidden(module, args, output):
            # A snapshot of the policy (the reference) copies this hook; it must not write here.
            if module is trunk() and me() is not None:
                me()._hidden = output[0]

        self._trunk[0].register_forward_hook(keep_hidden)

    def trunk(self) -> nn.Module:
        return self._trunk[0]

    def train_values(self, rows):
        hidden, self._hidden = self._hidden, None
        B, Tp, T = rows["prompt_ids"].shape[0], rows["prompt_ids"].shape[1], rows["completion_ids"].shape[1]
        assert hidden is not None and hidden.shape[0] == B, "ValueHead: no policy forward for these rows"
        # completion_logprobs(trim=True) drops padding columns: the completion part is then the last T_kept ones
        T_kept = T if hidden.shape[1] == Tp + T else max(int(rows["completion_mask"].sum(1).max()), 1)
        assert hidden.shape[1] > T_kept, f"ValueHead: trunk output {tuple(hidden.shape)} lacks the prompt's end"
        values = self.project(hidden, T_kept)
        return torch.nn.functional.pad(values, (0, T - T_kept)) * rows["completion_mask"]


class ValueModel(_Critic):
    """critic=model: a separate copy of the initial policy's trunk with its own head, fully trainable (the RLHF
    recipe initialises the critic from a pretrained model; with no reward model here, from the policy)."""

    def __init__(self, policy: nn.Module):
        super().__init__(policy)
        self.body = copy.deepcopy(_trunk(policy)).requires_grad_(True)

    def trunk(self) -> nn.Module:
        return self.body


CRITICS: dict[str, type[_Critic]] = {"head": ValueHead, "model": ValueModel}


# ---- the actor-critic module ----------------------------------------------------------------------------------------
@dataclass
class ActorCriticConfig(PolicyGradientConfig):
    """The critic-free choices that still apply (ratio, trust region, aggregation, KL in the reward, truncation)
    plus the critic's."""

    advantage: Literal["gae"] = "gae"
    """Generalised advantage estimation from the critic's values."""
    critic: CriticKind = "head"
    """A scalar head on the policy trunk, or a separate value model (a copy of the initial trunk)."""
    critic_lr: float | None = None
    """Learning rate of the critic's parameter group (head, or the whole value model); None: optim.lr."""
    critic_warmup: int = 0
    """The first N rollout steps train only the critic: the policy's parameters do not move (verl's
    ``trainer.critic_warmup``). The steps count against trainer.max_steps and their samples against the budget."""
    value_clip: float | None = 0.2
    """ε_V: V is clipped to V_old ± ε_V in the value loss; None: no clipping."""
    vf_coef: float = 1.0
    """c_V in ℒ = ℒ_policy + c_V·ℒ_V (the ½ is inside ℒ_V)."""
    gamma: float = 1.0
    """γ"""
    lam: float = 0.95
    """λ of GAE."""
    whiten_adv: bool = True
    """Whiten Â over the batch's tokens (token-weighted mean and std)."""

    def choice_tables(self):
        return {k: v for k, v in super().choice_tables().items() if k != "advantage"}  # GAE: ActorCritic.advantages

    def __post_init__(self):
        super().__post_init__()
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.lam <= 1.0):
            raise ValueError(f"gamma and lam must be in [0, 1], got gamma={self.gamma}, lam={self.lam}")
        if self.value_clip is not None and self.value_clip <= 0:
            raise ValueError(f"value_clip must be > 0 or null, got {self.value_clip}")
        if self.critic_warmup < 0:
            raise ValueError(f"critic_warmup must be >= 0 rollout steps, got {self.critic_warmup}")

    def choices(self) -> dict[str, str]:
        extra = {f.name: str(getattr(self, f.name)) for f in fields(self) if f.name in ACTOR_CRITIC_CHOICES}
        return {**super().choices(), **extra}


class ActorCritic(PolicyGradient):
    """PolicyGradient plus a critic: V_old in the behaviour pass (``ro.values``), the critic's own optimizer group
    and gradient clip, and value diagnostics in the step's metrics. Subclasses write ``advantages`` (setting
    ``ro.returns``, then calling ``value_stats``) and ``loss``."""

    Config = ActorCriticConfig

    def __init__(self, cfg, policy, tokenizer, task):
        super().__init__(cfg, policy, tokenizer, task)
        self.critic = CRITICS[self.acfg.critic](policy)
        self.critic_grad_norms: list[float] = []

    @property
    def zero_adv_rows_inert(self) -> bool:
        return False  # the value loss has a gradient whatever the advantage

    @property
    def forward_switches(self) -> dict[str, bool]:
        """A value head reads the policy forward's hidden states: one forward over prompt + completion (trimming is
        fine), not the prompt-once path whose last trunk call sees only the completions."""
        switches = super().forward_switches
        return {**switches, "share_prompt": False} if self.critic.reads_policy_forward else switches

    def configure_optimizers(self):
        out = super().configure_optimizers()  # AdamW over the policy, with the warm-up schedule
        opt = out["optimizer"]
        opt.add_param_group({"params": list(self.critic.parameters()), "lr": self.acfg.critic_lr or self.cfg.optim.lr})
        # rebuilt so the warm-up covers the critic's group too (LambdaLR fixes its groups when constructed)
        out["lr_scheduler"]["scheduler"] = LambdaLR(opt, out["lr_scheduler"]["scheduler"].lr_lambdas[0])
        return out

    def on_before_optimizer_step(self, optimizer) -> None:
        """The update clips the policy's gradient; the critic's own parameters are clipped here, separately (as with
        separate actor and critic optimizers), and a non-finite critic gradient skips the critic's step. During
        critic_warmup the policy's gradients are dropped, so only the critic steps (AdamW skips a parameter without a
        gradient)."""
        if self.step_count < self.acfg.critic_warmup:
            for p in self.policy.parameters():
                p.grad = None
        params = [p for p in self.critic.parameters() if p.grad is not None]
        if not params:
            return
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.optim.max_grad_norm)
        if not torch.isfinite(norm):
            for p in params:
                p.grad = None
        self.critic_grad_norms.append(float(norm))

    reads_old_logp_before_update = True  # the behaviour pass also computes V_old (below)

    @torch.no_grad()
    def behaviour_logprobs(self, ro: Rollout) -> None:
        """log π_old (and π_ref) as usual, then V_old(s_t) [B, T] from the critic before any update.
        NOTE: with critic=head this is one extra no-grad trunk forward per rollout (the base pass may reuse the
        sampler's log-probs, so the values do not ride on it)."""
        super().behaviour_logprobs(ro)
        parts = []
        for idx in torch.arange(ro.size, device=self.device).split(self.cfg.train.micro_batch_size):
            parts.append(self.critic(ro.prompt_ids[idx], ro.prompt_mask[idx], ro.completion_ids[idx], ro.mask[idx]))
        ro.values = torch.cat(parts)

    def value_stats(self, ro: Rollout) -> None:
        """The critic's fit to this rollout's targets, logged with the step (``step_stats``)."""
        m = ro.train_mask
        self.step_stats |= {
            "stats/value_mean": float(L.masked_mean(ro.values, m)),
            "stats/return_mean": float(L.masked_mean(ro.returns, m)),
            "stats/explained_variance": explained_variance(ro.values, ro.returns, m),
        }

    def update(self, ro: Rollout) -> dict[str, float]:
        self.critic_grad_norms = []
        out = super().update(ro)
        if self.critic_grad_norms:
            out["stats/value_grad_norm"] = sum(self.critic_grad_norms) / len(self.critic_grad_norms)
        return out
