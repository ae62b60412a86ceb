"""Shared machinery for fine-grained credit assignment (GTPO, GRPO-S, TEMPO, TS-GRPO; ../shared/docs/algorithms.md,
"Fine-grained credit").

* Behaviour entropies: an algorithm that sets ``needs_entropy`` gets ``Rollout.entropy`` [B, T], the full-vocabulary
  entropy of π_old (temperature-scaled, as sampled) from the same forward as log π_old
  (``RLModule.behaviour_logprobs``).
* The group's prefix trie: V(s) = mean reward of the group's completions that start with prefix s (TEMPO), per token
  before and after it, and where siblings branch.
* Answer spans as token masks: ``Task.answer_span`` gives characters; ``span_token_mask`` maps them to tokens.
* Statistics over selected tokens of a group (z-scores of token rewards, GTPO).

Pure tensor functions; shapes: P prompts, G group size, B = P·G completions (rows p·G .. p·G+G−1 are prompt p's),
T completion tokens (right-padded; ``mask`` is a prefix of ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch


# ---- the group's prefix trie -----------------------------------------------------------------------------------------
def common_prefix_lengths(completion_ids: torch.Tensor, mask: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B, G]: lcp[i, j] = number of leading tokens completion i shares with completion j of its group (tokens past a
    completion's end never match; lcp[i, i] = L_i)."""
    B, T = completion_ids.shape
    assert B % group_size == 0, f"batch of {B} is not a whole number of groups of {group_size}"
    ids = completion_ids.view(-1, group_size, T)  # [P, G, T]
    live = mask.bool().view(-1, group_size, T)
    out = []
    for p in range(ids.shape[0]):  # one group at a time: [G, G, T] stays small for G <= 64
        same = (ids[p, :, None] == ids[p, None]) & live[p, :, None] & live[p, None]  # [G, G, T]
        out.append(same.long().cumprod(-1).sum(-1))  # [G, G]: length of the run of matches from position 0
    return torch.cat(out)  # [B, G]


class PrefixValues(NamedTuple):
    before: torch.Tensor
    """[B, T] V(s_t): mean reward of the group's completions that share completion i's first t tokens (0 at padding)."""
    after: torch.Tensor
    """[B, T] V(s_{t+1}): the same over completions that also share token t (0 at padding)."""
    branch: torch.Tensor
    """[B, T] bool: the node s_t has more than one continuation in the group (a sibling diverges, or ends, at t)."""


def prefix_values(
    completion_ids: torch.Tensor, mask: torch.Tensor, rewards: torch.Tensor, group_size: int
) -> PrefixValues:
    """Values of the group's prefix trie along each completion. A node's value is the mean reward of the completions
    below it (those that start with its prefix); a completion's own reward is always among them.

    completion_ids, mask: [B, T]; rewards: [B]. Where no sibling diverges, before == after exactly (both are the same
    sums over the same completions), so a TD term V(s_{t+1}) − V(s_t) is exactly 0 there.
    """
    B, T = completion_ids.shape
    G = group_size
    lcp = common_prefix_lengths(completion_ids, mask, G)  # [B, G]
    r = rewards.view(-1, G).repeat_interleave(G, 0)  # [B, G]: rewards of each row's group
    # Histograms over the common-prefix length k = lcp[i, j] (0..T), then suffix sums: Σ_j 1[lcp_ij >= t] (r_j, 1).
    count = torch.zeros(B, T + 2, dtype=rewards.dtype, device=rewards.device)
    count.scatter_add_(1, lcp, torch.ones_like(r))
    total = torch.zeros_like(count).scatter_add_(1, lcp, r)
    count_ge = count.flip(-1).cumsum(-1).flip(-1)  # [B, T + 2]: count_ge[:, t] = #{j : lcp_ij >= t}
    total_ge = total.flip(-1).cumsum(-1).flip(-1)
    m = mask.bool()
    zero = torch.zeros(B, T, dtype=rewards.dtype, device=rewards.device)
    before = torch.where(m, total_ge[:, :T] / count_ge[:, :T].clamp(min=1), zero)
    after = torch.where(m, total_ge[:, 1 : T + 1] / count_ge[:, 1 : T + 1].clamp(min=1), zero)
    branch = m & (count[:, :T] > 0)  # some j has lcp_ij == t < L_i: it leaves i's path at node s_t
    return PrefixValues(before, after, branch)


