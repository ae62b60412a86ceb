"""VinePPO (Kazemnejad, Aghajohari, Portelance, Sordoni, Reddy, Courville, Le Roux 2024, arXiv 2410.01679): PPO with
credit from Monte-Carlo continuations instead of a critic. Read from the authors' code (McGill-NLP/VinePPO,
``MathEpisodeGeneratorWithMCAdvantages``: ``_compute_mc_value``, ``_compute_step_advantages``,
``_compute_token_advantages``; ../shared/docs/algorithms-round3.md §1); the paper's text only in excerpts.

    s_0 = x,  s_i = x + step_1 .. step_i                       (steps: the completion cut at step boundaries)
    V̂(s_i) = 1/K Σ_k R(x, s_i + η_k),   η_k ~ π_θ(· | s_i)      (K continuations from each state, i < n)
    V̂(s_n) = 0,   A_i = r_i + V̂(s_{i+1}) − V̂(s_i),  r_i = 0 except r_n = R      (so A_n = R − V̂(s_{n−1}))
    Â_t = A_i for every token t of step i; Â whitened over the batch's tokens
    ℒ = −min(ρ_t Â_t, clip(ρ_t, 1 − 0.2, 1 + 0.2) Â_t) + β k3,   β = 1e-4, no critic

The continuations come from the step's behaviour policy through ``RLModule.branch`` (the hf engine's
``bench.engine.rollout.branch``, each prefix encoded once, or the vLLM engine with its prefix cache, as the authors
sample with vLLM; seeded per prefix, within the completion budget); they estimate values only and are not trained on,
as in the authors' code; they count as samples and tokens generated (``rollout/samples_seen``,
``rollout/tokens_generated``) and are logged apart as ``rollout/branch_samples`` and ``rollout/branch_tokens``.
Identical prefixes (every completion's s_0 = x) are estimated once. Step boundaries (``algorithm.steps``):
``newline`` (the authors' delimiter), ``task`` (the task's own segments, ``Task.segment``), or ``every``
``algorithm.step_tokens`` tokens. Beyond ``max_value_steps`` (20 in the authors' config) states take the realised
return (their backward fill: V̂(s_i) = r_i + V̂(s_{i+1})).

Deviations
# NOTE(deviation): a continuation that reaches the budget is scored by the task like any completion (the main
#   rollouts are); the authors' configs score unfinished continuations 0 (get_unfinished_response_penalty).
# NOTE(deviation): K = 9 and temperature as the authors (0.6 in their config: rollout.temperature here); one PPO
#   epoch of minibatches per rollout as every method of this harness, the authors' 2 epochs are train.ppo_epochs=2.
# NOTE(deviation): the whitening is over all tokens of the step's batch (mean and std with ε = 1e-8), as their
#   whiten_advantages; the authors' token mapping goes by characters, here step boundaries are tokens directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from algorithms.grpo import GRPO, GRPOConfig
from bench import dist
from bench.engine.rollout import Rollout, sample_seed
from bench.rl.objective import ADVANTAGES
from bench.rl.segment import char_offsets_to_tokens


@ADVANTAGES.register("mc")
def mc_step_advantages(rewards, token_rewards, mask, group_size, cfg, baseline, steps):
    """Placeholder for the choice's name: the Monte-Carlo values need the policy and the task (VinePPO.advantages)."""
    raise ValueError("advantage=mc estimates values from branching rollouts: use algorithm=vineppo")


@dataclass
class VinePPOConfig(GRPOConfig):
    name: str = "vineppo"
    advantage: str = "mc"
    """Monte-Carlo step advantages from K continuations per state (computed by VinePPO.advantages)."""
    adv_scale: str = "none"
    loss_agg: str = "token-mean"
    beta: float = 1e-4
    """k3 KL to the reference in the loss (trainers/refKl0.0001.jsonnet)."""
    mc_rollouts: int = 9
    """K: continuations per state (episode_generators/9rolls.jsonnet)."""
    steps: Literal["newline", "task", "every"] = "newline"
    """Where a completion's steps end: after each newline (the authors'), the task's segments, or every step_tokens."""
    step_tokens: int = 8
    max_value_steps: int = 20
    """States estimated per completion; later ones take the realised return."""


def step_starts(starts_by_row: list[list[int]], lengths: list[int]) -> list[list[int]]:
    """Sorted, de-duplicated step starts per row, 0 first, each inside the completion."""
    return [sorted({0, *(s for s in st if 0 < s < n)}) for st, n in zip(starts_by_row, lengths, strict=True)]


def vine_advantages(starts: list[list[int]], values: list[list[float]], rewards: list[float], T: int) -> torch.Tensor:
    """[B, T] token advantages: step i of row b (tokens starts[b][i] .. starts[b][i+1]) gets
    r_i + V̂(s_{i+1}) − V̂(s_i), with V̂(s_n) = 0 and r = R on the last step only. ``values[b][i]`` = V̂(s_i)."""
    out = torch.zeros(len(starts), T)  # host: filled per token, moved by the caller
    for b, (st, v, R) in enumerate(zip(starts, values, rewards, strict=True)):
        ends = [*st[1:], None]
        for i, (a, e) in enumerate(zip(st, ends, strict=True)):
            nxt = v[i + 1] if i + 1 < len(st) else 0.0
            r = R if i + 1 == len(st) else 0.0
            out[b, a:e] = r + nxt - v[i]
    return out


