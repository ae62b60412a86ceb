"""The preference family's LightningModule (bench/pref/module.py) and its pairs (bench/pref/pairs.py): pair
selection golden values, the module's loss equal to the primitive on its own forward, gradient-accumulation
invariance, online DPO on a fixed pair set equal to offline DPO, the offline sample cache, and every family member
training on the tiny model with its run read back from MLflow."""

from __future__ import annotations

import math

import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from bench.config import compose
from bench.engine.policy import Reference, completion_logprobs, load_policy
from bench.pref import losses as P
from bench.pref.module import CHOICES, UNPAIRED, PreferenceConfig
from bench.pref.pairs import SampleCache, labelled_rows, select_pairs
from bench.registry import ALGORITHMS, TASKS
from bench.run.train import train
from bench.task import environment_names
from tests.conftest import data_root
from tests.test_algorithms import ALL_RIGHT, CONTRACT, GENERATED, moved_from_warm_start

FAMILY = sorted(n for n in ALGORITHMS.names() if issubclass(ALGORITHMS.get(n).Config, PreferenceConfig))
TINY = [
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "model.dtype=float64",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=10",
]
SCORES = [1, 0, 0, 1] + [0, 0, 0, 0] + [1, 1, 0, 1] + [0.5, 0.2, 0.9, 0.1]  # one tied group, three with pairs


def test_the_family_is_registered():
    expected = {"dpo", "ipo", "simpo", "sampo", "tgdpo", "wpo", "online_dpo", "xpo", "kto", "a_lol", "copg"}
    assert expected == set(FAMILY), sorted(expected ^ set(FAMILY))


# ---- pairs ----------------------------------------------------------------------------------------------------------
def test_pair_selection_golden():
    s = torch.tensor([1.0, 0.0, 0.0, 1.0] + [0.0] * 4 + [0.5, 0.2, 0.9, 0.1])
    gen = torch.Generator().manual_seed(0)
    w, lo = select_pairs(s, 4, "all", gen)
    # group 0: 1 > 0 for (0,1) (0,2) (3,1) (3,2); group 1 tied; group 2: every ordered pair of distinct scores (6)
    pairs = sorted(zip(w.tolist(), lo.tolist(), strict=True))
    assert pairs[:4] == [(0, 1), (0, 2), (3, 1), (3, 2)] and len(pairs) == 10, pairs
    w, lo = select_pairs(s, 4, "max_margin", gen)
    assert list(zip(w.tolist(), lo.tolist(), strict=True)) == [(0, 1), (10, 11)]  # best vs worst, first of equals
    w, lo = select_pairs(s, 4, "random", gen)
    assert len(w) == 2 and all(s[i] > s[j] for i, j in zip(w, lo, strict=True))
    w, lo = select_pairs(s, 4, "rso", torch.Generator().manual_seed(1), rso_beta=1e-6)
    # β → 0: RSO accepts only the current best, so it takes the best two: (0 or 3 tie -> no pair), (10 over 8)
    assert list(zip(w.tolist(), lo.tolist(), strict=True)) == [(10, 8)], (w, lo)
    with pytest.raises(ValueError, match="unknown pair_selection 'best'.*all, random, max_margin, rso"):
        select_pairs(s, 4, "best", gen)


def test_labelled_rows_against_the_group_mean():
    rows, desirable, adv = labelled_rows(torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]), 4)
    assert rows.tolist() == [0, 1, 2, 3] and desirable.tolist() == [True, False, False, True]
    assert adv.tolist() == [0.5, -0.5, -0.5, 0.5]  # score − group mean; the tied group gives no row


# ---- the module, driven outside Lightning on fixed scores -----------------------------------------------------------
class _Opt:
    def __init__(self, params):
        self.params = list(params)
        self.grads = []

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    def step(self):
        self.grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in self.params])


class _Sched:
    def step(self):
        pass

    def get_last_lr(self):
        return [0.0]


