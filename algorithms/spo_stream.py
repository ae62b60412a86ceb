"""Single-stream Policy Optimization (Zhongwen Xu, Zihan Ding 2025, arXiv 2509.13232): one sample per prompt, the
group baseline replaced by a persistent per-prompt value tracker. Read from the authors' code (verl-project/verl-recipe,
``spo/spo_ray_trainer.py``: ``RayPPOTrainer.fit``, ``_get_spo_rho``; ``spo/config/spo_trainer.yaml``, ``spo/train.sh``;
../shared/docs/algorithms-round3.md §4); the paper's text only in its abstract. Named ``spo_stream`` to keep it apart
from SPO, Segment Policy Optimization (``spo_chain``).

    tracker per prompt x: Beta(α, β),  p̂ = α / (α + β),  α_0 = β_0 = 0.5 (no offline estimate)
    A = r − p̂ (before the update);   A ← (A − mean_batch A) / (std_batch A + 1e-8), on every response token
    after the actor step: α ← ρ α + r,  β ← ρ β + (1 − r),
      ρ = clip(2^(−D / 0.06), 0.875, 0.96),  D = mean_t |log π_stored(y') − log π_now(y')| over the prompt's stored
      sample y' (π_stored: its log-probs when stored; a prompt seen for the first time has D = 0); then this step's
      sample and its log-probs under the updated policy are stored
    prompts: from a pool of pool_factor × P candidates, P drawn ∝ √(p̂ (1 − p̂)) + 0.05, without replacement
    ℒ = verl's PPO loss: clip 0.2 / 0.28, dual clip 10, token-mean, no KL;  G = 1 (conf/algorithm/spo_stream.yaml)

The tracker (α, β, the stored samples) is saved with the checkpoint, so a resumed run continues it. On several
processes every rank draws the same prompts (the pool's RNG is the run's, not the rank's) and updates its own copy of
the tracker from the step's gathered rollout with the same weights, so the copies stay equal without communication.

Deviations
# NOTE(deviation): no offline value estimate (the authors' trainer.spo.offline_values, N = 8 samples of the initial
#   policy per prompt): every prompt starts at α = β = 0.5, the code's path when no estimate is given.
# NOTE(deviation): the candidate pool is pool_factor × P prompts drawn by the run's seeded RNG from the train split
#   (the authors draw P from each dataloader batch of gen_batch_size, 14000 for 1024 in their DAPO script).
# NOTE(deviation): rewards enter α, β as the task's score clipped to [0, 1] (the authors' reward sum, binary there).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

import torch

from algorithms.grpo import GRPO, GRPOConfig
from bench import dist
from bench.engine.policy import completion_logprobs
from bench.engine.rollout import Rollout
from bench.rl.losses import masked_mean
from bench.rl.objective import ADVANTAGES


@ADVANTAGES.register("tracker")
def tracker_advantages(rewards, token_rewards, mask, group_size, cfg, baseline, steps):
    """Placeholder for the choice's name: the tracker lives in the module (SingleStreamPO.advantages)."""
    raise ValueError("advantage=tracker reads a per-prompt value tracker: use algorithm=spo_stream")


@dataclass
class SingleStreamConfig(GRPOConfig):
    name: str = "spo_stream"
    advantage: str = "tracker"
    """r − p̂ from the prompt's tracker, whitened over the batch."""
    beta: float = 0.0
    rho: Literal["kl", "constant"] = "kl"
    """Forgetting factor: ``kl`` (adaptive, from the policy's drift on the stored sample) or ``constant``."""
    rho_value: float = 0.875
    rho_min: float = 0.875
    """clip_lower of the adaptive ρ (spo_trainer.yaml)."""
    rho_max: float = 0.96
    d_half: float = 0.06
    """D at which ρ = 1/2 (hard-coded in the authors' code)."""
    exploration: float = 0.05
    """ε in the sampling weight √(p̂(1 − p̂)) + ε."""
    pool_factor: int = 4
    """Candidate prompts per step, as a multiple of rollout.prompts_per_step (1: no prioritisation)."""


def forgetting(D: torch.Tensor, d_half: float, lo: float, hi: float) -> torch.Tensor:
    """ρ = clip(2^(−D / d_half), lo, hi)."""
    return torch.pow(2.0, -D / d_half).clamp(lo, hi)


def sampling_weights(p_hat: torch.Tensor, eps: float) -> torch.Tensor:
    return (p_hat * (1 - p_hat)).sqrt() + eps


