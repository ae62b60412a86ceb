"""Macro actions: segment each completion's tokens into consecutive spans (MA-RLHF, Chai et al., ICLR 2025).

A segmenter returns ``starts`` [B, T] bool (True where a new macro action begins); ``macro_index`` turns it into the
[B, T] long index of each token's macro (0 .. K_i − 1 on generated tokens, −1 on padding), enforcing the two rules
every segmentation shares: the first token starts a macro, and the final token is always a macro of its own (it
carries the terminal score). Masks are right-padded prefixes ([B, T] float or bool).

Termination rules (MA-RLHF): fixed n-gram, randomised n-gram lengths, perplexity rises, and a task-provided
segmenter (``Task.segment``: character offsets, mapped to tokens through the tokenizer's decoding).

Macro reductions weight a macro's tokens by σ (``macro_reduce``): equal (1/|ω|, the mean), unit (the macro's last
token), position (1/(j+1) for its j-th token, normalised), as in the authors' code (``modeling_macro_action``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Literal

import torch

MacroWeight = Literal["equal", "unit", "position", "first"]


def macro_index(starts: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool starts, [B, T] mask -> [B, T] long macro index (−1 on padding). Token 0 and the last generated
    token always start a macro; starts on padding are ignored."""
    m = mask.bool()
    t = torch.arange(m.shape[1], device=m.device)
    last = t == (m.sum(-1, keepdim=True) - 1)  # [B, T]
    s = m & (starts.bool() | (t == 0) | last)
    return torch.where(m, s.long().cumsum(-1) - 1, torch.full_like(t, -1).expand_as(s))


def num_macros(index: torch.Tensor) -> torch.Tensor:
    """[B, T] macro index -> [B] K_i (0 for an empty row)."""
    return index.max(-1).values + 1


def macro_mask(index: torch.Tensor) -> torch.Tensor:
    """[B, T] macro index -> [B, K] float mask of each row's macros (right-padded), K = max_i K_i (at least 1)."""
    K = max(int(num_macros(index).max()), 1) if index.numel() else 1
    return (torch.arange(K, device=index.device) < num_macros(index).unsqueeze(-1)).float()


def _scatter_sum(x: torch.Tensor, index: torch.Tensor, K: int) -> torch.Tensor:
    """Σ of x [B, T] over each macro -> [B, K]; padding (index −1) goes to a dump column that is dropped."""
    idx = torch.where(index < 0, K, index)
    out = torch.zeros(x.shape[0], K + 1, dtype=x.dtype, device=x.device)
    return out.scatter_add(1, idx, torch.where(index < 0, torch.zeros_like(x), x))[:, :K]


def _position_in_macro(index: torch.Tensor) -> torch.Tensor:
    """[B, T] j = position of each token inside its macro (0 for the macro's first token)."""
    t = torch.arange(index.shape[1], device=index.device).expand_as(index)
    is_start = torch.ones_like(index, dtype=torch.bool)
    is_start[:, 1:] = index[:, 1:] != index[:, :-1]
    return t - torch.where(is_start, t, torch.zeros_like(t)).cummax(-1).values


def _unit(index: torch.Tensor) -> torch.Tensor:
    is_last = torch.ones_like(index, dtype=torch.bool)
    is_last[:, :-1] = index[:, :-1] != index[:, 1:]
    return is_last.float()


def _first(index: torch.Tensor) -> torch.Tensor:
    return (_position_in_macro(index) == 0).float()


SIGMA: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "equal": lambda index: torch.ones_like(index, dtype=torch.float),
    "unit": _unit,
    "first": _first,
    "position": lambda index: 1.0 / (_position_in_macro(index) + 1).float(),
}


def macro_reduce(x: torch.Tensor, index: torch.Tensor, weight: MacroWeight = "equal") -> torch.Tensor:
    """x [B, T] -> [B, K]: Σ_{t∈ω_k} σ_t x_t with σ normalised to sum 1 over each macro; 0 for absent macros."""
    K = macro_mask(index).shape[1]
    w = torch.where(index >= 0, SIGMA[weight](index).to(x.dtype), torch.zeros_like(x))
    total = _scatter_sum(w, index, K)  # [B, K]
    w = w / total.gather(1, index.clamp(min=0)).clamp(min=torch.finfo(x.dtype).tiny)
    return _scatter_sum(w * x, index, K)


def macro_sum(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, T] -> [B, K]: the unweighted sum over each macro's tokens."""
    return _scatter_sum(torch.where(index >= 0, x, torch.zeros_like(x)), index, macro_mask(index).shape[1])


