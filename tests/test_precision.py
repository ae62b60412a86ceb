"""Mixed precision (``trainer.precision=bf16-mixed``, Lightning's own plugin) against float32, and the chunked
log-probs that compute the completion tokens' log π and entropy without the [B, T, V] float32 logits.

One injected step (the rollout and its scores are pure functions of each row's identity: tests/dist_step.py) of GRPO,
PPO with a value model, DPO and SFT runs in each precision from the same weights; the bf16-mixed step's gradient points
where the float32 step's does, its loss is the float32 loss to bfloat16's precision, and the weights the optimizer
holds stay float32 (master weights)."""

from __future__ import annotations

import pytest
import torch
from dist_step import injected_sample, injected_score
from mlflow.tracking import MlflowClient
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from bench.config import compose
from bench.engine.policy import LOGPROB_CHUNK, completion_logprobs, splits_head
from bench.rl.module import RLModule
from bench.run.train import train

STEP = {  # the same rows as tests/test_dist.py's injected steps: 4 prompts x 4 completions, micro-batches of 4
    "grpo": [],
    "ppo": ["algorithm.critic=model"],
    "dpo": [],
    "sft": ["train.batch_size=8"],
}
LOSS = {"grpo": "loss/total", "ppo": "loss/total", "dpo": "loss/total", "sft": "loss/sft"}


def _cos(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    x = torch.cat([t.flatten().double() for t in a])
    y = torch.cat([t.flatten().double() for t in b])
    return float(x @ y / (x.norm() * y.norm()))


@pytest.fixture
def one_step(store, monkeypatch):
    """run(algorithm, precision) -> the step's gradient and the parameters' change (every parameter the optimizer
    steps, in its order, as it sees them: after clipping), their dtypes there, and the logged loss."""
    monkeypatch.setattr(RLModule, "sample", injected_sample)
    monkeypatch.setattr(RLModule, "score", injected_score)
    seen: dict = {}

    def params(optimizer):
        return [p for group in optimizer.param_groups for p in group["params"]]

    def before(optimizer, args, kwargs):
        ps = params(optimizer)  # (SFT's closure computes its gradient inside step(): read it afterwards)
        seen["before"], seen["dtypes"] = [p.detach().clone() for p in ps], {p.dtype for p in ps}

    def after(optimizer, args, kwargs):
        ps = params(optimizer)
        seen["grad"] = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in ps]
        seen["change"] = [p.detach() - q for p, q in zip(ps, seen["before"], strict=True)]

    hooks = [register_optimizer_step_pre_hook(before), register_optimizer_step_post_hook(after)]

    def run(algorithm: str, precision: str, accelerator: str = "cpu") -> dict:
        seen.clear()
        args = [f"algorithm={algorithm}", "task=countdown", "model.hidden_size=64", "model.num_layers=2",
                "model.num_heads=2", "model.intermediate_size=128", "rollout.prompts_per_step=4",
                "rollout.group_size=4", "rollout.max_new_tokens=12", "rollout.logp_from_sampler=false",
                "task.num_eval=4", "eval.batch_size=4", "trainer.max_steps=1", "trainer.eval_every=100",
                "trainer.progress_bar=false", f"trainer.accelerator={accelerator}", f"trainer.precision={precision}",
                "optim.lr=1e-3", "train.micro_batch_size=4", *STEP[algorithm], *store["args"]]  # fmt: skip
        result = train(compose(args))
        history = MlflowClient(store["uri"]).get_metric_history(result.run_id, LOSS[algorithm])
        return {**seen, "loss": history[0].value, "run_id": result.run_id}

    yield run
    for h in hooks:
        h.remove()


ON_CUDA = pytest.param(
    "gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]
)