class SingleStreamPO(GRPO):
    Config = SingleStreamConfig
    multi_turn = False  # its value tracker keys on the whole completion as one answer
    description = "Single-stream PO (Xu & Ding 2025): per-prompt Beta value tracker (KL-adaptive), 1 sample per prompt"
    advantages_beyond_the_batch = True  # from the tracker's state, not a function of the batch alone

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.alpha: dict[str, float] = {}  # per prompt uid
        self.beta_: dict[str, float] = {}
        self.stored: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def p_hat(self, uids: list[str]) -> torch.Tensor:
        a = torch.tensor([self.alpha.get(u, 0.5) for u in uids], dtype=torch.float64)  # host: the tracker's counts
        b = torch.tensor([self.beta_.get(u, 0.5) for u in uids], dtype=torch.float64)  # host: the tracker's counts
        return a / (a + b)

    def collect(self, batch: dict):
        """Draw the step's P prompts from a pool of pool_factor × P, weighted towards uncertain prompts."""
        P, f = len(batch["examples"]), self.acfg.pool_factor
        pool = self.task.rl_prompts()
        if f > 1 and len(pool) >= P * f:
            rng = random.Random(f"{self.cfg.seed}/{self.step_count}/spo_pool")
            candidates = rng.sample(pool, P * f)
            w = sampling_weights(self.p_hat([ex.uid for ex in candidates]), self.acfg.exploration)
            gen = torch.Generator().manual_seed(rng.randrange(2**31))
            chosen = torch.multinomial(w, P, replacement=False, generator=gen).tolist()
            batch = self.trainer.datamodule.transfer_batch_to_device(
                self.task.collate_prompts([candidates[i] for i in chosen]), self.device, 0
            )
        return super().collect(batch)

    def advantages(self, ro: Rollout) -> torch.Tensor:
        uids = [ex.uid for ex in ro.examples for _ in range(ro.group_size)]
        p = self.p_hat(uids).to(ro.scores)
        adv = ro.rewards - p
        adv = (adv - adv.mean()) / (adv.std() + 1e-8) if adv.numel() > 1 else adv * 0
        self.step_stats.update({"stats/p_hat_mean": float(p.mean()), "stats/tracker_prompts": len(self.alpha)})
        return adv

    def update(self, ro: Rollout) -> dict[str, float]:
        stats = super().update(ro)
        stats.update(self.update_tracker(ro))
        return stats

    @torch.no_grad()
    def _logp(self, rows: list[tuple[torch.Tensor, ...]]) -> list[torch.Tensor]:
        """Each (prompt ids, prompt mask, completion ids, completion mask) scored by the current policy, in batches
        (prompts left-padded, completions right-padded to common widths)."""
        if not rows:
            return []
        pad, dev = self.tokenizer.pad_token_id, self.device
        wp, wc = max(len(r[0]) for r in rows), max(len(r[2]) for r in rows)
        left = lambda x, w, v: torch.cat([x.new_full((w - len(x),), v), x])  # noqa: E731
        right = lambda x, w, v: torch.cat([x, x.new_full((w - len(x),), v)])  # noqa: E731
        how = [(left, wp, pad), (left, wp, 0), (right, wc, pad), (right, wc, 0)]
        batch = [torch.stack([f(r[k], w, v) for r in rows]).to(dev) for k, (f, w, v) in enumerate(how)]
        was = self.policy.training
        self.policy.eval()
        try:
            with dist.full_weights(self.policy):  # FSDP: gathered once, not per forward
                mb = self.cfg.train.micro_batch_size
                out = [completion_logprobs(self.policy, *(x[i : i + mb] for x in batch),
                                           temperature=self.cfg.rollout.temperature)[0]
                       for i in range(0, len(rows), mb)]  # fmt: skip
        finally:
            self.policy.train(was)
        logp = torch.cat(out)
        return [logp[i, : len(r[2])] for i, r in enumerate(rows)]

    def update_tracker(self, ro: Rollout) -> dict[str, float]:
        """After the actor step: ρ from the drift on each prompt's stored sample; α, β updated; this sample stored."""
        a = self.acfg
        uids = [ex.uid for ex in ro.examples for _ in range(ro.group_size)]
        rows = [(ro.prompt_ids[i], ro.prompt_mask[i], ro.completion_ids[i], ro.mask[i]) for i in range(ro.size)]
        now = self._logp(rows)  # this step's samples under the updated policy: what is stored
        D = torch.zeros(ro.size, dtype=torch.float64)  # host: per-row floats
        if a.rho == "kl":  # a prompt seen for the first time: D = 0
            seen = [i for i, u in enumerate(uids) if u in self.stored]
            past = [self.stored[uids[i]] for i in seen]
            for i, st, cur in zip(seen, past, self._logp([p[:4] for p in past]), strict=True):
                D[i] = float(masked_mean((st[4] - cur.cpu()).abs(), st[3].float()))
            rho = forgetting(D, a.d_half, a.rho_min, a.rho_max)
        else:
            rho = torch.full((ro.size,), a.rho_value, dtype=torch.float64)  # host: per-row floats
        r = ro.scores.double().clamp(0, 1).cpu()
        for i, u in enumerate(uids):
            self.alpha[u] = float(rho[i]) * self.alpha.get(u, 0.5) + float(r[i])
            self.beta_[u] = float(rho[i]) * self.beta_.get(u, 0.5) + 1 - float(r[i])
            self.stored[u] = (*(x.detach().cpu() for x in rows[i]), now[i].detach().cpu())
        return {"stats/spo_rho_mean": float(rho.mean()), "stats/spo_D_mean": float(D.mean())}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["bench"]["spo_tracker"] = {"alpha": self.alpha, "beta": self.beta_, "stored": self.stored}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        t = checkpoint["bench"].get("spo_tracker", {})
        self.alpha, self.beta_, self.stored = t.get("alpha", {}), t.get("beta", {}), t.get("stored", {})