def macro_expand(y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """y [B, K] -> [B, T]: each token carries its macro's value; 0 on padding."""
    out = y.gather(1, index.clamp(min=0))
    return torch.where(index >= 0, out, torch.zeros_like(out))


# ---- termination rules: -> starts [B, T] bool ---------------------------------------------------------------------
def fixed_ngram_starts(mask: torch.Tensor, n: int) -> torch.Tensor:
    """A macro every n tokens (n = 1: every token, i.e. PPO)."""
    assert n >= 1, f"n-gram length must be >= 1, got {n}"
    t = torch.arange(mask.shape[1], device=mask.device)
    return (t % n == 0).expand(mask.shape[0], -1)


def random_ngram_starts(mask: torch.Tensor, lengths: Sequence[int], generator: torch.Generator) -> torch.Tensor:
    """Macro lengths drawn i.i.d. uniformly from ``lengths`` for each row, from ``generator`` (seeded by the caller)."""
    B, T = mask.shape
    choices = torch.tensor(list(lengths), dtype=torch.long)  # host: moved at the end
    assert len(choices) > 0 and bool((choices >= 1).all()), f"macro lengths must be >= 1: {list(lengths)}"
    drawn = choices[torch.randint(len(choices), (B, T), generator=generator)]  # host: [B, T] >= T tokens per row
    begin = (drawn.cumsum(-1) - drawn).clamp(max=T)  # [B, T] exclusive cumsum: where each macro begins
    starts = torch.zeros(B, T + 1, dtype=torch.bool).scatter(1, begin, True)[:, :T]  # host: moved at the end
    return starts.to(mask.device)


def perplexity_starts(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A new macro begins at token t where the per-token perplexity rises: ppl_t > ppl_{t−1}, i.e. logp_t < logp_{t−1}
    (logp: the reference or behaviour policy's log-probabilities of the sampled tokens, [B, T])."""
    starts = torch.zeros_like(mask, dtype=torch.bool)
    starts[:, 1:] = logp[:, 1:] < logp[:, :-1]
    return starts


def char_offsets_to_tokens(token_ids: Sequence[int], offsets: Sequence[int], decode: Callable) -> list[int]:
    """Token indices holding each character offset of ``decode(token_ids)``: token t covers characters
    [len(decode(ids[:t])), len(decode(ids[:t+1]))). Prefix decoding (binary search, O(log L) decodes per offset) is
    exact for any tokenizer (a character tokenizer, byte-level BPE), unlike summing per-token strings. Offsets at or
    past the end of the text are dropped."""
    L = len(token_ids)
    end_cache: dict[int, int] = {}

    def end(t: int) -> int:  # len of the text decoded from tokens 0..t
        if t not in end_cache:
            end_cache[t] = len(decode(list(token_ids[: t + 1])))
        return end_cache[t]

    out = []
    for c in offsets:
        t = bisect.bisect_right(range(L), c, key=end)  # first t with end(t) > c
        if t < L:
            out.append(t)
    return out


def task_starts(
    texts: Sequence[str],
    completion_ids: torch.Tensor,
    mask: torch.Tensor,
    decode: Callable[[list[int]], str],
    segment: Callable[[str], list[int] | None],
) -> torch.Tensor:
    """Macro starts from a task's segmenter (character offsets into each decoded completion). ``decode`` must be the
    decoding that produced ``texts`` (e.g. ``tokenizer.decode(ids, skip_special_tokens=True)``)."""
    starts = torch.zeros_like(mask, dtype=torch.bool, device="cpu")
    lengths = mask.bool().sum(-1).tolist()
    for i, (text, ids, L) in enumerate(zip(texts, completion_ids.cpu().tolist(), lengths, strict=True)):
        offsets = segment(text)
        if offsets is None:
            raise ValueError("termination=task needs a task segmenter, but Task.segment returned None")
        for t in char_offsets_to_tokens(ids[:L], offsets, decode):
            starts[i, t] = True
    return starts.to(mask.device)


def step_token_rewards(
    steps: Sequence[Sequence[tuple[int, float]]],
    completion_ids: torch.Tensor,
    mask: torch.Tensor,
    decode: Callable[[list[int]], str],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Process rewards (``Task.process_rewards``: per row, (character offset of a step's last character, reward))
    placed on the token that holds that character -> (rewards [B, T] float, step ends [B, T] bool). Two steps ending
    in one token add up; a step at or past the end of the decoded text (a step the completion never reached) goes on
    its last generated token (the EOS, when it stopped). ``decode`` as in :func:`task_starts`."""
    rewards = torch.zeros(mask.shape, dtype=torch.float32)  # host: moved at the end
    ends = torch.zeros(mask.shape, dtype=torch.bool)  # host: moved at the end
    lengths = mask.bool().sum(-1).tolist()
    for i, (row, ids, L) in enumerate(zip(steps, completion_ids.cpu().tolist(), lengths, strict=True)):
        if not row:
            continue
        if L == 0:
            continue
        row = sorted(row)
        tokens = char_offsets_to_tokens(ids[:L], [c for c, _ in row], decode)  # drops only the offsets past the end
        tokens += [L - 1] * (len(row) - len(tokens))
        for t, (_, r) in zip(tokens, row, strict=True):
            rewards[i, t] += r
            ends[i, t] = True
    return rewards.to(mask.device), ends.to(mask.device)