def _module(name: str, *args: str, tmp_path=None, policy=None):
    extra = [f"cache_dir={tmp_path}"] if tmp_path else []
    cfg = compose([f"algorithm={name}", "task=countdown", *TINY, *args, *extra])
    obj = OmegaConf.to_object(cfg)
    if policy is None:
        policy, tok = load_policy(obj.model, obj.seed)
    else:
        tok = load_policy(obj.model, obj.seed)[1]
    task = TASKS.get("countdown")(obj.task, tok, seed=0, prompts_per_step=obj.rollout.prompts_per_step)
    module = ALGORITHMS.get(name)(obj, policy, tok, task)
    if module.needs_reference:
        module.reference = Reference(policy)
    opt = _Opt(policy.parameters())
    module.optimizers, module.lr_schedulers = (lambda: opt), (lambda: _Sched())
    module.manual_backward = lambda loss: loss.backward()
    return module, task, opt


def _step(module, task, scores=SCORES):
    """One training step on the module's own rollout of 4 fixed prompts, scores set (a random model scores 0)."""
    batch = task.sample_prompts(module.cfg.rollout.prompts_per_step, (0, 0, 0))
    ro = module.make_rollout(batch)
    ro.scores = torch.tensor(scores, dtype=torch.float64)
    module.behaviour_logprobs(ro)
    module.shape_rewards(ro)
    ro.adv = module.advantages(ro)
    return ro, module.update(ro)


@pytest.mark.parametrize("name", ["dpo", "ipo", "simpo", "copg", "kto", "a_lol"])
def test_module_loss_is_the_primitive_on_its_own_forward(name, tmp_path):
    """loss/total equals the mean of the primitive over the step's items, recomputed here from a fresh forward."""
    module, task, _ = _module(name, "algorithm.pair_selection=all", tmp_path=tmp_path)
    ro, stats = _step(module, task)
    a, it = module.acfg, module.items
    with torch.no_grad():
        logp = completion_logprobs(module.policy, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.mask)[0]
    ref = ro.ref_logp if ro.ref_logp is not None else logp
    rho = P.seq_logps(logp - ref, ro.mask)
    if name in UNPAIRED:
        r = it.rows
        if name == "kto":
            expect = P.kto_loss(rho[r], it.desirable, module.z_ref, a.beta)
        else:
            expect = P.a_lol_loss(logp[r], ref[r], ro.mask[r], it.adv.double(), "a_lol", a.alol_clip)
    else:
        w, lo = it.w, it.l
        h = rho[w] - rho[lo]
        lens = ro.mask.sum(1)
        expect = {
            "dpo": lambda: P.sigmoid_loss(h, a.beta),
            "ipo": lambda: P.ipo_loss(rho[w] / lens[w] - rho[lo] / lens[lo], a.beta),
            "simpo": lambda: P.simpo_loss(
                P.mean_logps(logp[w], ro.mask[w]), P.mean_logps(logp[lo], ro.mask[lo]), a.beta, a.simpo_gamma
            ),  # fmt: skip
            "copg": lambda: P.copg_loss(ro.scores[w], ro.scores[lo], rho[w], rho[lo], a.beta),
        }[name]()
    assert it.n == len(expect) > 0 and stats["stats/optimizer_steps"] == 1
    assert stats["loss/total"] == pytest.approx(float(expect.mean()), abs=1e-9), (name, stats["loss/total"])


@pytest.mark.parametrize("name", ["dpo", "sampo", "wpo", "kto", "a_lol", "copg"])
def test_gradient_accumulation_leaves_the_step_unchanged(name, tmp_path):
    """Micro-batches of 2 rows give the gradient of one batch of 64 rows (float64, 1e-6)."""
    grads = []
    for micro in (2, 64):
        module, task, opt = _module(name, f"train.micro_batch_size={micro}", "algorithm.pair_selection=all",
                                    tmp_path=tmp_path)  # fmt: skip
        _step(module, task)
        grads.append(opt.grads[0])
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-6), (name, (a - b).abs().max())


def test_online_dpo_on_a_fixed_pair_set_equals_offline_dpo(tmp_path):
    """At step 0 the policy is the reference: online DPO samples what offline DPO draws from the SFT start (same
    seeds), builds the same pairs and takes the same gradient step."""
    off, task, opt_off = _module("dpo", tmp_path=tmp_path)
    on, _, opt_on = _module("online_dpo", tmp_path=tmp_path / "on")
    on.policy.load_state_dict(off.policy.state_dict())
    ro_off, _ = _step(off, task)
    ro_on, _ = _step(on, task)
    assert torch.equal(ro_off.completion_ids, ro_on.completion_ids)
    assert torch.equal(off.items.w, on.items.w) and torch.equal(off.items.l, on.items.l)
    for a, b in zip(opt_off.grads[0], opt_on.grads[0], strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-6)


