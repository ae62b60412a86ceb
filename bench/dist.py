"""One run on several processes (``trainer.devices``, ``trainer.num_nodes``, ``trainer.strategy``): who this process
is, and the few collectives a step needs so that N processes compute what one would on the same global batch.

Lightning launches the processes (its subprocess launcher, torchrun, SLURM) and initialises the process group; this
module only reads it. Every helper is the identity on one process, so single-device code paths are unchanged.

How a step is split (bench/rl/module.py): every rank draws the same global batch of P prompts (a pure function of
(seed, step)) and samples the groups of its own contiguous slice of P / N prompts, each prompt seeded by its global
index, so the samples are those one process would draw. Rewards are computed where the completions are. The rollout
is then gathered (``gather_rows``): every rank holds the global batch, and everything computed from it (behaviour
corrections over the step, reward shaping, advantages with batch statistics, preference pairs) is computed on it as on
one process. Each rank runs forward and backward only on its own rows, with the step's global denominators, and the
gradients are summed across ranks (``all_reduce_grads``) before clipping: the update equals the one-process update
up to floating-point summation order.
"""

from __future__ import annotations

import functools
import os
import time

import torch
import torch.distributed as dist

collective_s = 0.0  # seconds this process has spent in the collectives below (time/collectives per step)
_depth = 0


def timed(fn):
    """Add the call's wall-clock to ``collective_s`` (the outermost call only: helpers call one another)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        global collective_s, _depth
        if not active():
            return fn(*args, **kwargs)
        _depth += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _depth -= 1
            if _depth == 0:
                collective_s += time.perf_counter() - t0

    return wrapper


def take_collective_s() -> float:
    """Seconds spent in collectives since the last call."""
    global collective_s
    out, collective_s = collective_s, 0.0
    return out


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world() -> int:
    return dist.get_world_size() if active() else 1


def env_rank(devices: int = 1) -> int:
    """This process's global rank from the launcher's environment, before the process group exists: RANK (torchrun),
    SLURM_PROCID, or NODE_RANK x devices + LOCAL_RANK (Lightning's own launcher)."""
    for key in ("RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key])
    return int(os.environ.get("NODE_RANK", 0)) * devices + int(os.environ.get("LOCAL_RANK", 0))


def part(n: int) -> slice:
    """This rank's contiguous share of n items (n must divide by the world size)."""
    k = n // world()
    return slice(rank() * k, (rank() + 1) * k)


def share(n: int) -> slice:
    """This rank's contiguous share of n items in rank order, the first ranks taking one more when n does not divide
    (the evaluation's problems)."""
    k, extra = divmod(n, world())
    start = rank() * k + min(rank(), extra)
    return slice(start, start + k + (rank() < extra))


@timed
def all_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (in place; the identity on one process)."""
    if active():
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


@timed
def sum_floats(*values: float) -> list[float]:
    """Sums over ranks of a few Python numbers."""
    if not active():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


@timed
def sum_dict(values: dict[str, float]) -> dict[str, float]:
    """Key-wise sums over ranks; a key missing on a rank counts 0 there."""
    if not active():
        return dict(values)
    keys = sorted(set().union(*gather_objects(set(values))))
    return dict(zip(keys, sum_floats(*(values.get(k, 0.0) for k in keys)), strict=True))


@timed
def gather_objects(obj) -> list:
    """Every rank's ``obj``, in rank order."""
    if not active():
        return [obj]
    out = [None] * world()
    dist.all_gather_object(out, obj)
    return out


@timed
def gather_rows(x: torch.Tensor, pad_value=0, left: bool = False) -> tuple[torch.Tensor, list[int]]:
    """Concatenate every rank's ``x`` along dim 0 (row counts may differ), padding dim 1 to the widest (on the right,
    or on the ``left`` for left-padded prompts); -> (the global tensor, each rank's row count)."""
    if not active():
        return x, [x.shape[0]]
    shapes = gather_objects(tuple(x.shape))
    rows = [s[0] for s in shapes]
    width = max(s[1] for s in shapes) if x.dim() > 1 else None
    if width is not None and x.shape[1] < width:
        pad = x.new_full((x.shape[0], width - x.shape[1], *x.shape[2:]), pad_value)
        x = torch.cat([pad, x], 1) if left else torch.cat([x, pad], 1)
    most = max(rows)
    if x.shape[0] < most:  # all_gather needs equal shapes: pad rows, cut them off after
        x = torch.cat([x, x.new_full((most - x.shape[0], *x.shape[1:]), pad_value)])
    out = [torch.empty_like(x) for _ in range(world())]
    dist.all_gather(out, x.contiguous())
    return torch.cat([o[:n] for o, n in zip(out, rows, strict=True)]), rows


@timed
def all_reduce_grads(params) -> None:
    """Sum every parameter's gradient over ranks (a rank without a gradient for one contributes zeros)."""
    if not active():
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank."""
    return bool(sum_floats(float(flag))[0] > 0)
