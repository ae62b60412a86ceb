"""Policy and rollout: character tokenizer, KV-cached sampling, masks, seeds, reference policy."""

from __future__ import annotations

import torch
from transformers import AutoTokenizer

from bench.config import LoraConfig, ModelConfig
from bench.engine.policy import Reference, char_tokenizer, completion_logprobs, load_policy
from bench.engine.rollout import branch, generate, sample_seed

SMALL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def _policy(**kw):
    model, tok = load_policy(ModelConfig(**{**SMALL.__dict__, **kw}), seed=0)
    return model.eval(), tok


def _prompts(tok, texts):
    enc = tok(texts, padding=True, return_tensors="pt", padding_side="left")
    return enc.input_ids, enc.attention_mask


def test_char_tokenizer_round_trips_through_save_and_load(tmp_path):
    """The tiny tokenizer is a standard HF fast tokenizer: saved and reloaded with AutoTokenizer, same ids."""
    tok = char_tokenizer()
    text = "nums 3 5 7 target 22\n<answer>(3+5)*7</answer>"
    ids = tok(text).input_ids
    assert len(ids) == len(text) and tok.decode(ids) == text
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(text).input_ids == ids and again.eos_token == "<eos>" and again.pad_token_id == 0


def test_generation_masks_lengths_and_truncation():
    """Masks are 1 up to and including EOS, 0 after; lengths = mask sums; truncated = no EOS within budget."""
    model, tok = _policy()
    ids, mask = _prompts(tok, ["nums 1 2 target 3\n", "ab\n"])
    gen = generate(
        model,
        ids,
        mask,
        group_size=3,
        max_new_tokens=12,
        temperature=1.0,
        top_p=1.0,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        seeds=[1, 2],
    )
    B, T = gen.completion_ids.shape
    assert B == 6 and T <= 12
    assert torch.equal(gen.lengths, gen.mask.sum(1).long())
    for row, m, n, trunc in zip(gen.completion_ids, gen.mask, gen.lengths, gen.truncated, strict=True):
        assert torch.all(m[:n] == 1) and torch.all(m[n:] == 0), m  # a prefix mask
        has_eos = bool((row[:n] == tok.eos_token_id).any())
        assert has_eos != bool(trunc), (row, n, trunc)
        if has_eos:
            assert row[n - 1] == tok.eos_token_id, "EOS is the last unmasked token"
        assert torch.all(row[n:] == tok.pad_token_id)
    assert torch.all(gen.sampler_logp[gen.mask == 0] == 0)


def test_eos_forced_rows_stop():
    """A model that always emits EOS gives length-1 completions and no truncation."""
    model, tok = _policy()
    # push the EOS logit far above the rest
    handle = model.lm_head.register_forward_hook(
        lambda m, i, o: o.index_fill(-1, torch.tensor([tok.eos_token_id]), 50.0)
    )
    ids, mask = _prompts(tok, ["x\n"])
    gen = generate(
        model,
        ids,
        mask,
        group_size=4,
        max_new_tokens=8,
        temperature=1.0,
        top_p=1.0,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        seeds=[0],
    )
    handle.remove()
    assert gen.completion_ids.shape[1] == 1 and gen.lengths.tolist() == [1, 1, 1, 1] and not gen.truncated.any()


def test_sampling_is_seeded_per_prompt_and_independent_of_batch():
    """Prompt p's samples depend only on its seed: same seed -> same samples, alone or batched with others."""
    model, tok = _policy()
    kw = dict(
        group_size=4,
        max_new_tokens=10,
        temperature=1.0,
        top_p=1.0,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    ids, mask = _prompts(tok, ["nums 1 2 target 3\n", "q\n"])
    both = generate(model, ids, mask, seeds=[sample_seed(0, 5, 0), sample_seed(0, 5, 1)], **kw)
    ids1, mask1 = _prompts(tok, ["nums 1 2 target 3\n"])
    alone = generate(model, ids1, mask1, seeds=[sample_seed(0, 5, 0)], **kw)
    n = alone.completion_ids.shape[1]
    assert torch.equal(both.completion_ids[:4, :n], alone.completion_ids), "batching changed prompt 0's samples"
    other = generate(model, ids1, mask1, seeds=[sample_seed(0, 6, 0)], **kw)
    assert not torch.equal(other.completion_ids[:, :5], alone.completion_ids[:, :5]), "different step, same samples"


def test_sampler_logprobs_match_the_training_forward():
    """KV-cached sampling with left padding gives the same per-token log-probs as one full forward pass."""
    model, tok = _policy()
    ids, mask = _prompts(tok, ["nums 11 2 3 target 7\n", "a\n", "hello there\n"])
    gen = generate(
        model,
        ids,
        mask,
        group_size=2,
        max_new_tokens=10,
        temperature=0.7,
        top_p=1.0,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        seeds=[3, 4, 5],
    )
    with torch.no_grad():
        logp, ent = completion_logprobs(
            model,
            ids.repeat_interleave(2, 0),
            mask.repeat_interleave(2, 0),
            gen.completion_ids,
            gen.mask,
            temperature=0.7,
            with_entropy=True,
        )
    gap = ((logp - gen.sampler_logp).abs() * gen.mask).max().item()
    assert gap < 1e-5, gap
    assert ent.shape == logp.shape and torch.all(ent >= 0)


def test_greedy_is_deterministic_and_ignores_seeds():
    model, tok = _policy()
    ids, mask = _prompts(tok, ["nums 1 2 target 3\n"])
    kw = dict(
        group_size=2,
        max_new_tokens=8,
        temperature=0.0,
        top_p=1.0,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    a, b = generate(model, ids, mask, seeds=[1], **kw), generate(model, ids, mask, seeds=[2], **kw)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.completion_ids[0], a.completion_ids[1])


def test_lora_reference_is_the_adapter_disabled_network():
    """With LoRA the reference is the same network with its adapter off: no copy, base log-probs, unaffected by
    training the adapter."""
    model, tok = load_policy(ModelConfig(**{**SMALL.__dict__, "lora": LoraConfig(enabled=True, r=4)}), seed=0)
    base, _ = _policy()
    ref = Reference(model)
    assert ref.snapshot is None, "LoRA reference must not copy the model"
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.5)  # train the adapter a little
    ids, mask = _prompts(tok, ["nums 1 2 target 3\n"])
    comp = tok(["<answer>1+2</answer>"], return_tensors="pt", add_special_tokens=False).input_ids
    cmask = torch.ones_like(comp, dtype=torch.float)
    with torch.no_grad(), ref.model() as r:
        ref_logp = completion_logprobs(r, ids, mask, comp, cmask)[0]
    with torch.no_grad():
        base_logp = completion_logprobs(base, ids, mask, comp, cmask)[0]
        pol_logp = completion_logprobs(model, ids, mask, comp, cmask)[0]
    assert torch.allclose(ref_logp, base_logp, atol=1e-6), (ref_logp, base_logp)
    assert not torch.allclose(pol_logp, base_logp, atol=1e-3), "adapter had no effect"