def test_tgdpo_with_alpha_zero_equals_dpo_in_the_module(tmp_path):
    token_model = tmp_path / "dpo-final"
    model, tok = load_policy(OmegaConf.to_object(compose(["algorithm=dpo", "task=countdown", *TINY])).model, 1)
    model.save_pretrained(token_model)
    tok.save_pretrained(token_model)
    dpo, task, opt_d = _module("dpo", tmp_path=tmp_path)
    tg, _, opt_t = _module("tgdpo", "algorithm.tgdpo_alpha=0", f"algorithm.tgdpo_model={token_model}",
                           tmp_path=tmp_path)  # fmt: skip
    tg.policy.load_state_dict(dpo.policy.state_dict())
    _step(dpo, task)
    _, stats = _step(tg, task)
    assert tg.token_reward is not None and stats["stats/optimizer_steps"] == 1
    for a, b in zip(opt_d.grads[0], opt_t.grads[0], strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-6)


def test_offline_samples_are_drawn_once_and_reused(tmp_path):
    """The SFT start's samples go to the cache keyed by model, start, task, seed and sampling settings; a second run
    with the same key reads them back (same tensors) instead of generating; another seed has its own entry."""
    first, task, _ = _module("dpo", tmp_path=tmp_path)
    ro1, _ = _step(first, task)
    cache = first.sample_cache()
    assert cache.path(0).exists() and cache.root.parent == tmp_path / "pref_samples"
    second, _, _ = _module("kto", tmp_path=tmp_path)
    assert second.sample_cache().root == cache.root, "the loss is not part of the samples' key"
    second.reference = None  # a cache hit must not need the reference to sample
    batch = task.sample_prompts(4, (0, 0, 0))
    gen = second.sample(batch, 4, 1.0, [0, 1, 2, 3])
    assert torch.equal(gen.completion_ids, ro1.completion_ids) and torch.equal(gen.mask, ro1.mask)
    other, _, _ = _module("dpo", "seed=1", tmp_path=tmp_path)
    assert other.sample_cache().root != cache.root
    assert isinstance(SampleCache(cache.root).load(0).lengths, torch.Tensor)


def test_config_errors_name_the_fix():
    with pytest.raises(ValueError, match="token_weighting='sampo' reweights the summed log-ratios"):
        PreferenceConfig(loss="kto", token_weighting="sampo")
    with pytest.raises(ValueError, match="tgdpo_model"):
        PreferenceConfig(token_weighting="tgdpo")
    with pytest.raises(ValueError, match="pair_source=online"):
        PreferenceConfig(xpo_alpha=1e-5)
    with pytest.raises(ValueError, match="exo_pair needs label_smoothing"):
        PreferenceConfig(loss="exo_pair")


# ---- every member trains, read back from MLflow --------------------------------------------------------------------
@pytest.fixture(scope="module")
def dpo_final(store) -> str:
    """A finished 2-step DPO run's final/ folder (random init, no warm start): TGDPO's token-reward model for the
    every-task runs (only its tokenizer has to match theirs)."""
    args = ["algorithm=dpo", "task=countdown", *TINY[:4], "rollout.max_new_tokens=8", "task.num_eval=2"]
    result = train(compose([*args, "trainer.max_steps=2", "trainer.progress_bar=false", *store["args"]]))
    return str(result.run_dir / "final")


def family_args(name: str, dpo_final: str) -> list[str]:
    return [f"algorithm.tgdpo_model={dpo_final}"] if name == "tgdpo" else []