# ---- answer spans as token masks -------------------------------------------------------------------------------------
def token_char_offsets(tokenizer, ids: Sequence[int]) -> list[tuple[int, int]]:
    """Character range [start, end) of each token in ``tokenizer.decode(ids, skip_special_tokens=True)`` (special
    tokens decode to nothing, as in the rollout's texts). A character belongs to the token at which the text first
    holds it: a multi-byte character to the token that completes it (the ones before it are empty), an invalid byte
    run's replacement characters to the token at which the decoder gives up on it (a later one), a run left
    incomplete at the end to the last token. The ranges tile the decoded text.

    From the tokenizers library's incremental ``DecodeStream``: O(L), one step per token (34.7 ms a row at L = 512 by
    decoding every prefix; 0.3 ms this way). A tokenizer without a fast backend, or whose ``decode`` differs from the
    stream's text (a clean-up of spaces, say), takes the prefix decodes: the same ranges on valid text."""
    ends = _stream_ends(tokenizer, ids)
    if ends is None:
        ends, longest = [], 0
        for text in tokenizer.batch_decode([list(ids[: k + 1]) for k in range(len(ids))], skip_special_tokens=True):
            # a prefix ending inside a multi-byte character decodes to a replacement character the next token
            # replaces: the character belongs to the token at which the text holds it for good
            text = text.removesuffix("\ufffd") if len(ends) < len(ids) - 1 else text
            longest = max(longest, len(text))
            ends.append(longest)
    return list(zip([0, *ends[:-1]], ends, strict=True))


def _stream_ends(tokenizer, ids: Sequence[int]) -> list[int] | None:
    """Each token's end offset from ``DecodeStream`` (None: no fast backend, or text other than ``decode``'s)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    from tokenizers.decoders import DecodeStream

    stream, pieces, ends = DecodeStream(skip_special_tokens=True), [], []
    try:
        for t in ids:
            pieces.append(stream.step(backend, int(t)) or "")  # None: the token leaves a character unfinished
            ends.append((ends[-1] if ends else 0) + len(pieces[-1]))
    except Exception:  # noqa: BLE001 - an id the backend refuses: the prefix decodes say what decode() says
        return None
    text, streamed = tokenizer.decode(list(ids), skip_special_tokens=True), "".join(pieces)
    tail = text[len(streamed) :]
    if not text.startswith(streamed) or tail.strip("\ufffd") or (tail and not ends):
        return None
    if tail:  # an incomplete byte run at the end: its replacement characters on the last token
        ends[-1] = len(text)
    return ends


def span_token_mask(
    tokenizer,
    completion_ids: torch.Tensor,
    mask: torch.Tensor,
    spans: Sequence[tuple[int, int] | None],
    missing: float = 0.0,
) -> torch.Tensor:
    """[B, T] float: 1 on tokens whose characters overlap the row's span [start, end) (a zero-width token, e.g. EOS,
    counts when it sits inside the span); rows whose span is None get ``missing`` on every generated token."""
    out = torch.zeros_like(mask, dtype=torch.float32)
    for i, (row, m, span) in enumerate(zip(completion_ids.tolist(), mask.tolist(), spans, strict=True)):
        L = int(sum(m))
        if span is None:
            out[i, :L] = missing
            continue
        start, end = span
        for t, (a, b) in enumerate(token_char_offsets(tokenizer, row[:L])):
            out[i, t] = float(a < end and max(b, a + 1) > start)
    return out.to(mask)


# ---- statistics over selected tokens of a group ----------------------------------------------------------------------
def group_token_zscore(
    x: torch.Tensor, select: torch.Tensor, group_size: int, eps: float = 1e-6, unbiased: bool = True
) -> torch.Tensor:
    """[B, T] -> [B, T]: (x − mean) / (std + ε) with mean and std over the selected tokens of each group (every token
    counts once); 0 at unselected tokens, and exactly 0 for a group whose selected values are all equal (or a single
    token), never a rounding error blown up by 1/ε."""
    B, T = x.shape
    P = B // group_size
    xs, sel = x.reshape(P, group_size * T), select.bool().reshape(P, group_size * T)
    zero = torch.zeros_like(xs)
    n = sel.sum(-1, keepdim=True)  # [P, 1]
    mean = torch.where(sel, xs, zero).sum(-1, keepdim=True) / n.clamp(min=1)
    dev = torch.where(sel, xs - mean, zero)
    var = dev.square().sum(-1, keepdim=True) / (n - 1 if unbiased else n).clamp(min=1)
    hi = torch.where(sel, xs, torch.full_like(xs, -torch.inf)).amax(-1, keepdim=True)
    lo = torch.where(sel, xs, torch.full_like(xs, torch.inf)).amin(-1, keepdim=True)
    informative = (hi > lo) & (n > 1)  # [P, 1]
    return torch.where(sel & informative, dev / (var.sqrt() + eps), zero).reshape(B, T)


def masked_stats(x: torch.Tensor, mask: torch.Tensor, prefix: str) -> dict[str, float]:
    """Mean, population std and max of x over the unmasked entries, as ``{prefix}_mean/_std/_max`` (empty when none)."""
    v = x[mask.bool()].double()
    if v.numel() == 0:
        return {}
    return {
        f"{prefix}_mean": float(v.mean()),
        f"{prefix}_std": float(v.std(unbiased=False)),
        f"{prefix}_max": float(v.max()),
    }