def test_full_finetune_reference_is_frozen_snapshot():
    model, _ = _policy()
    ref = Reference(model)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert not torch.equal(next(model.parameters()), next(ref.snapshot.parameters()))
    assert not any(p.requires_grad for p in ref.snapshot.parameters())


# ---- branching rollouts (VinePPO-style Monte-Carlo continuations) -------------------------------------------------
def _sampling(tok, temperature=1.0):
    eos, pad = tok.eos_token_id, tok.pad_token_id
    return {"temperature": temperature, "top_p": 1.0, "eos_token_id": eos, "pad_token_id": pad}


def test_branching_from_the_empty_prefix_is_group_sampling_bit_for_bit():
    model, tok = _policy()
    ids, mask = _prompts(tok, ["nums 11 2 3 target 7\n", "a\n", "hello there\n"])
    seeds = [sample_seed(0, 5, p) for p in range(3)]
    group = generate(model, ids, mask, group_size=4, max_new_tokens=12, seeds=seeds, share_prompt_cache=True,
                     **_sampling(tok))  # fmt: skip
    empty = torch.full((3, 12), tok.pad_token_id)
    br = branch(model, ids, mask, empty, [0, 0, 0], continuations=4, max_new_tokens=12, seeds=seeds, **_sampling(tok))
    for f in ("completion_ids", "mask", "sampler_logp", "lengths", "truncated"):
        assert torch.equal(getattr(group, f), getattr(br, f)), f


def test_branches_continue_their_prefix_within_the_remaining_budget_and_are_seeded():
    """Continuations of prompt + the first t tokens of a sampled completion: at most 12 − t tokens each, their
    sampler log-probs those of one training forward over prompt + prefix + continuation, the same seeds giving the
    same continuations and other seeds others."""
    model, tok = _policy()
    ids, mask = _prompts(tok, ["nums 11 2 3 target 7\n", "a\n", "hello there\n"])
    T, M = 12, 3
    first = generate(model, ids, mask, group_size=1, max_new_tokens=T, seeds=[1, 2, 3], **_sampling(tok))
    t = [0, min(3, int(first.lengths[1]) - 1), min(5, int(first.lengths[2]) - 1)]
    br = branch(model, ids, mask, first.completion_ids, t, continuations=M, max_new_tokens=T, seeds=[7, 8, 9],
                **_sampling(tok, 0.7))  # fmt: skip
    assert br.completion_ids.shape[0] == 3 * M
    assert all(int(n) <= T - t[i // M] for i, n in enumerate(br.lengths)), (br.lengths, t)
    assert torch.equal(br.lengths, br.mask.sum(1).long())
    # the continuation's log-probs under one forward over prompt + prefix + continuation
    for i in range(3):
        rows = slice(i * M, (i + 1) * M)
        prefix = first.completion_ids[i, : t[i]].repeat(M, 1)
        full = torch.cat([prefix, br.completion_ids[rows]], 1)
        full_mask = torch.cat([torch.ones_like(prefix, dtype=br.mask.dtype), br.mask[rows]], 1)
        with torch.no_grad():
            logp, _ = completion_logprobs(model, ids[i : i + 1].repeat(M, 1), mask[i : i + 1].repeat(M, 1), full,
                                          full_mask, temperature=0.7)  # fmt: skip
        gap = ((logp[:, t[i] :] - br.sampler_logp[rows]).abs() * br.mask[rows]).max().item()
        assert gap < 1e-5, (i, gap)
    again = branch(model, ids, mask, first.completion_ids, t, continuations=M, max_new_tokens=T, seeds=[7, 8, 9],
                   **_sampling(tok, 0.7))  # fmt: skip
    other = branch(model, ids, mask, first.completion_ids, t, continuations=M, max_new_tokens=T, seeds=[17, 18, 19],
                   **_sampling(tok, 0.7))  # fmt: skip
    assert torch.equal(again.completion_ids, br.completion_ids)
    assert not torch.equal(other.completion_ids, br.completion_ids)
