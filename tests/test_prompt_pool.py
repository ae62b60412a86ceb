"""rollout.prompt_pool=solvable: the offline pass-rate filter on RL prompts (bench/rl/module.py, solvable_prompts).

A random-init tiny model solves no Countdown problem, so the filter is exercised on a drop-in task, ``coin``: Countdown
prompts whose reward is 1 when a completion's first character has an even code point, which the seeded random model
meets on some samples and not others. The expected pool is recomputed here, independently, from the same seeds.
"""

from __future__ import annotations

import random

import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from bench.config import compose
from bench.engine.policy import load_policy
from bench.engine.rollout import generate, sample_seed
from bench.registry import ALGORITHMS, TASKS
from bench.run.train import resume, train

POOL = ["rollout.prompt_pool=solvable", "rollout.pool_samples=2", "rollout.pool_screened=24", "eval.batch_size=8"]


def _module(small, *overrides):
    cfg = OmegaConf.to_object(compose(["algorithm=grpo", *small, *overrides]))
    policy, tok = load_policy(cfg.model, cfg.seed)
    task = TASKS.get(cfg.task.name)(cfg.task, tok, seed=cfg.seed, prompts_per_step=cfg.rollout.prompts_per_step)
    return ALGORITHMS.get("grpo")(cfg, policy, tok, task)


def test_the_pool_is_the_screened_prompts_solved_at_least_once_and_its_samples_count(small, coin):
    m = _module(small, *coin, *POOL)
    pool = m.solvable_prompts()
    # The same screening, written out: 24 train prompts drawn by the seed, 2 samples each from per-uid seeds.
    screened = random.Random(f"pool-{m.cfg.seed}").sample(m.task.examples("train"), 24)
    expected, samples, tokens = [], 0, 0
    for ex in screened:
        b = m.task.collate_prompts([ex])
        gen = generate(m.policy, b["prompt_ids"], b["prompt_mask"], group_size=2, max_new_tokens=16, temperature=1.0,
                       top_p=1.0, eos_token_id=m.tokenizer.eos_token_id, pad_token_id=m.tokenizer.pad_token_id,
                       seeds=[sample_seed(m.cfg.seed, "pool", ex.uid)])  # fmt: skip
        texts = m.decode(gen.completion_ids, gen.mask)
        if any(m.task.reward(ex, t).score >= 1 for t in texts):
            expected.append(ex.uid)
        samples, tokens = samples + 2, tokens + int(gen.lengths.sum())
    assert [ex.uid for ex in pool] == expected
    assert 4 <= len(pool) < 24, len(pool)  # a real filter: some kept, some dropped
    assert (m.samples_seen, m.tokens_generated) == (samples, tokens)
    assert m.pool_stats["data/pool_screened"] == 24 and m.pool_stats["data/pool_kept"] == len(pool)


def test_the_stream_and_the_resampling_draw_only_from_the_pool(small, coin):
    m = _module(small, *coin, *POOL)
    m.task.prompt_pool = m.solvable_prompts()
    pool = {ex.uid for ex in m.task.prompt_pool}
    batches = iter(m.task.train_dataloader())
    drawn = [ex.uid for _ in range(12) for ex in next(batches)["examples"]]
    assert set(drawn) <= pool and len(set(drawn)) == len(pool)  # every pool prompt comes round, nothing else
    extra = m.task.sample_prompts(4, (0, 3, 1))["examples"]
    assert {ex.uid for ex in extra} <= pool


def test_too_few_solvable_prompts_is_an_error_that_names_the_fix(small):
    """A random-init model answers no Countdown problem: the error says how many were kept and what to change."""
    m = _module(small, "task=countdown", *POOL)
    with pytest.raises(ValueError, match=r"answered 0 of 24 .*rollout\.pool_screened.*rollout\.prompt_pool=all"):
        m.solvable_prompts()


def test_bad_prompt_pool_values_are_config_errors():
    with pytest.raises(ValueError, match=r"'rollout.prompt_pool'.*'easy', expected one of \['all', 'solvable'\]"):
        compose(["rollout.prompt_pool=easy"])
    with pytest.raises(ValueError, match="rollout.pool_screened"):
        compose(["rollout.pool_screened=2"])


def test_a_run_screens_once_logs_the_pool_and_resumes_with_the_same_pool(small, store, coin):
    """Through the real driver: the pool's size is a run parameter, step 0's samples_seen includes the screening, the
    checkpoint carries the pool, and the resumed run trains on with it (no second screening: its budget goes on from
    the checkpoint's)."""
    cfg = compose(["algorithm=grpo", *small, *coin, *POOL, "trainer.max_steps=2", "trainer.checkpoint_every=1"])
    result = train(cfg)
    client = MlflowClient(tracking_uri=store["uri"])
    params = client.get_run(result.run_id).data.params
    kept = int(params["data/pool_kept"])
    assert params["data/pool_screened"] == "24" and 0 < kept < 24, params
    B = 4 * 4  # small: 4 prompts x 4 completions per step
    ckpt = torch.load(result.run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert len(ckpt["bench"]["prompt_pool"]) == kept
    seen = [m.value for m in client.get_metric_history(result.run_id, "rollout/samples_seen")]
    assert seen == [24 * 2 + B, 24 * 2 + 2 * B], seen
    resume(result.run_dir, ["trainer.max_steps=3"])
    seen = [m.value for m in client.get_metric_history(result.run_id, "rollout/samples_seen")]
    assert seen == [24 * 2 + B, 24 * 2 + 2 * B, 24 * 2 + 3 * B], seen
    again = torch.load(result.run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert again["bench"]["prompt_pool"] == ckpt["bench"]["prompt_pool"]
