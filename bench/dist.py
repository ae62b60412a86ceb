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

Under ``trainer.strategy=fsdp`` (Lightning's ModelParallelStrategy with FSDP2's ``fully_shard``, ``shard`` below) the
policy's weights, gradients and optimizer state are sharded over the ranks. FSDP gathers a layer's weights inside
each forward, which every rank must then run together; the rollout's forwards do not (a rank's decode stops at its
own completions' end, its round of DAPO keeps its own number of groups). So the rollout, the behaviour pass and the
evaluation run inside ``full_weights``: each rank gathers the whole weights once and runs its own forwards without
collectives, as verl and TRL gather them for their rollouts. The update runs sharded: every rank runs the same
number of micro-batches (``most``; a rank short of rows runs a zero-weighted one), and FSDP's reduce-scatter sums
the gradients (``shard(sum_gradients=True)``) instead of ``all_reduce_grads``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

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


def comm_device() -> torch.device:
    """Where a collective's tensors must be: the rank's current CUDA device under NCCL (the only backend Lightning
    starts on GPUs), the CPU under gloo.

    Why not a ``cpu:gloo,cuda:nccl`` group that takes both: a CPU tensor reaching a collective on a GPU run is a
    tensor made on the wrong device, and the next op that meets a CUDA tensor fails anyway; and gloo across nodes is a
    second transport to configure (its interface, its ports). So every helper here builds its tensors on this device
    and ``check`` refuses one that is not."""
    if active() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check(x: torch.Tensor, what: str) -> torch.Tensor:
    """``x`` itself when it is on ``comm_device()``; else an error naming the tensor and both devices."""
    want = comm_device()
    if x.device.type != want.type:
        raise RuntimeError(
            f"{what}: a tensor on {x.device} reached a collective whose backend ({dist.get_backend()}) needs {want}: "
            "make it on the device of the tensors it meets (device=...), not with a bare constructor"
        )
    return x


def shutdown(clean: bool = True) -> None:
    """Destroy the process group before the interpreter exits (PyTorch asks for it: a group left to the interpreter's
    teardown can abort a rank with "terminate called without an active exception" while its peer is closing, which
    the launcher reports as a failed run). ``clean``: every rank got here, so a barrier first lets none close its
    connections while another is still in a collective; after an error the group is destroyed without one."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if clean and dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()


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
        dist.all_reduce(check(x, "all_sum"), op=dist.ReduceOp.SUM)
    return x


@timed
def sum_floats(*values: float) -> list[float]:
    """Sums over ranks of a few Python numbers."""
    if not active():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=comm_device())
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
    check(x, "gather_rows")
    shapes = gather_objects(tuple(x.shape))
    rows = [s[0] for s in shapes]
    width = max(s[1] for s in shapes) if x.dim() > 1 else None
    x = pad_for_gather(x, width, max(rows), pad_value, left)  # all_gather needs equal shapes: rows cut off after
    out = [torch.empty_like(x) for _ in range(world())]
    dist.all_gather(out, x.contiguous())
    return torch.cat([o[:n] for o, n in zip(out, rows, strict=True)]), rows


def pad_for_gather(x: torch.Tensor, width: int | None, rows: int, value, left: bool = False) -> torch.Tensor:
    """``x`` padded with ``value`` to ``width`` columns (dim 1, on the left or the right; None: 1-D, no columns) and
    ``rows`` rows (dim 0, at the end); trailing dims untouched."""
    after = [0, 0] * max(x.dim() - 2, 0)  # F.pad lists the last dim first
    if width is not None and x.shape[1] < width:
        x = F.pad(x, [*after, *((width - x.shape[1], 0) if left else (0, width - x.shape[1]))], value=value)
    if x.shape[0] < rows:
        x = F.pad(x, [0, 0] * (x.dim() - 1) + [0, rows - x.shape[0]], value=value)
    return x


@timed
def all_reduce_grads(params) -> None:
    """Sum every parameter's gradient over ranks (a rank without a gradient for one contributes zeros). Parameters
    FSDP shards (DTensors) are left alone: their gradients were reduce-scattered in the backward."""
    if not active():
        return
    from torch.distributed.tensor import DTensor

    for p in params:
        if isinstance(p, DTensor):
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(check(p.grad, "all_reduce_grads"), op=dist.ReduceOp.SUM)


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank."""
    return bool(sum_floats(float(flag))[0] > 0)


