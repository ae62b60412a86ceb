"""Preference data from verifiable rewards: pairs (or labelled single samples) from groups of G scored completions
of one prompt, and the on-disk cache of the offline samples drawn once from the SFT start.

Groups are rows p·G .. p·G+G−1 of a rollout, as everywhere in the harness. Ties never make a pair: a pair's chosen
completion scored strictly higher than its rejected one.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal

import torch

from bench.engine.rollout import Generation

PairSelection = Literal["all", "random", "max_margin", "rso"]


def _strict_pairs(s: list[float]) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(s)) for j in range(len(s)) if s[i] > s[j]]


def _rso_accept(s: list[float], beta: float, n: int, gen: torch.Generator) -> list[int]:
    """RSO's statistical rejection sampling (Liu et al. 2024, Algorithm 1) over one group's candidates: repeat
    {r_max = the best not-yet-accepted reward; accept each remaining candidate with probability exp((r − r_max)/β)}
    until ``n`` are accepted (in acceptance order)."""
    left, accepted = list(range(len(s))), []
    while left and len(accepted) < n:
        r_max = max(s[i] for i in left)
        u = torch.rand(len(left), generator=gen).tolist()  # host: host-side pairing
        took = [i for i, ui in zip(left, u, strict=True) if ui < math.exp((s[i] - r_max) / beta)]
        accepted += took[: n - len(accepted)]
        left = [i for i in left if i not in took]
    return accepted


def _pick_all(s, cand, gen, beta):
    return cand


def _pick_random(s, cand, gen, beta):
    return [cand[int(torch.randint(len(cand), (1,), generator=gen))]]  # host: host-side pairing


def _pick_max_margin(s, cand, gen, beta):
    return [(max(range(len(s)), key=s.__getitem__), min(range(len(s)), key=s.__getitem__))]


def _pick_rso(s, cand, gen, beta):
    a = _rso_accept(s, beta, 2, gen)
    if len(a) < 2 or s[a[0]] == s[a[1]]:
        return []
    return [(max(a, key=s.__getitem__), min(a, key=s.__getitem__))]


SELECTIONS = {"all": _pick_all, "random": _pick_random, "max_margin": _pick_max_margin, "rso": _pick_rso}
"""pair_selection -> (group scores, its strictly ordered pairs, generator, RSO β) -> the pairs kept."""


def select_pairs(
    scores: torch.Tensor, group_size: int, how: PairSelection, gen: torch.Generator, rso_beta: float = 0.5
) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen rows, rejected rows), each [N] long, from each group of ``group_size`` rows:
    ``all``: every strictly ordered pair; ``random``: one of them, uniformly; ``max_margin``: the best against the
    worst (first of equals); ``rso``: two candidates accepted by RSO's rejection sampling at temperature β, ordered
    by score (none when they tie). A group whose scores are all equal gives no pair."""
    if how not in SELECTIONS:
        raise ValueError(f"unknown pair_selection {how!r}: choose one of {', '.join(SELECTIONS)}")
    w, lo = [], []
    s_all = scores.tolist()
    for g0 in range(0, len(s_all), group_size):
        s = s_all[g0 : g0 + group_size]
        cand = _strict_pairs(s)
        for i, j in SELECTIONS[how](s, cand, gen, rso_beta) if cand else ():
            w.append(g0 + i)
            lo.append(g0 + j)
    return torch.tensor(w, dtype=torch.long), torch.tensor(lo, dtype=torch.long)  # host: host-side pair indices


def labelled_rows(scores: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unpaired data (KTO, A-LoL): (rows [N], desirable [N] bool, advantage [N]) with advantage = score − the mean
    score of the row's group (a Monte-Carlo V(x) of the policy that sampled the group); desirable when above the
    mean, undesirable when below, rows equal to it (every row of a constant group) left out."""
    g = scores.view(-1, group_size)
    adv = (g - g.mean(1, keepdim=True)).flatten()
    rows = (adv != 0).nonzero().squeeze(-1)
    return rows, adv[rows] > 0, adv[rows]


class SampleCache:
    """Offline samples on disk, one file per training step: the G completions of each of the step's prompts drawn
    once from the SFT start, reused by every run whose key (model, start, task, seed, sampling settings) matches."""

    FIELDS = ("completion_ids", "mask", "sampler_logp", "lengths", "truncated")

    def __init__(self, root: Path):
        self.root = root

    def path(self, step: int) -> Path:
        return self.root / f"step_{step:06d}.pt"

    def load(self, step: int, device: torch.device | str = "cpu") -> Generation | None:
        p = self.path(step)
        if not p.exists():
            return None
        data = torch.load(p, weights_only=True, map_location=device)
        return Generation(**{k: data[k] for k in self.FIELDS})

    def save(self, step: int, gen: Generation) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.path(step).with_suffix(f".tmp{os.getpid()}")
        torch.save({k: getattr(gen, k).cpu() for k in self.FIELDS}, tmp)
        tmp.replace(self.path(step))  # atomic: a concurrent reader sees the whole file or none
