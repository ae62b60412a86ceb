"""The vLLM engine's checks on a CUDA machine (`make gpu-check`; marked gpu, deselected everywhere else): after a
push the engine's log-probs equal the learner's (float32, and bfloat16 within its precision), greedy completions equal
the hf engine's in float32; GRPO with the engine raises held-out accuracy from its warm start with the sampler/learner
KL bounded after every push; bf16-mixed with a bfloat16 engine; and every algorithm's step on CUDA. The same checks as
tests/test_vllm.py and tests/test_algorithms.py, on the `vllm` package and CUDA kernels."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from bench.config import compose
from bench.engine import vllm as V
from bench.engine.policy import load_policy
from bench.registry import ALGORITHMS
from tests.test_vllm import TINY, _engine_logprobs, _greedy_equal, _learner_logprobs, _prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(not V.available(), reason=f"vLLM is not installed: {V.INSTALL}"),
]


@pytest.mark.parametrize(("dtype", "bound"), [("float32", 1e-3), ("bfloat16", 0.1)])
def test_engine_logprobs_equal_the_learners_on_cuda(dtype, bound, tmp_path):
    from bench.engine.rollout import generate

    cfg = OmegaConf.to_object(compose(["algorithm=grpo", "task=countdown", *TINY]))
    policy, tokenizer = load_policy(cfg.model, 0)
    policy = policy.cuda().eval()
    prompts = {k: v.cuda() for k, v in _prompts(cfg, tokenizer).items() if torch.is_tensor(v)}
    engine = V.VLLMEngine(policy, tmp_path / "engine", dtype=dtype, max_model_len=256, seed=0, gpu_memory=0.2,
                          cpu_kv_gb=1)  # fmt: skip
    gen = generate(policy, prompts["prompt_ids"], prompts["prompt_mask"], group_size=1, max_new_tokens=16,
                   temperature=1.0, top_p=1.0, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id, seeds=list(range(len(prompts["prompt_ids"]))))  # fmt: skip
    ids, mask = gen.completion_ids, gen.mask
    learner = _learner_logprobs(policy, prompts, ids, mask)
    gap = float(((_engine_logprobs(engine, prompts, ids, mask).to(learner.device) - learner).abs() * mask).max())
    print(f"cuda, engine in {dtype}: max |engine - learner| log-prob {gap:.2e}")
    assert gap < bound
    if dtype == "float32":
        _greedy_equal(policy, tokenizer, engine, prompts, 24)


def _history(client, rid: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(rid, key)]


def test_grpo_with_the_engine_raises_accuracy_from_its_warm_start_on_cuda(store):
    """The embedded default (the tiny model, its 600-step SFT warm start, Countdown, GRPO at P 16 x G 8) with rollout
    from a float32 vLLM engine on the GPU, 60 steps: held-out accuracy on 1,000 problems rises from the warm start
    (on CPU this setting gains 0.05-0.08 by step 40 on every seed: results/precision), and after every push the
    sampler/learner KL is kernel rounding only (< 1e-3, as on CPU)."""
    from mlflow.tracking import MlflowClient

    from bench.run.train import train

    args = ["trainer.accelerator=gpu", "trainer.max_steps=60", "trainer.eval_every=20", "trainer.progress_bar=false",
            "rollout.engine=vllm", *store["args"]]  # fmt: skip
    rid = train(compose(args)).run_id
    client = MlflowClient(store["uri"])
    acc = _history(client, rid, "eval/accuracy")
    kl = [v for _, v in _history(client, rid, "rollout/mismatch_kl")]
    sync = [v for _, v in _history(client, rid, "time/weight_sync")]
    print(f"cuda, GRPO with a float32 engine: eval/accuracy {acc}; max |mismatch KL| {max(map(abs, kl)):.2e}")
    assert [s for s, _ in acc] == [0, 20, 40, 60]
    assert acc[-1][1] >= acc[0][1] + 0.03, acc
    assert len(kl) == 60 and max(map(abs, kl)) < 1e-3
    assert len(sync) == 60 and all(v > 0 for v in sync[1:])
    assert client.get_run(rid).data.params["engine/devices"] == "cuda:0"


def test_bf16_mixed_with_a_bfloat16_engine_keeps_the_mismatch_small_on_cuda(store):
    """trainer.precision=bf16-mixed, sampling from a bfloat16 engine with token TIS: 20 steps finish, the mismatch
    KL after each push stays within bfloat16 rounding (< 1e-2), and the engine computes in its own dtype (autocast
    kept out of it)."""
    from mlflow.tracking import MlflowClient

    from bench.run.train import train

    args = ["trainer.accelerator=gpu", "trainer.precision=bf16-mixed", "trainer.max_steps=20",
            "trainer.eval_every=20", "trainer.progress_bar=false", "rollout.engine=vllm",
            "rollout.sampler_dtype=bfloat16", "algorithm.is_correction=tis", *store["args"]]  # fmt: skip
    rid = train(compose(args)).run_id
    client = MlflowClient(store["uri"])
    kl = [v for _, v in _history(client, rid, "rollout/mismatch_kl")]
    print(
        f"cuda, bf16-mixed with a bfloat16 engine: mismatch KL median {sorted(kl)[len(kl) // 2]:.2e} max {max(kl):.2e}"
    )
    assert client.get_run(rid).info.status == "FINISHED"
    assert len(kl) == 20 and max(map(abs, kl)) < 1e-2


ALGORITHMS_ON_CUDA = [n for n in ALGORITHMS.names() if n != "sft"]  # sft: every run's warm start below


@pytest.mark.parametrize("name", ALGORITHMS_ON_CUDA)
def test_every_algorithm_steps_on_cuda_under_bf16_mixed(name, store):
    """Every registered algorithm (critic-free, PPO and MA-PPO with their value model, the preference family, the
    tree and continuation methods) runs 2 steps on the GPU under bf16-mixed from an SFT warm start on the GPU: what a
    tensor made on the wrong device (a bare constructor, a .cpu() that meets a CUDA tensor) fails. Finite losses."""
    from mlflow.tracking import MlflowClient

    from bench.run.train import train
    from tests.test_algorithms import ALL_RIGHT, CHEAPER, CONTRACT

    task = "chain" if getattr(ALGORITHMS.get(name).Config(), "reward_shaping", None) == "process" else "countdown"
    args = [f"algorithm={name}", f"task={task}", *CONTRACT, *(ALL_RIGHT if task == "countdown" else []),
            *CHEAPER.get(name, []), "trainer.accelerator=gpu", "trainer.precision=bf16-mixed",
            *store["args"]]  # fmt: skip
    rid = train(compose(args)).run_id
    client = MlflowClient(store["uri"])
    assert client.get_run(rid).info.status == "FINISHED"
    losses = [v for _, v in _history(client, rid, "loss/total")]
    assert all(map(math.isfinite, losses)), losses