@pytest.mark.parametrize("accelerator", ["cpu", ON_CUDA])
@pytest.mark.parametrize("algorithm", sorted(STEP))
def test_a_bf16_mixed_step_matches_the_float32_step(one_step, algorithm, accelerator, store):
    """make gpu-check runs the CUDA cases (bfloat16 autocast on the GPU, the same bounds)."""
    fp32, bf16 = one_step(algorithm, "32-true", accelerator), one_step(algorithm, "bf16-mixed", accelerator)
    assert fp32["dtypes"] == bf16["dtypes"] == {torch.float32}  # master weights and what AdamW steps stay float32
    assert [g.shape for g in fp32["grad"]] == [g.shape for g in bf16["grad"]]
    grad_cos, change_cos = _cos(fp32["grad"], bf16["grad"]), _cos(fp32["change"], bf16["change"])
    scale = max(abs(fp32["loss"]), 1.0)
    print(f"{algorithm} ({accelerator}): gradient cosine {grad_cos:.5f}, parameter-change cosine {change_cos:.5f}, "
          f"loss {fp32['loss']:.6f} (fp32) {bf16['loss']:.6f} (bf16-mixed)")  # fmt: skip
    assert grad_cos >= 0.99, grad_cos
    assert any(not torch.equal(a, b) for a, b in zip(fp32["grad"], bf16["grad"], strict=True))  # bf16 did run
    # Adam's first step is lr x sign(g) almost everywhere: a sign flip on small entries moves this cosine most
    assert change_cos >= 0.9, change_cos
    assert abs(bf16["loss"] - fp32["loss"]) <= 4 * 2**-8 * scale  # a few bfloat16 ulps of the loss's scale
    params = MlflowClient(store["uri"]).get_run(bf16["run_id"]).data.params
    assert params["trainer.precision"] == "bf16-mixed"


# ---- chunked log-probs ---------------------------------------------------------------------------------------------
def _llama(vocab: int = 3000, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    return LlamaForCausalLM(config).train()


def _batch(vocab: int, B=6, Tp=7, T=11, seed=1):
    g = torch.Generator().manual_seed(seed)
    pi, ci = torch.randint(3, vocab, (B, Tp), generator=g), torch.randint(3, vocab, (B, T), generator=g)
    pm, cm = torch.ones(B, Tp, dtype=torch.long), torch.ones(B, T)
    pm[0, :3] = 0  # left padding
    pm[1::2, :2] = 0  # prompts of a group share it, as rollouts do
    cm[2, 6:] = 0  # a short completion
    return pi, pm, ci, cm


def _logprobs_and_grads(model, batch, chunk, precision=torch.float32, **switches):
    model.zero_grad(set_to_none=True)
    device = next(model.parameters()).device
    batch = [t.to(device) for t in batch]
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == torch.bfloat16):
        logp, ent = completion_logprobs(model, *batch, 0.7, with_entropy=True, chunk=chunk, **switches)
    weights = torch.linspace(-1, 1, logp.numel()).view_as(logp)  # an arbitrary upstream gradient, as a loss gives
    (logp * weights * batch[3]).sum().backward()
    return logp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=ON_CUDA.marks)])
@pytest.mark.parametrize("switches", [{}, {"trim": True}, {"share_prompt": True}], ids=["plain", "trim", "shared"])
@pytest.mark.parametrize("chunk", [5, 64, LOGPROB_CHUNK])
def test_chunked_logprobs_equal_the_full_vocabulary_computation(chunk, switches, device):
    """Chunks smaller than a row, across rows and the whole batch: the log-probs, the entropy and every parameter's
    gradient equal the [B, T, V] computation's, in float32 to 1e-6 (summation order), in bfloat16 autocast to its
    precision (both from float32 logits)."""
    model, batch = _llama().to(device), _batch(3000)
    lp0, ent0, g0 = _logprobs_and_grads(model, batch, None, **switches)
    lp1, ent1, g1 = _logprobs_and_grads(model, batch, chunk, **switches)
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-6)
    torch.testing.assert_close(ent1, ent0, rtol=0, atol=1e-6)
    for n in g0:  # float32 summation order: within 2e-6 of each gradient's largest entry
        assert (g1[n] - g0[n]).abs().max() <= 2e-6 * g0[n].abs().max(), n
    lp2, ent2, g2 = _logprobs_and_grads(model, batch, None, torch.bfloat16, **switches)
    lp3, ent3, g3 = _logprobs_and_grads(model, batch, chunk, torch.bfloat16, **switches)
    assert lp3.dtype == torch.float32 and ent3.dtype == torch.float32  # from float32 logits under autocast
    assert (lp2 - lp0).abs().max() > 1e-4  # bfloat16 did change the values: the comparison below is not float32's
    torch.testing.assert_close(lp3, lp2, rtol=0, atol=2e-2)  # bfloat16 hidden states, same rounding up to order
    torch.testing.assert_close(ent3, ent2, rtol=0, atol=2e-2)
    flat = lambda g: torch.cat([v.flatten() for v in g.values()])  # noqa: E731
    assert torch.nn.functional.cosine_similarity(flat(g3), flat(g2), dim=0) > 0.999


