"""Sampling G completions per prompt with a KV cache, and the rollout batch that algorithms consume.

Hand-written rather than transformers' ``generate()``: the loop returns each token's log-probability under the exact
distribution it sampled from (temperature and top-p applied), prefills a prompt once for its whole group, seeds each
row on its own (so a sample does not depend on the batch it is in) and stops rows at EOS without padding the rest;
``generate()`` does none of these. The library engine is vLLM (``rollout.engine=vllm``, bench/engine/vllm.py)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from transformers import DynamicCache, StaticCache

from bench.engine.policy import CACHE_ARG, position_ids


def sample_seed(*parts) -> int:
    """A 63-bit seed from (run seed, step, prompt index, ...): reproducible and independent of batch layout."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "little") >> 1


@dataclass
class Generation:
    completion_ids: torch.Tensor  # [B, T] right-padded with pad_token_id
    mask: torch.Tensor  # [B, T] float: 1 on generated tokens (EOS included), 0 after
    sampler_logp: torch.Tensor  # [B, T] log-probs under the sampling distribution (temperature-scaled)
    lengths: torch.Tensor  # [B]
    truncated: torch.Tensor  # [B] bool: no EOS within the budget


@torch.no_grad()
def generate(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    eos_token_id: int,
    pad_token_id: int,
    seeds: list[int],
    share_prompt_cache: bool = False,
    compact_finished: bool = False,
    static_cache: bool = False,
) -> Generation:
    """Rows p*G .. p*G+G-1 are prompt p's group; prompt p samples from its own generator seeded by ``seeds[p]``.

    ``temperature == 0`` decodes greedily. Two switches change the cost, not the samples:
    ``share_prompt_cache`` encodes each prompt once ([P, Tp] instead of [B, Tp]), projects only its last position to
    the vocabulary, and repeats its KV cache G times;
    ``compact_finished`` runs the model only on rows still decoding (the cache is cut down when a row emits EOS).
    Finished rows still draw from their prompt's generator (a uniform dummy distribution: torch.multinomial consumes
    the same random numbers whatever the probabilities), so the tokens of live rows do not change.
    ``static_cache`` decodes into a KV cache preallocated for prompt + budget (written in place) instead of one that
    grows by concatenation every step.
    """
    P, G = prompt_ids.shape[0], group_size
    assert len(seeds) == P, f"one seed per prompt: {len(seeds)} seeds for {P} prompts"
    device = prompt_ids.device
    attn = prompt_mask.repeat_interleave(G, dim=0)  # [B, Tp]
    pos = position_ids(attn)
    gens = [torch.Generator(device=device).manual_seed(s) for s in seeds]
    cache = DynamicCache()
    if share_prompt_cache and G > 1:
        logits = model(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=position_ids(prompt_mask),
            **{CACHE_ARG: cache},
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]  # [P, V]
        logits = logits.repeat_interleave(G, dim=0)  # [B, V]
        cache.batch_repeat_interleave(G)
    else:
        ids = prompt_ids.repeat_interleave(G, dim=0)  # [B, Tp]
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, **{CACHE_ARG: cache})
        logits = logits.logits[:, -1]
    if static_cache:
        cache = _preallocated(model, cache, attn.shape[1] + max_new_tokens)
    next_pos = pos[:, -1:] + 1
    B = attn.shape[0]
    done = torch.zeros(B, dtype=torch.bool, device=device)
    live = torch.arange(B, device=device)  # rows the cache holds (all rows unless compact_finished)
    tokens, logps, alive = [], [], []
    for t in range(max_new_tokens):
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32; fp64 stays fp64
        if temperature > 0:
            logits = logits / temperature
        lprobs = F.log_softmax(logits, dim=-1)  # [B, V]
        if temperature > 0:
            probs = _top_p(lprobs.exp(), top_p)
            tok = torch.cat([torch.multinomial(probs[p * G : (p + 1) * G], 1, generator=gens[p]) for p in range(P)])
            tok = tok.squeeze(-1)  # [B]
        else:
            tok = lprobs.argmax(-1)
        lp = lprobs.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        tok = torch.where(done, pad_token_id, tok)
        alive.append(~done)
        tokens.append(tok)
        logps.append(torch.where(done, 0.0, lp))
        done = done | (tok == eos_token_id)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
        if compact_finished and bool(done[live].any()):
            keep = (~done[live]).nonzero().squeeze(-1)  # positions in the cache's batch of rows still decoding
            _select_rows(cache, keep)
            live = live[keep]
        out = model(
            input_ids=tok[live].unsqueeze(-1),
            attention_mask=attn[live],
            position_ids=next_pos[live],
            **{CACHE_ARG: cache},
            use_cache=True,
        ).logits[:, -1]  # [len(live), V]
        if len(live) == B:
            logits = out
        else:  # finished rows get a uniform dummy distribution; their draws are discarded
            logits = out.new_zeros(B, out.shape[-1]).index_copy_(0, live, out)
        next_pos = next_pos + 1
    mask = torch.stack(alive, 1).float()  # [B, T]
    return Generation(
        completion_ids=torch.stack(tokens, 1),
        mask=mask,
        sampler_logp=torch.stack(logps, 1),
        lengths=mask.sum(1).long(),
        truncated=~done,
    )