def most(n: int) -> int:
    """The largest ``n`` over ranks."""
    if not active():
        return n
    return max(gather_objects(int(n)))


def lockstep(items: list, spare, sharded: bool) -> list[tuple[object, float]]:
    """(item, 1.0) for each of this rank's micro-batches; under FSDP (``sharded``) then (``spare``, 0.0) until it has as
    many as the busiest rank, since every rank must run each forward and backward together."""
    extra = most(len(items)) - len(items) if sharded else 0
    return [(x, 1.0) for x in items] + [(spare, 0.0)] * extra


# ---- FSDP (trainer.strategy=fsdp) ------------------------------------------------------------------------------------
def shard(model: torch.nn.Module, mesh, sum_gradients: bool) -> None:
    """FSDP2's ``fully_shard`` on each transformer block (the classes transformers' ``_no_split_modules`` names, as
    accelerate and TRL wrap them) and on the whole model (embeddings, final norm, head). ``sum_gradients``: the
    reduce-scatter sums the ranks' gradients (the RL losses divide by the global batch's denominators already)
    instead of averaging them."""
    from torch.distributed.fsdp import fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    blocks = set(getattr(base, "_no_split_modules", None) or ())
    if not blocks:
        raise ValueError(
            f"trainer.strategy=fsdp: {type(base).__name__} names no transformer block class (_no_split_modules), "
            "so there is nothing to shard per layer: use trainer.strategy=ddp"
        )
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if sum_gradients:
        for module in fsdp_modules(model):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum


def fsdp_modules(model: torch.nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def sharded(model: torch.nn.Module) -> bool:
    return bool(fsdp_modules(model))


@contextlib.contextmanager
def full_weights(model: torch.nn.Module):
    """Inside: an FSDP-sharded ``model`` holds its whole weights on every rank, gathered once on entry and kept through
    every forward, so ranks may run different numbers of forwards; on exit they are sharded again. Every rank must
    enter together. Nested entries and unsharded models pass through."""
    modules = fsdp_modules(model)
    if not modules or getattr(model, "_bench_full", False):
        yield
        return
    # which weights train: peft's disable_adapter (the LoRA reference's forward) toggles requires_grad on the gathered
    # weights, and FSDP carries the flag of that forward back to its shards; restored on exit
    trains = [(p, p.requires_grad) for p in model.parameters()]
    _gather_whole(modules)
    model._bench_full = True
    try:
        yield
    finally:
        model._bench_full = False
        for m in modules:
            m.reshard()
            m.set_reshard_after_forward(True)
        for p, flag in trains:
            p.requires_grad_(flag)


@timed
def _gather_whole(modules: list) -> None:
    for m in modules:
        m.set_reshard_after_forward(False)
        m.unshard()


def full_state_dict(model: torch.nn.Module, cpu: bool = True, tied: bool = False) -> dict | None:
    """The whole weights of an FSDP-sharded ``model`` on every rank (in CPU memory, or on its device), for
    ``save_pretrained`` (a tied weight once, as it writes an unsharded model) or an engine's weight push (``tied``:
    under each name, as ``state_dict()`` gives them; vLLM's reload reads the LM head's own key); None when it is not
    sharded. Every rank must call it (inside ``full_weights`` too)."""
    if not sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=cpu))
    # a tied weight (the LM head on the embeddings) once, under its first name, as save_pretrained writes it unsharded
    twins = set() if tied else {n for n, _ in model.named_parameters(remove_duplicate=False)} - {
        n for n, _ in model.named_parameters()}  # fmt: skip
    # inside full_weights the values are the gathered parameters themselves, whose storage FSDP frees on exit: copies
    return {k: v if cpu else v.detach().clone() for k, v in whole.items() if k not in twins}


def local(x: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor (the gradient norm of FSDP-sharded parameters) as a plain tensor; others unchanged."""
    from torch.distributed.tensor import DTensor

    return x.full_tensor() if isinstance(x, DTensor) else x
