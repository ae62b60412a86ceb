"""The vLLM engine's checks on a CUDA machine (`make gpu-check`; marked gpu, deselected everywhere else): after a
push the engine's log-probs equal the learner's (float32, and bfloat16 within its precision), greedy completions equal
the hf engine's in float32, and GRPO trains 50 steps on Countdown with the engine on the GPU. The same checks as
tests/test_vllm.py, on the `vllm` package and CUDA kernels."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from bench.config import compose
from bench.engine import vllm as V
from bench.engine.policy import load_policy
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


def test_grpo_trains_with_the_engine_on_cuda(store):
    from mlflow.tracking import MlflowClient

    from bench.run.train import train

    args = ["algorithm=grpo", "task=countdown", *TINY, "init=sft", "warm_start.max_steps=100",
            "trainer.accelerator=gpu", "rollout.prompts_per_step=4", "rollout.group_size=8",
            "rollout.max_new_tokens=24", "task.num_eval=100", "eval.batch_size=100", "trainer.max_steps=50",
            "trainer.eval_every=10", "trainer.progress_bar=false", "rollout.engine=vllm",
            "rollout.sampler_dtype=bfloat16", "algorithm.is_correction=tis", *store["args"]]  # fmt: skip
    rid = train(compose(args)).run_id
    client = MlflowClient(store["uri"])
    assert [m.step for m in client.get_metric_history(rid, "eval/accuracy")] == [0, 10, 20, 30, 40, 50]
    for key in ("rollout/mismatch_kl", "time/weight_sync", "engine/gpu_allocated_gb"):
        values = [m.value for m in client.get_metric_history(rid, key)]
        print(key, f"median {sorted(values)[len(values) // 2]:.4g}")
        assert len(values) == 50