class VinePPO(GRPO):
    Config = VinePPOConfig
    multi_turn = False  # it re-scores continuations as one turn's text
    advantages_beyond_the_batch = True  # from branching rollouts of the policy, not a function of the batch alone
    description = "VinePPO (Kazemnejad et al. 2024): PPO with Monte-Carlo step values from K continuations, no critic"

    def _starts(self, ro: Rollout) -> list[list[int]]:
        a, lengths = self.acfg, ro.lengths.tolist()
        ids = [row[:n].tolist() for row, n in zip(ro.completion_ids.cpu(), lengths, strict=True)]
        decode = lambda x: self.tokenizer.decode(x, skip_special_tokens=True)  # noqa: E731
        if a.steps == "every":
            raw = [list(range(0, n, a.step_tokens)) for n in lengths]
        elif a.steps == "task":
            segs = [self.task.segment(t) or [0] for t in ro.texts]
            raw = [char_offsets_to_tokens(r, o, decode) for r, o in zip(ids, segs, strict=True)]
        else:  # a step starts at the token holding the character after each newline
            offs = [[i + 1 for i, c in enumerate(t) if c == "\n"] for t in ro.texts]
            raw = [char_offsets_to_tokens(r, o, decode) for r, o in zip(ids, offs, strict=True)]
        return step_starts(raw, lengths)

    @torch.no_grad()
    def mc_values(self, ro: Rollout, starts: list[list[int]]) -> list[list[float]]:
        """V̂(s_i) for every row's states: K continuations per distinct prefix, each scored by the task. On several
        ranks (every rank holds the step's whole rollout) the chunks of prefixes are dealt out round-robin and the
        estimates gathered: each chunk is the batch one process would sample, with the same seeds, so the values are
        one process's."""
        a, r, G = self.acfg, self.cfg.rollout, ro.group_size
        key = {(b, t): (b // G, tuple(ro.completion_ids[b, :t].tolist())) for b, st in enumerate(starts) for t in st}
        first = {}  # distinct (prompt, prefix tokens) -> the (row, t) that estimates it
        for b, st in enumerate(starts):
            for t in st[: a.max_value_steps]:
                first.setdefault(key[(b, t)], (b, t))
        order = list(first.values())
        per_chunk = max(1, self.cfg.eval.batch_size // a.mc_rollouts)
        was = self.policy.training
        self.policy.eval()
        est: dict[tuple, float] = {}
        chunks = [order[lo : lo + per_chunk] for lo in range(0, len(order), per_chunk)]
        try:
            for chunk in chunks[dist.rank() :: dist.world()]:
                rows = torch.tensor([b for b, _ in chunk], device=ro.prompt_ids.device)
                seeds = [sample_seed(self.cfg.seed, self.step_count, "vine", b, t) for b, t in chunk]
                gen = self.branch(ro.prompt_ids[rows], ro.prompt_mask[rows], ro.completion_ids[rows],
                                  [t for _, t in chunk], continuations=a.mc_rollouts, max_new_tokens=r.max_new_tokens,
                                  seeds=seeds, temperature=r.temperature, top_p=r.top_p,
                                  eos_token_id=self.tokenizer.eos_token_id,
                                  pad_token_id=self.tokenizer.pad_token_id)  # fmt: skip
                self.extra_samples += gen.completion_ids.shape[0]
                self.extra_tokens += int(gen.lengths.sum())
                self.branch_stats["rollout/branch_samples"] += gen.completion_ids.shape[0]
                self.branch_stats["rollout/branch_tokens"] += int(gen.lengths.sum())
                for j, (b, t) in enumerate(chunk):
                    k = slice(j * a.mc_rollouts, (j + 1) * a.mc_rollouts)
                    prefix = ro.completion_ids[b, :t].repeat(a.mc_rollouts, 1)
                    full = torch.cat([prefix, gen.completion_ids[k]], 1)
                    mask = torch.cat([torch.ones_like(prefix, dtype=gen.mask.dtype), gen.mask[k]], 1)
                    texts = self.decode(full, mask)
                    ex = ro.examples[b // G]
                    est[key[(b, t)]] = sum(self.task.reward(ex, text).score for text in texts) / a.mc_rollouts
        finally:
            self.policy.train(was)
        if dist.active():
            est = {k: v for part in dist.gather_objects(est) for k, v in part.items()}
        values = []
        for b, st in enumerate(starts):
            R = float(ro.scores[b])
            v = [est[key[(b, t)]] if i < a.max_value_steps else R for i, t in enumerate(st)]
            values.append(v)
        return values

    def mc_advantages(self, ro: Rollout) -> torch.Tensor:
        """[B, T] step advantages before whitening."""
        starts = self._starts(ro)
        values = self.mc_values(ro, starts)
        self.step_stats["rollout/vine_states"] = sum(min(len(s), self.acfg.max_value_steps) for s in starts)
        return vine_advantages(starts, values, ro.scores.tolist(), ro.completion_ids.shape[1]).to(ro.scores.device)

    def whiten(self, adv: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """Whitened over the loss tokens ``m``: mean and biased std, ε = 1e-8."""
        mean, std = adv[m].mean(), adv[m].std(unbiased=False)
        return torch.where(m, (adv - mean) / (std + 1e-8), 0.0)

    def advantages(self, ro: Rollout) -> torch.Tensor:
        self.branch_stats = {"rollout/branch_samples": 0, "rollout/branch_tokens": 0}
        adv = self.mc_advantages(ro)
        m = ro.train_mask.bool()
        if m.sum() > 1:
            adv = self.whiten(adv, m)
        self.step_stats.update(dist.sum_dict(self.branch_stats))  # every rank's continuations
        return adv