@torch.no_grad()
def branch(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    prefix_lens: list[int],
    *,
    continuations: int,
    max_new_tokens: int,
    seeds: list[int],
    segment_tokens: int | None = None,
    **sampling,
) -> Generation:
    """M = ``continuations`` completions continued from each prefix: row i of ``prompt_ids`` (left-padded) followed by
    the first ``prefix_lens[i]`` tokens of ``completion_ids[i]``. Each prefix is encoded once and its KV cache repeated
    M times (``generate``'s ``share_prompt_cache``), and samples from its own generator seeded by ``seeds[i]``; a
    continuation gets what is left of the completion budget, ``max_new_tokens − prefix_lens[i]``, so a branched
    completion is never longer than a sampled one; with ``segment_tokens`` at most that many (a tree's segment: one
    cut there is ``truncated``, no EOS). Rows i*M .. i*M+M-1 continue prefix i; their tokens count as
    generated samples like any others (the caller adds them to rollout/samples_seen and tokens_generated).

    From the empty prefix (``prefix_lens`` all 0) with M = G this is ``generate``'s group sampling, bit for bit.
    ``sampling``: temperature, top_p, eos_token_id, pad_token_id (and generate's cost switches).
    """
    n, pad = len(prefix_lens), sampling["pad_token_id"]
    rows = [torch.cat([prompt_ids[i][prompt_mask[i].bool()], completion_ids[i, : prefix_lens[i]]]) for i in range(n)]
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([r.new_full((width - len(r),), pad), r]) for r in rows])
    mask = torch.stack([torch.cat([prompt_mask.new_zeros(width - len(r)), prompt_mask.new_ones(len(r))]) for r in rows])
    budget = torch.tensor([max_new_tokens - t for t in prefix_lens], device=ids.device)
    if segment_tokens is not None:
        budget = budget.clamp(max=segment_tokens)
    if int(budget.min()) < 1:
        raise ValueError(f"a prefix of {max(prefix_lens)} tokens leaves no budget of the {max_new_tokens}")
    kw = {"share_prompt_cache": True, **sampling}
    gen = generate(model, ids, mask, group_size=continuations, max_new_tokens=int(budget.max()), seeds=seeds, **kw)
    limit = budget.repeat_interleave(continuations)  # [n M]: each row's own budget
    within = (torch.arange(gen.mask.shape[1], device=ids.device)[None] < limit[:, None]).to(gen.mask.dtype)
    m = gen.mask * within
    ended = ((gen.completion_ids == sampling["eos_token_id"]) & m.bool()).any(1)
    ids_out = torch.where(m.bool(), gen.completion_ids, pad)
    return Generation(ids_out, m, gen.sampler_logp * m, m.sum(1).long(), ~ended)


def _preallocated(model, cache: DynamicCache, max_len: int) -> StaticCache:
    """A StaticCache of ``max_len`` positions holding ``cache``'s keys and values (the prompt's), for decoding."""
    static = StaticCache(config=model.config, max_cache_len=max_len)
    for i, layer in enumerate(cache.layers):
        static.update(layer.keys, layer.values, i)
    return static


def _select_rows(cache, keep: torch.Tensor) -> None:
    """Keep only rows ``keep`` of a dynamic or static cache (transformers' StaticLayer has no row selection)."""
    if isinstance(cache, StaticCache):
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[keep], layer.values[keep]
    else:
        cache.batch_select_indices(keep)


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return probs
    sorted_p, idx = probs.sort(-1, descending=True)
    keep = sorted_p.cumsum(-1) - sorted_p < top_p  # keep the smallest prefix whose mass reaches top_p
    return torch.zeros_like(probs).scatter(-1, idx, sorted_p * keep)