@pytest.mark.parametrize("name", FAMILY)
def test_member_trains_two_steps_and_logs_its_choices(name, store):
    """From the SFT warm start on Countdown: 2 steps with pairs, finite loss, parameters changed, every choice a
    param and a choice.* tag, the preference diagnostics and the generation cost logged. TGDPO's default
    tgdpo_model=dpo trains its DPO token-reward model once (cached under cache_dir/dpo/, its path in the params)."""
    result = train(compose([f"algorithm={name}", "task=countdown", *CONTRACT, *ALL_RIGHT, *store["args"]]))
    client = MlflowClient(tracking_uri=store["uri"])
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED", run.info.status
    items = [m.value for m in client.get_metric_history(result.run_id, "pref/items")]
    assert len(items) == 2 and all(n > 0 for n in items), (name, items)
    losses = [m.value for m in client.get_metric_history(result.run_id, "loss/total")]
    assert len(losses) == 2 and all(map(math.isfinite, losses)), (name, losses)
    for choice in CHOICES:
        assert run.data.tags[f"choice.{choice}"] == run.data.params[f"algorithm.{choice}"], choice
    diagnostics = ("pref/desirable_frac", "pref/logratio") if name in UNPAIRED else (
        "pref/reward_accuracy", "pref/margin", "pref/chosen_logratio", "pref/rejected_logratio")  # fmt: skip
    for key in (*diagnostics, "pref/items_per_group", "rollout/tokens_generated", "time/generation"):
        history = client.get_metric_history(result.run_id, key)
        assert len(history) == 2 and all(map(math.isfinite, (m.value for m in history))), (name, key)
    tokens = [m.value for m in client.get_metric_history(result.run_id, "rollout/tokens_generated")]
    assert 0 < tokens[0] < tokens[1], tokens
    assert moved_from_warm_start(store, "countdown", result) > 0, f"{name}: no parameter changed after 2 steps"
    if name == "tgdpo":
        (dpo_dir,) = [p for p in (store["cache"] / "dpo").glob("countdown-tiny-s0-*") if p.is_dir()]
        assert (dpo_dir / "DONE").exists() and run.data.params["algorithm.tgdpo_model"] == str(dpo_dir)


@pytest.mark.slow
@pytest.mark.parametrize("task", [t for t in TASKS.names() if t != "countdown" and t not in environment_names()])
@pytest.mark.parametrize("name", FAMILY)
def test_every_member_trains_on_every_task(name, task, store, dpo_final):
    """Each member trains 2 steps on each task with the tiny model from random init (FINISHED run, 2 logged steps;
    a step whose groups all tie has no pair and records pref/items = 0 instead of a loss). Countdown is
    test_member_trains_two_steps_and_logs_its_choices, from the warm start, with pairs on every step."""
    if task not in GENERATED and data_root() is None:
        pytest.skip("needs the data root (BENCH_DATA)")
    args = [f"algorithm={name}", f"task={task}", *TINY[:4], "rollout.prompts_per_step=2", "rollout.group_size=4",
            "rollout.max_new_tokens=12", "task.num_eval=2", "trainer.max_steps=2", "trainer.eval_every=100",
            "trainer.progress_bar=false", *store["args"], *family_args(name, dpo_final)]  # fmt: skip
    result = train(compose(args))
    client = MlflowClient(tracking_uri=store["uri"])
    assert client.get_run(result.run_id).info.status == "FINISHED"
    items = client.get_metric_history(result.run_id, "pref/items")
    assert len(items) == 2, (name, task)
    losses = [m.value for m in client.get_metric_history(result.run_id, "loss/total")]
    assert all(map(math.isfinite, losses)) and len(losses) == sum(m.value > 0 for m in items), (name, task, losses)


def test_kto_warns_once_when_undesirable_samples_dominate(tmp_path):
    """λ_D·n_D / (λ_U·n_U) outside KTO's [1, 4/3] warns once, naming the λ_D that balances the step."""
    module, _, _ = _module("kto", tmp_path=tmp_path)
    with pytest.warns(UserWarning, match=r"= 0.33 at step 0, outside \[1, 4/3\].*kto_lambda_d ≈ 3.00"):
        assert module.kto_weight_ratio(torch.tensor([True, False, False, False])) == pytest.approx(1 / 3)
    assert module.kto_weight_ratio(torch.tensor([True, True, False, False])) == 1.0
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module.kto_weight_ratio(torch.tensor([True, False, False, False]))  # once only