def test_chunked_logprobs_without_gradient_and_a_head_with_a_logit_transform_falls_back():
    """No autograd (behaviour and reference passes): the same values without checkpointing. A model whose logits are
    transformed after the head (Gemma's soft-capping) takes the full computation: the chunked one would be wrong."""
    model, batch = _llama(), _batch(3000)
    with torch.no_grad():
        a = completion_logprobs(model, *batch, 1.0, with_entropy=True, chunk=None)
        b = completion_logprobs(model, *batch, 1.0, with_entropy=True, chunk=7)
    torch.testing.assert_close(b[0], a[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(b[1], a[1], rtol=0, atol=1e-6)
    assert splits_head(model)
    handle = model.lm_head.register_forward_hook(lambda m, i, o: o + 1.0)  # something changes the head's output
    assert not splits_head(model)
    handle.remove()
    model.config.final_logit_softcapping = 30.0
    assert not splits_head(model)


def test_the_warm_start_trains_in_the_runs_precision_and_is_keyed_by_it(small, store):
    """init=sft under bf16-mixed trains (and caches) a bfloat16 warm start, logged with its precision, apart from the
    float32 one; ``warm_start.overrides=[trainer.precision=32-true]`` gives a bf16-mixed run the float32 warm start
    (a comparison of precisions in RL alone)."""
    args = ["algorithm=grpo", "task=countdown", "seed=21", "init=sft", *small, "trainer.max_steps=1"]
    bf = train(compose([*args, "trainer.precision=bf16-mixed"]))
    fp = train(compose(args))
    pinned = train(compose([*args, "trainer.precision=bf16-mixed", "warm_start.overrides=[trainer.precision=32-true]"]))
    client = MlflowClient(store["uri"])
    wbf, wfp, wpin = (client.get_run(client.get_run(r.run_id).data.tags["warm_start.run_id"]) for r in (bf, fp, pinned))
    assert wbf.data.params["trainer.precision"] == "bf16-mixed"
    assert wfp.data.params["trainer.precision"] == "32-true"
    assert wbf.info.run_id != wfp.info.run_id  # two cache entries
    assert wpin.info.run_id == wfp.info.run_id  # reused, not retrained


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["trainer.precision=bf16-true"],
            r"'bf16-true': weights and optimizer state in bfloat16 lose updates.*"
            r"Choose 32-true or bf16-mixed",
        ),
        (["trainer.precision=16-mixed"], r"float16 needs a loss scaler"),
        (["trainer.precision=bf16"], r"'bf16': not a precision this harness runs. Choose 32-true or bf16-mixed"),
        (["model.dtype=bfloat16", "trainer.precision=bf16-mixed"], r"no float32 master weights.*model.dtype=float32"),
    ],
)
def test_a_precision_that_would_lose_updates_fails_at_start_up_with_why(args, message):
    """conf/sweep/gpu.yaml asked for model.dtype=bfloat16 with bf16-mixed: parameters and AdamW's state in bfloat16,
    no master weights, and at lr 1e-6 almost every update rounded away."""
    from bench.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        compose(["algorithm=grpo", "task=countdown", *args])
    from bench.run.sweep import load_plan

    assert all(c.cfg.model.dtype == "float32" for c in load_plan("gpu")[1])
