"""The behaviour policy μ that rollouts are sampled from, under a controlled mismatch with the learner.

``rollout.sampler_dtype`` samples from a copy of the policy in a lower precision (bfloat16), refreshed every step,
as inference engines sample from their own low-precision weights; ``rollout.staleness = k`` samples step s from the
policy's weights of step max(0, s − k), as a k-step asynchronous pipeline does. With staleness 0 and float32 there is
no copy at all: the policy samples itself, the path every run took before these switches existed.
``rollout.sampler_attention`` picks the copy's attention kernel, as an inference engine picks its own: on this CPU
PyTorch's SDPA flash kernel is slow in bfloat16 at decode (1.8 ms against 0.4 ms in float32 per SmolLM2 layer
call), and the plain matmul attention ("eager") sampled 1.29-1.47x faster from the same bfloat16 weights on unpadded
prompts; on padded prompts SDPA takes another kernel and the gain is not there (results/perf/sampler_attention.md).

``rollout.engine=vllm`` samples from a vLLM engine in this process instead (bench/engine/vllm.py): before the first
rollout of each step it receives the policy's weights of step max(0, s − k) in ``sampler_dtype`` (merged under LoRA),
and its own log-probs are log μ; there is always a mismatch (another engine's kernels), never the policy itself.

The learner always recomputes log π_old with its current weights; the sampler's own log-probs are log μ, so
π_old/μ measures both mismatches (``rollout/mismatch_kl``) and the corrections of bench/rl/objective.py use it.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable

import torch

from bench import dist
from bench.engine.rollout import Generation, branch, generate

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ATTENTION = ("model", "eager", "sdpa")  # model: the policy's own implementation


class BehaviourPolicy:
    """``model(policy, step)`` returns the module to sample step ``step`` from: ``policy`` itself, or a frozen copy
    in ``dtype`` holding the trainable weights of ``staleness`` steps ago (frozen weights never change, so only the
    trainable ones are kept per step)."""

    def __init__(self, dtype: str = "float32", staleness: int = 0, attention: str = "model",
                 engine: Callable[[torch.nn.Module], object] | None = None):  # fmt: skip
        if dtype not in DTYPES:
            raise ValueError(f"rollout.sampler_dtype={dtype!r}: choose one of {', '.join(DTYPES)}")
        if staleness < 0:
            raise ValueError(f"rollout.staleness must be >= 0 (updates between sampling and training), got {staleness}")
        if attention not in ATTENTION:
            raise ValueError(f"rollout.sampler_attention={attention!r}: choose one of {', '.join(ATTENTION)}")
        self.dtype, self.staleness, self.attention = DTYPES[dtype], staleness, attention
        self.history: deque[dict[str, torch.Tensor]] = deque(maxlen=staleness + 1)
        self.copy: torch.nn.Module | None = None
        self.step: int | None = None
        self.make_engine, self.engine = engine, None
        """An inference engine (rollout.engine=vllm): built from the policy on first use, holding ``held``."""
        self.held: tuple | None = None  # ("step", s): the weights of step s; ("current", s): the policy's at step s
        self.history_steps: deque[int] = deque(maxlen=staleness + 1)
        self.sync_s = 0.0  # seconds spent pushing weights into the engine (read and reset by the module)

    @property
    def is_policy(self) -> bool:
        """Whether the policy samples itself (no copy, no engine, no mismatch)."""
        return self.make_engine is None and self.staleness == 0 and self.dtype == torch.float32 and (
            self.attention == "model")  # fmt: skip

    def generate(self, policy: torch.nn.Module, step: int, prompt_ids, prompt_mask, **kw) -> Generation:
        """Sample step ``step``'s rollouts from the behaviour policy (bench.engine.rollout.generate's arguments)."""
        if self.make_engine is None:
            return generate(self.model(policy, step), prompt_ids, prompt_mask, **kw)
        self.sync(policy, step)
        return self.engine.generate(prompt_ids, prompt_mask, **kw)

    def branch(self, policy: torch.nn.Module, step: int, *args, **kw) -> Generation:
        """Continuations from prefixes of step ``step``'s completions (bench.engine.rollout.branch's arguments after
        the model), from the same behaviour policy as the step's rollouts: the engine, or the hf decode loop."""
        if self.make_engine is None:
            return branch(self.model(policy, step), *args, **kw)
        self.sync(policy, step)
        return self.engine.branch(*args, **kw)

    def sync(self, policy: torch.nn.Module, step: int) -> None:
        """The engine holds the weights of step max(0, step − k): pushed when it holds anything else."""
        from bench.engine.vllm import merged_state_dict

        if self.engine is None:
            self.engine = self.make_engine(policy)
            self.held = ("step", step)  # built from the policy as it is now
        if step != self.step:
            self.history.append(merged_state_dict(policy))
            self.history_steps.append(step)
            self.step = step
        want = ("step", self.history_steps[0])
        if self.held != want:
            self.sync_s += self.engine.push(self.history[0])
            self.held = want

    def current(self, policy: torch.nn.Module, step: int):
        """The engine with the policy's current weights (greedy evaluation through the engine), or None without one."""
        from bench.engine.vllm import merged_state_dict

        if self.make_engine is None:
            return None
        if self.engine is None:
            self.engine = self.make_engine(policy)
        elif self.held != ("current", step):
            self.sync_s += self.engine.push(merged_state_dict(policy))
        self.held = ("current", step)
        return self.engine

    def prepare(self, policy: torch.nn.Module) -> None:
        """Make the hf engine's copy now, from the whole module: before FSDP shards the policy (a sharded module is not
        copied); its weights then come from the shards (``trainable``)."""
        if not self.is_policy and self.make_engine is None and self.copy is None:
            self.model(policy, None)

    @staticmethod
    def trainable(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Detached copies of the policy's trainable weights, gathered whole when FSDP shards them (every rank calls
        this at the same points)."""
        whole = dist.full_state_dict(policy, cpu=False, tied=True)
        if whole is None:
            return {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
        names = {n for n, p in policy.named_parameters() if p.requires_grad}  # a tied weight once, as the copy has it
        return {n: w for n, w in whole.items() if n in names}

    def model(self, policy: torch.nn.Module, step: int | None) -> torch.nn.Module:
        if self.is_policy:
            return policy
        if self.copy is None:
            assert not dist.sharded(policy), "the behaviour copy is made before FSDP shards the policy (prepare)"
            self.copy = copy.deepcopy(policy).eval()
            if self.attention != "model":
                self.copy.set_attn_implementation(self.attention)
            for p in self.copy.parameters():
                p.requires_grad_(False)
                if p.is_floating_point():
                    p.data = p.data.to(self.dtype)  # the weights only: buffers (RoPE frequencies) keep their dtype
        device = next(policy.parameters()).device  # a DTensor's is its local shard's
        if next(self.copy.parameters()).device != device:
            # made in configure_model (before FSDP shards the policy), before Lightning moves the policy to its device:
            # the copy is no nn.Module of the LightningModule, so nothing else moves it
            self.copy.to(device)
        if step is not None and step != self.step:  # once per step, whatever the number of sampling rounds
            self.history.append(self.trainable(policy))
            with torch.no_grad():
                params = dict(self.copy.named_parameters())
                for n, w in self.history[0].items():  # the oldest kept: the weights of step max(0, step − k)
                    params[n].copy_(w)
            self.step = step
        return self.copy

    def state_dict(self) -> dict:
        return {"history": [{n: w.cpu() for n, w in h.items()} for h in self.history], "step": self.step,
                "history_steps": list(self.history_steps)}  # fmt: skip

    def load_state_dict(self, state: dict, device) -> None:
        """Resume: the kept weights and the step they were last pushed at; the copy (or the engine's weights) is
        rebuilt at the next step."""
        self.history = deque(
            ({n: w.to(device) for n, w in h.items()} for h in state["history"]), maxlen=self.staleness + 1
        )
        self.step = state["step"]
        self.history_steps = deque(state.get("history_steps", []), maxlen=self.staleness + 1)
        self.held = None  # a rebuilt engine holds the resumed policy's weights, not the kept ones: push them
