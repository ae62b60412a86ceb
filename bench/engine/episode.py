"""Multi-turn episodes: the policy and an environment task take turns, on any engine.

Layout: the whole episode is one sequence (RAGEN, TRL, SkyRL, verifiers; ../shared/docs/algorithms-round4.md "How
peers run multi-turn rollouts", layout B). The prompt is the task's first observation; the completion is action 1,
the environment's answer, action 2, ... in one row, the environment's tokens in the context but out of the loss
(``loss_mask`` 0, log-prob 0). Each turn continues the row from everything before it, so turn t sees the whole
history; with the engines' prefix caches (the hf loop's shared prompt, vLLM's prefix cache) the history is encoded
once per turn, not once per token.

Turn 1 is the engine's group sampling (``generate``: G completions per prompt from the prompt's seed), so an episode
of one turn is the single-turn rollout bit for bit. Turns 2.. continue each live row from its own seed (``branch``
with one continuation), within what is left of the episode's token budget and the turn's own.

Limits, each a real bound on any episode: ``max_turns`` actions; ``turn_tokens`` tokens per action (cut there, the
turn counts as truncated and the environment still sees the text); ``budget`` tokens in the whole completion,
actions and observations together (an observation that would not leave room for one more token ends the episode
as truncated, scored by the rewards so far). The last token of a row is always an action's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from bench.engine.rollout import Generation, sample_seed


@dataclass(frozen=True)
class Turn:
    """What an environment answers to one action: the next observation (shown to the policy when the episode goes
    on), the turn's reward, whether the episode is over, and the episode's reward components so far (logged as
    ``reward/<name>``, the last turn's kept)."""

    observation: str
    reward: float
    done: bool
    components: dict[str, float] = field(default_factory=dict)


@dataclass
class Episodes(Generation):
    """A batch of episodes, one row each (rows p*G .. p*G+G-1 from prompt p). ``mask`` covers every token of the
    completion (actions and observations: what attention sees); ``loss_mask`` only the policy's."""

    loss_mask: torch.Tensor = None  # [B, T] float: action tokens
    turn_index: torch.Tensor = None  # [B, T] long: turn of each token (an action and the observation after it); −1 pad
    step_rewards: torch.Tensor = None  # [B, T] each turn's reward on the turn's last action token
    step_ends: torch.Tensor = None  # [B, T] bool: each turn's last action token
    turns: torch.Tensor = None  # [B] long: actions taken
    turn_limit: torch.Tensor = None  # [B] bool: stopped by max_turns before the environment said done
    turns_truncated: torch.Tensor = None  # [B] long: actions cut by turn_tokens or the budget (no EOS)
    components: list[dict[str, float]] = field(default_factory=list)  # [B] the last turn's components
    anchors: list[list[str]] = field(default_factory=list)  # [B][turns] the observation each action answered
    turn_rewards: list[list[float]] = field(default_factory=list)  # [B][turns]

    def rollout_fields(self) -> dict:
        """What a Rollout keeps of the episodes beside the Generation's fields (bench/engine/rollout.py)."""
        return {"loss_mask": self.loss_mask, "step_rewards": self.step_rewards, "step_ends": self.step_ends,
                "turn_index": self.turn_index, "anchors": self.anchors,
                "action_tokens": self.loss_mask.sum(1).long()}  # fmt: skip

    def results(self) -> list:
        """[B] RewardResult: each episode's return as its score, the last turn's components."""
        from bench.task import RewardResult

        return [RewardResult(sum(r), dict(c)) for r, c in zip(self.turn_rewards, self.components, strict=True)]


def observation_text(tokenizer, observation: str, action_ended: bool) -> str:
    """The text that follows an action in the episode's sequence: the observation as the next user message and the
    opening of the next assistant message, as the tokenizer's chat template renders them (without a template:
    the observation on its own lines). ``action_ended``: the action stopped with EOS, which already closed the
    assistant message (else the template's closing marker is part of this text)."""
    if not getattr(tokenizer, "chat_template", None):
        return ("" if action_ended else "\n") + observation + "\n"
    before, after = _turn_template(tokenizer, tokenizer.chat_template)
    eos = tokenizer.eos_token or ""
    if action_ended and eos and before.startswith(eos):
        before = before[len(eos) :]
    return before + observation + after


@functools.lru_cache(maxsize=8)
def _turn_template(tokenizer, chat_template: str) -> tuple[str, str]:
    """What the chat template writes after an assistant message and around the next user message's content, rendered
    once per tokenizer and template (``observation_text`` runs for every row at every turn)."""
    a, b, c = "\x00A\x00", "\x00B\x00", "\x00C\x00"  # markers no template writes
    msgs = [{"role": "user", "content": a}, {"role": "assistant", "content": b}, {"role": "user", "content": c}]
    full = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    tail = full[full.index(b) + len(b) :]
    return tail[: tail.index(c)], tail[tail.index(c) + len(c) :]


def run_episodes(
    task,
    tokenizer,
    examples: Sequence,
    group_size: int,
    first: Callable[[int], Generation],
    cont: Callable[..., Generation],
    *,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    seeds: Sequence[int],
    env_seeds: Sequence[int],
    max_turns: int,
    turn_tokens: int | None,
    budget: int,
) -> Episodes:
    """Run ``len(examples) * group_size`` episodes. ``first(max_new_tokens)`` samples turn 1 for every row (the
    engine's ``generate`` over the prompts, seeded by ``seeds``); ``cont(prompt_ids, prompt_mask, completion_ids,
    prefix_lens, continuations=1, max_new_tokens=, seeds=, segment_tokens=)`` continues rows (the engine's ``branch``).
    Every episode of a group is reset with its prompt's ``env_seeds`` entry (the same world for the G episodes).
    ``prompt_ids`` / ``prompt_mask`` are per row ([B, Tp], left-padded)."""
    if max_turns < 1:
        raise ValueError(f"rollout.max_turns must be >= 1, got {max_turns}")
    G, B = group_size, len(examples) * group_size
    device = prompt_ids.device
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    turn_budget = min(turn_tokens or budget, budget)
    states: list[Any] = []
    anchors: list[list[str]] = []
    for i in range(B):
        observation, state = task.reset(examples[i // G], env_seeds[i // G])
        states.append(state)
        anchors.append([observation])
    ids: list[list[int]] = [[] for _ in range(B)]
    policy: list[list[float]] = [[] for _ in range(B)]  # 1 on action tokens
    logps: list[list[float]] = [[] for _ in range(B)]
    turn_of: list[list[int]] = [[] for _ in range(B)]
    ends: list[list[int]] = [[] for _ in range(B)]
    rewards: list[list[float]] = [[] for _ in range(B)]
    components: list[dict[str, float]] = [{} for _ in range(B)]
    cut = [0] * B
    limit, truncated = [False] * B, [False] * B
    live = list(range(B))
    for t in range(max_turns):
        if t == 0:
            gen = first(turn_budget)
            rows = list(range(B))
        else:
            rows = live
            width = max(len(ids[i]) for i in rows)
            so_far = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
            for j, i in enumerate(rows):
                so_far[j, : len(ids[i])] = torch.tensor(ids[i], dtype=torch.long, device=device)
            sel = torch.tensor(rows, device=device)
            gen = cont(prompt_ids[sel], prompt_mask[sel], so_far, [len(ids[i]) for i in rows], continuations=1,
                       max_new_tokens=budget, seeds=[sample_seed(seeds[i // G], "turn", t, i % G) for i in rows],
                       segment_tokens=turn_tokens)  # fmt: skip
        live = []
        for j, i in enumerate(rows):
            n = int(gen.lengths[j])
            action = gen.completion_ids[j, :n].tolist()
            ended = n > 0 and action[-1] == eos
            ids[i] += action
            policy[i] += [1.0] * n
            logps[i] += gen.sampler_logp[j, :n].tolist()
            turn_of[i] += [t] * n
            ends[i].append(len(ids[i]) - 1)
            cut[i] += not ended
            truncated[i] = not ended  # the episode's last action so far was cut (a single-turn rollout's truncation)
            turn = task.step(states[i], tokenizer.decode(action, skip_special_tokens=True))
            rewards[i].append(float(turn.reward))
            components[i] = dict(turn.components)
            if turn.done:
                continue
            if t == max_turns - 1:
                limit[i] = True
                continue
            obs = tokenizer(observation_text(tokenizer, turn.observation, ended), add_special_tokens=False).input_ids
            if len(ids[i]) + len(obs) + 1 > budget:  # no room for the observation and one more token
                truncated[i] = True
                continue
            ids[i] += obs
            policy[i] += [0.0] * len(obs)
            logps[i] += [0.0] * len(obs)
            turn_of[i] += [t] * len(obs)
            anchors[i].append(turn.observation)
            live.append(i)
        if not live:
            break

    def padded(rows_, value, dtype):
        rows_ = [torch.tensor(r, dtype=dtype, device=device) for r in rows_]
        return pad_sequence(rows_, batch_first=True, padding_value=value)

    completion = padded(ids, pad, torch.long)
    mask = padded([[1.0] * len(r) for r in ids], 0.0, torch.float32)
    step_ends = torch.zeros(mask.shape, dtype=torch.bool, device=device)
    step_rewards = torch.zeros(mask.shape, dtype=torch.float32, device=device)
    for i in range(B):
        step_ends[i, ends[i]] = True
        step_rewards[i, ends[i]] = torch.tensor(rewards[i], device=device)
    return Episodes(
        completion_ids=completion,
        mask=mask,
        sampler_logp=padded(logps, 0.0, torch.float32),
        lengths=mask.sum(1).long(),
        truncated=torch.tensor(truncated, device=device),
        loss_mask=padded(policy, 0.0, torch.float32),
        turn_index=padded(turn_of, -1, torch.long),
        step_rewards=step_rewards,
        step_ends=step_ends,
        turns=torch.tensor([len(r) for r in rewards], device=device),
        turn_limit=torch.tensor(limit, device=device),
        turns_truncated=torch.tensor(cut, device=device),
        components=components,
        anchors=anchors,
        turn_rewards=rewards,
    )


def episode_sums(ep: Episodes) -> dict[str, float]:
    """Counts over a batch of episodes that add up across batches and ranks (``episode_metrics`` turns them into
    rates)."""
    return {
        "episodes": float(len(ep.turn_rewards)),
        "turns": float(ep.turns.sum()),
        "turn_reward": float(sum(map(sum, ep.turn_rewards))),
        "action_tokens": float(ep.loss_mask.sum()),
        "observation_tokens": float((ep.mask - ep.loss_mask).sum()),
        "turns_truncated": float(ep.turns_truncated.sum()),
        "episodes_truncated": float(ep.truncated.sum()),
        "turn_limit": float(ep.turn_limit.sum()),
    }


def episode_metrics(sums: dict[str, float]) -> dict[str, float]:
    """``rollout/`` statistics of episodes from their ``episode_sums`` (of one batch, or summed over ranks): turns,
    per-turn reward and length, and how episodes ended."""
    n, turns = max(sums["episodes"], 1.0), max(sums["turns"], 1.0)
    return {
        "rollout/turns_mean": sums["turns"] / n,
        "rollout/turn_reward_mean": sums["turn_reward"] / turns,
        "rollout/turn_len_mean": sums["action_tokens"] / turns,
        "rollout/observation_len_mean": sums["observation_tokens"] / turns,
        "rollout/turn_truncated_frac": sums["turns_truncated"] / turns,
        "rollout/episode_truncated_frac": sums["episodes_truncated"] / n,
        "rollout/turn_limit_frac": sums["turn_limit"] / n,
    }