def _pad_cat(tensors: list[torch.Tensor], value, left: bool) -> torch.Tensor:
    """Concatenate [n_k, T_k] tensors along rows, padding columns to the widest (on the left or the right)."""
    width = max(t.shape[1] for t in tensors)  # a part with no rows still sets the width, as torch.cat would
    rows = [row for t in tensors for row in t]
    if not rows:  # every part empty (e.g. dynamic sampling kept no group this round)
        return tensors[0].new_full((0, width), value)
    out = pad_sequence(rows, batch_first=True, padding_value=value, padding_side="left" if left else "right")
    return F.pad(out, (width - out.shape[1], 0) if left else (0, width - out.shape[1]), value=value)


ROW_LISTS = ("anchors",)
"""Rollout fields that are per-row Python lists (None when absent), kept in row order like ``texts``."""


@dataclass
class Rollout:
    """One rollout batch: P prompts x G completions, B = P*G rows, prompt p owns rows p*G .. p*G+G-1."""

    examples: list  # [P] Example
    prompt_ids: torch.Tensor  # [B, Tp] left-padded
    prompt_mask: torch.Tensor  # [B, Tp]
    completion_ids: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T] float: generated tokens (attention and lengths)
    sampler_logp: torch.Tensor  # [B, T]
    lengths: torch.Tensor  # [B]
    truncated: torch.Tensor  # [B] bool
    texts: list[str]  # [B] decoded completions
    group_size: int
    scores: torch.Tensor | None = None  # [B] task scores, as the task returned them
    rewards: torch.Tensor | None = None  # [B] the scalar return the advantage sees (shaped: clip, penalties, KL)
    token_rewards: torch.Tensor | None = None  # [B, T] per-token rewards (terminal score, KL in the reward)
    correct: torch.Tensor | None = None  # [B] bool
    components: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [B]
    baseline: torch.Tensor | None = None  # [B] e.g. ReMax's greedy-rollout reward
    loss_mask: torch.Tensor | None = None  # [B, T] tokens that enter the loss (default: mask)
    old_logp: torch.Tensor | None = None  # [B, T]; None until the update's forward with train.old_logp_from_update
    ref_logp: torch.Tensor | None = None  # [B, T]
    entropy: torch.Tensor | None = None  # [B, T] full-vocabulary entropy of π_old (when an algorithm needs it)
    answer_mask: torch.Tensor | None = None  # [B, T] float: tokens of the task's answer span (fine-grained credit)
    adv: torch.Tensor | None = None  # [B] or [B, T]
    is_weight: torch.Tensor | None = None  # [B, T] behaviour correction from π_old and μ (bench/rl/objective.py)
    values: torch.Tensor | None = None  # [B, T] V_old(s_t) from the behaviour pass (actor-critic: bench/rl/value.py)
    returns: torch.Tensor | None = None  # [B, T] value targets R̂_t (actor-critic)
    macro_index: torch.Tensor | None = None  # [B, T] long: macro action of each token, −1 on padding (rl/segment.py)
    step_rewards: torch.Tensor | None = None  # [B, T] the task's process rewards on each step's last token
    step_ends: torch.Tensor | None = None  # [B, T] bool: the tokens where the task's steps end (process rewards)
    action_tokens: torch.Tensor | None = None  # [B] long: episodes: tokens the policy generated (not observations)
    turn_index: torch.Tensor | None = None  # [B, T] long: episodes: the turn of each token, −1 on padding
    anchors: list | None = None  # [B] episodes: the observation each action answered, per turn (GiGPO's anchors)
    row_key: torch.Tensor | None = None  # [B] long: (round, global prompt, sample) of each row: one process's order
    owned: torch.Tensor | None = None  # [B] bool: the rows this rank trains (None: all; bench/dist.py)

    @property
    def size(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def train_mask(self) -> torch.Tensor:
        """[B, T] tokens that enter the loss: ``loss_mask`` when a truncation policy set one, else ``mask``."""
        return self.mask if self.loss_mask is None else self.loss_mask

    @property
    def generated_tokens(self) -> torch.Tensor:
        """[B] tokens the policy generated: the completion, less an episode's observations (prefilled, not sampled)."""
        return self.lengths if self.action_tokens is None else self.action_tokens

    @property
    def num_groups(self) -> int:
        return self.size // self.group_size

    def select_groups(self, keep: torch.Tensor) -> Rollout:
        """The rollout restricted to the groups where ``keep`` [P] is True."""
        return self.select_groups_in(keep.nonzero().squeeze(-1))

    @staticmethod
    def concat(parts: list[Rollout]) -> Rollout:
        """Stack rollouts of the same group size (prompts re-padded on the left, completions on the right)."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        out = {}
        for f in fields(first):
            vals = [getattr(p, f.name) for p in parts]
            if f.name in ("examples", "texts") or (f.name in ROW_LISTS and vals[0] is not None):
                out[f.name] = [x for v in vals for x in v]
            elif f.name == "group_size":
                out[f.name] = first.group_size
            elif f.name == "components":
                out[f.name] = {k: torch.cat([v[k] for v in vals]) for k in vals[0]}
            elif vals[0] is None:
                out[f.name] = None
            elif vals[0].dim() == 2:  # padding is masked: its value never matters
                pad = -1 if f.name in ("macro_index", "turn_index") else 0
                out[f.name] = _pad_cat(vals, pad, left=f.name in ("prompt_ids", "prompt_mask"))
            else:
                out[f.name] = torch.cat(vals)
        return Rollout(**out)

    def gather(self) -> Rollout:
        """Every rank's rollout as one (bench/dist.py), rows in the order one process would hold them (by
        ``row_key``), identical on every rank, with ``owned`` marking this rank's rows. On one process: itself."""
        from bench import dist

        if not dist.active():
            return self
        out, counts = {}, None
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "owned":
                continue
            if f.name in ("examples", "texts") or (f.name in ROW_LISTS and v is not None):
                out[f.name] = [x for part in dist.gather_objects(v) for x in part]
            elif f.name == "group_size":
                out[f.name] = v
            elif f.name == "components":
                out[f.name] = {k: dist.gather_rows(t)[0] for k, t in v.items()}
            elif v is None:
                out[f.name] = None
            else:
                pad = -1 if f.name in ("macro_index", "turn_index") else 0
                out[f.name], counts = dist.gather_rows(v, pad, left=f.name in ("prompt_ids", "prompt_mask"))
        mine = torch.zeros(sum(counts), dtype=torch.bool, device=self.mask.device)
        start = sum(counts[: dist.rank()])
        mine[start : start + counts[dist.rank()]] = True
        whole = Rollout(**out, owned=mine)
        order = whole.row_key.argsort(stable=True)
        groups = order[:: self.group_size] // self.group_size  # a group's rows stay together: reorder by groups
        return whole.select_groups_in(groups)

    def select_groups_in(self, groups: torch.Tensor) -> Rollout:
        """The rollout's groups in the order ``groups`` [number of groups] gives (each group's rows kept together)."""
        G = self.group_size
        rows = groups.repeat_interleave(G) * G + torch.arange(G, device=groups.device).repeat(len(groups))
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "examples":
                v = [v[i] for i in groups.tolist()]
            elif f.name in ("texts", *ROW_LISTS) and v is not None:
                v = [v[i] for i in rows.tolist()]
            elif f.name == "components":
                v = {k: t[rows.to(t.device)] for k, t in v.items()}
            elif isinstance(v, torch.Tensor):
                v = v[rows.to(v.device)]
            out[f.name] = v
        return Rollout(**out)

    def rows(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """The tensors an algorithm's loss reads, for a subset of rows (a micro-batch). ``mask`` is the loss mask;
        ``completion_mask`` the attention mask of the generated tokens."""
        loss_mask = self.train_mask
        out = {
            "prompt_ids": self.prompt_ids[idx],
            "prompt_mask": self.prompt_mask[idx],
            "completion_ids": self.completion_ids[idx],
            "completion_mask": self.mask[idx],
            "mask": loss_mask[idx],
            "rewards": self.rewards[idx],
            "sampler_logp": self.sampler_logp[idx],
            "adv": self.adv[idx],
            "group": idx // self.group_size,
        }
        # optional per-token tensors, present when computed (values, returns, macro_index: actor-critic, rl/value.py)
        for name in ("old_logp", "ref_logp", "entropy", "answer_mask", "values", "returns", "macro_index", "is_weight"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)[idx]
        return out
