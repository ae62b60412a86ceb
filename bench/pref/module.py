"""The preference family's LightningModule: every member is a ``PreferenceConfig`` of explicit choices, trained by
the same loop as RL (one step = the step's prompts -> G scored completions each -> pairs -> one optimizer step) and
logged the same way (eval, tokens generated, samples seen, time split), plus preference diagnostics.

Choices (../shared/docs/algorithms-round2.md, part A):
* ``pair_source``: ``offline`` samples G completions per prompt once from the SFT start (the reference) and caches
  them on disk, keyed like the SFT warm start; ``online`` samples them from the current policy every step
  (online DPO, XPO). Either way the step's generation cost counts in ``rollout/tokens_generated``.
* ``pair_selection`` (bench/pref/pairs.py): all strictly ordered pairs, one random pair per group, max-margin, RSO.
* ``loss``: sigmoid (DPO, cDPO with label_smoothing), robust, ipo, hinge, exo_pair, simpo (reference-free,
  length-averaged), copg (pairs with their rewards), kto and a_lol (single labelled samples, not pairs).
* ``token_weighting``: none, sampo (down-sampled sums), tgdpo (token weights from a frozen DPO-trained model),
  wpo (per-pair weight); ``xpo_alpha`` > 0 adds XPO's exploration term on one reference sample per prompt.
The loss of an optimizer step is the mean over its pairs (or labelled samples); micro-batches divide by the step's
count, so gradient accumulation leaves it unchanged.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, fields
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import torch
from lightning.pytorch.utilities import rank_zero_warn
from omegaconf import OmegaConf

from bench import dist
from bench.config import ConfigError, config_hash
from bench.engine.policy import completion_logits, completion_logprobs
from bench.engine.rollout import Rollout, sample_seed
from bench.pref import losses as P
from bench.pref.pairs import PairSelection, SampleCache, labelled_rows, select_pairs
from bench.rl.module import AlgorithmConfig, RLModule

PairSource = Literal["offline", "online"]
PrefLoss = Literal["sigmoid", "robust", "ipo", "hinge", "exo_pair", "simpo", "copg", "kto", "a_lol"]
TokenWeighting = Literal["none", "sampo", "tgdpo", "wpo"]
ALolVariant = Literal["a_lol", "ref_free", "seq", "kl"]
UNPAIRED = ("kto", "a_lol")
"""Losses on single labelled samples instead of pairs."""
CHOICES = ("pair_source", "pair_selection", "loss", "token_weighting")


@dataclass
class PreferenceConfig(AlgorithmConfig):
    """Every choice of the preference family. Algorithms subclass this and set their paper's defaults."""

    name: str = "dpo"
    pair_source: PairSource = "offline"
    """offline: G samples per prompt drawn once from the SFT start and cached; online: from the current policy."""
    pair_selection: PairSelection = "random"
    """Which pairs of a group train (ties never do)."""
    loss: PrefLoss = "sigmoid"
    beta: float = 0.1
    """β of the pair loss (IPO: τ; hinge: RSO's γ; CoPG: the KL coefficient)."""
    label_smoothing: float = 0.0
    """ε: cDPO's and SimPO's smoothing, robust DPO's noise rate, EXO's label (must be > 0 there)."""
    ipo_length_norm: bool = True
    """IPO on length-averaged log-ratios (TRL, HALOs, the authors per TRL) or on sums (TRL's online trainers)."""
    simpo_gamma: float = 0.5
    """SimPO's absolute margin γ (= β·gamma_beta_ratio of the authors' code)."""
    token_weighting: TokenWeighting = "none"
    tgdpo_alpha: float = 0.5
    """TGDPO's α."""
    tgdpo_model: str | None = None
    """TGDPO: the frozen DPO-trained model whose token rewards guide the weights: ``dpo`` (a DPO run from the same
    start and budget, trained once and cached like the SFT warm start) or an HF folder (a finished run's final/)."""
    wpo_clamp: bool = True
    """WPO's min(1, w) (the paper's code; TRL f2cd577 drops it)."""
    xpo_alpha: float = 0.0
    """XPO's α on the exploration term (0: off)."""
    kto_lambda_d: float = 1.0
    """KTO's λ_D (desirable)."""
    kto_lambda_u: float = 1.0
    """KTO's λ_U (undesirable)."""
    alol_variant: ALolVariant = "a_lol"
    alol_clip: float = 0.9
    """A-LoL's ε: importance weights clipped to [1 − ε, 1 + ε]."""
    alol_kl_beta: float = 0.0
    """A-LoL KL's coefficient."""
    rso_beta: float = 0.5
    """RSO's rejection-sampling temperature β."""

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if self.token_weighting != "none" and self.loss in (*UNPAIRED, "simpo", "copg"):
            raise ValueError(
                f"token_weighting={self.token_weighting!r} reweights the summed log-ratios of a pair loss; "
                f"loss={self.loss!r} has none: use loss=sigmoid (or robust, ipo, hinge, exo_pair)"
            )
        if self.token_weighting == "tgdpo" and not self.tgdpo_model:
            raise ValueError("token_weighting=tgdpo needs algorithm.tgdpo_model=dpo or an HF folder of a DPO model")
        if self.xpo_alpha and self.pair_source != "online":
            raise ValueError("xpo_alpha > 0 is XPO's exploration term for online pairs: set pair_source=online")
        if self.loss == "exo_pair" and not 0 < self.label_smoothing < 1:
            raise ValueError("loss=exo_pair needs label_smoothing in (0, 1) (e.g. 1e-3)")

    def choices(self) -> dict[str, str]:
        return {f.name: str(getattr(self, f.name)) for f in fields(self) if f.name in CHOICES}


# ---- pair losses: (cfg, pair tensors) -> per-pair loss [N]; t.logit [N] > 0 means the pair is ranked right -------
def _sigmoid(c, t):
    return P.sigmoid_loss(t.h, c.beta, c.label_smoothing)


def _robust(c, t):
    return P.robust_loss(t.h, c.beta, c.label_smoothing)


def _ipo(c, t):
    return P.ipo_loss(t.h_mean if c.ipo_length_norm else t.h, c.beta)


def _hinge(c, t):
    return P.hinge_loss(t.h, c.beta)


def _exo(c, t):
    return P.exo_pair_loss(t.h, c.beta, c.label_smoothing)


def _simpo(c, t):
    return P.simpo_loss(t.avg_w, t.avg_l, c.beta, c.simpo_gamma, c.label_smoothing)


def _copg(c, t):
    return P.copg_loss(t.reward_w, t.reward_l, t.rho_w, t.rho_l, c.beta)


PAIR_LOSSES = {
    "sigmoid": _sigmoid,
    "robust": _robust,
    "ipo": _ipo,
    "hinge": _hinge,
    "exo_pair": _exo,
    "simpo": _simpo,
    "copg": _copg,
}


class Preference(RLModule):
    """The preference family's LightningModule, driven by the config's choices."""

    Config = PreferenceConfig

    def __init__(self, cfg, policy, tokenizer, task):
        super().__init__(cfg, policy, tokenizer, task)
        a = self.acfg
        self.token_model = None
        if a.token_weighting == "tgdpo":
            from bench.engine.policy import load_policy

            path = Path(a.tgdpo_model).expanduser()
            if not (path / "config.json").exists():
                raise ConfigError(
                    f"algorithm.tgdpo_model={a.tgdpo_model!r}: no HF model folder there (no config.json); pass a "
                    "finished DPO run's <run dir>/final (python -m bench train algorithm=dpo ... prints the run dir)"
                )
            self.token_model = load_policy(cfg.model, cfg.seed, path)[0].eval().requires_grad_(False)
        self.items: SimpleNamespace | None = None  # this step's pairs (or labelled samples)
        self.cache: SampleCache | None = None
        self.xpo_ref: SimpleNamespace | None = None  # XPO: one reference sample per prompt

    @classmethod
    def prepare(cls, cfg):
        """tgdpo_model=dpo: a DPO run from the same start and budget, trained once and cached (bench.run.train)."""
        if cfg.algorithm.get("tgdpo_model") == "dpo":
            from bench.run.train import ensure_dpo

            OmegaConf.set_readonly(cfg, False)
            cfg.algorithm.tgdpo_model = str(ensure_dpo(cfg))
        return cfg

    needs_old_logp = False  # every loss here reads the current policy and the reference, never log π_old

    @property
    def needs_reference(self) -> bool:
        a = self.acfg
        uses_ref = not (a.loss == "simpo" or (a.loss == "a_lol" and a.alol_variant == "ref_free"))
        return a.pair_source == "offline" or uses_ref or a.xpo_alpha > 0

    # ---- samples: the SFT start's, cached (offline), or the policy's (online) -----------------------------------
    def sample_cache(self) -> SampleCache:
        if self.cache is None:
            c, r = self.cfg, self.cfg.rollout
            key = OmegaConf.create(
                {
                    "model": OmegaConf.to_container(OmegaConf.structured(c.model)),
                    "task": OmegaConf.to_container(OmegaConf.structured(c.task)),
                    "init": self.init_source,
                    "seed": c.seed,
                    "sampling": [r.group_size, r.prompts_per_step, r.temperature, r.top_p, r.max_new_tokens],
                }
            )
            name = f"{c.task.name}-s{c.seed}-{config_hash(key)}"
            if dist.active():  # each rank samples (and caches) its own share of the step's prompts
                name += f"-rank{dist.rank()}of{dist.world()}"
            self.cache = SampleCache(Path(c.cache_dir) / "pref_samples" / name)
        return self.cache

    def sample(self, batch, group_size, temperature, seeds, model=None):
        if self.acfg.pair_source == "online" or model is not None:
            return super().sample(batch, group_size, temperature, seeds, model)
        step = self.step_count
        cached = self.sample_cache().load(step, self.device)
        if cached is not None and cached.completion_ids.shape[0] == len(batch["examples"]) * group_size:
            return cached
        with self.reference.model() as ref:
            gen = super().sample(batch, group_size, temperature, seeds, ref)
        self.sample_cache().save(step, gen)
        return gen

    def make_rollout(self, batch, round=0):
        ro = super().make_rollout(batch, round)
        if self.acfg.xpo_alpha > 0:  # XPO: one reference sample per prompt for the exploration term
            t0 = time.perf_counter()
            seeds = [sample_seed(self.cfg.seed, self.step_count, "xpo", p) for p in range(len(batch["examples"]))]
            with self.reference.model() as ref:
                gen = super().sample(batch, 1, self.cfg.rollout.temperature, seeds, ref)
            self.xpo_ref = SimpleNamespace(
                prompt_ids=batch["prompt_ids"], prompt_mask=batch["prompt_mask"], ids=gen.completion_ids, mask=gen.mask
            )
            self.extra_tokens += int(gen.lengths.sum())
            self.timer["generation"] += time.perf_counter() - t0
        return ro

    # ---- per-row quantities the losses need, from no-grad forwards at the step's θ --------------------------------
    @torch.no_grad()
    def behaviour_logprobs(self, ro: Rollout) -> None:
        super().behaviour_logprobs(ro)
        a, mb, T = self.acfg, self.cfg.train.micro_batch_size, self.cfg.rollout.temperature
        parts = defaultdict(list)
        for idx in torch.arange(ro.size, device=self.device).split(mb):
            args = (ro.prompt_ids[idx], ro.prompt_mask[idx], ro.completion_ids[idx], ro.mask[idx], T)
            if a.token_weighting == "tgdpo":  # r̂_t = β(log π_r − log π_ref)
                parts["tgdpo"].append(a.beta * (completion_logprobs(self.token_model, *args)[0] - ro.ref_logp[idx]))
            if a.token_weighting == "wpo":
                lss = P.log_sum_sq_probs(completion_logits(self.policy, *args))
                parts["wpo"].append(torch.nn.functional.pad(lss, (0, ro.mask.shape[1] - lss.shape[1])))
        self.token_reward = torch.cat(parts["tgdpo"]) if parts["tgdpo"] else None
        self.log_sum_sq = torch.cat(parts["wpo"]) if parts["wpo"] else None
        self.z_ref = self.kto_reference_point(ro) if a.loss == "kto" else None

    def kto_reference_point(self, ro: Rollout) -> torch.Tensor:
        """KTO's z_ref from mismatched pairs: each completion scored under the next group's prompt (a shift by G,
        so that the prompt differs; TRL shifts by one row, which for grouped samples is mostly the same prompt)."""
        G, B = ro.group_size, ro.size
        if B <= G:
            return torch.zeros((), device=self.device)  # one prompt: no mismatched pair
        other = (torch.arange(B, device=self.device) + G) % B
        rho = []
        for idx in torch.arange(B, device=self.device).split(self.cfg.train.micro_batch_size):
            args = (ro.prompt_ids[other[idx]], ro.prompt_mask[other[idx]], ro.completion_ids[idx], ro.mask[idx])
            lp = completion_logprobs(self.policy, *args, self.cfg.rollout.temperature)[0]
            with self.reference.model() as ref:
                lr = completion_logprobs(ref, *args, self.cfg.rollout.temperature)[0]
            rho.append(P.seq_logps(lp - lr, ro.mask[idx]))
        return P.kto_z_ref(torch.cat(rho))

    def advantages(self, ro: Rollout) -> torch.Tensor:
        """The step's training items: pairs (chosen, rejected) or labelled rows. RL's per-row advantage is unused."""
        a = self.acfg
        gen = torch.Generator().manual_seed(sample_seed(self.cfg.seed, self.step_count, "pairs"))
        if a.loss in UNPAIRED:
            rows, desirable, adv = labelled_rows(ro.scores.cpu(), ro.group_size)
            keep = adv > 0 if a.loss == "a_lol" else torch.ones_like(desirable)  # A-LoL: positive advantages only
            self.items = SimpleNamespace(rows=rows[keep], desirable=desirable[keep], adv=adv[keep], n=int(keep.sum()))
        else:
            w, lo = select_pairs(ro.scores.cpu(), ro.group_size, a.pair_selection, gen, a.rso_beta)
            self.items = SimpleNamespace(w=w, l=lo, n=len(w))
        self.items.groups = ro.num_groups
        self.sampo_gen = torch.Generator().manual_seed(sample_seed(self.cfg.seed, self.step_count, "sampo"))
        return torch.zeros(ro.size, device=self.device)

    # ---- the update: one optimizer step over the step's items -----------------------------------------------------
    def forward_rows(self, ro: Rollout, idx: torch.Tensor) -> torch.Tensor:
        rows = ro.rows(idx.to(self.device))
        args = (rows["prompt_ids"], rows["prompt_mask"], rows["completion_ids"], rows["completion_mask"])
        return completion_logprobs(self.policy, *args, self.cfg.rollout.temperature, **self.forward_switches)[0]

    def pair_losses(self, ro: Rollout, w: torch.Tensor, lo: torch.Tensor) -> tuple[torch.Tensor, dict]:
        a, k = self.acfg, len(w)
        logp = self.forward_rows(ro, torch.cat([w, lo]))
        lw, ll = logp[:k], logp[k:]
        mw, ml = ro.mask[w], ro.mask[lo]
        zero = torch.zeros_like(lw)
        rw, rl = (ro.ref_logp[w], ro.ref_logp[lo]) if ro.ref_logp is not None else (zero, zero)
        ww = wl = None
        if a.token_weighting == "sampo":
            mw, ml = P.sampo_masks(mw, ml, self.sampo_gen)
        elif a.token_weighting == "tgdpo":
            ww, wl = P.tgdpo_weights(self.token_reward[w], self.token_reward[lo], a.tgdpo_alpha)
        t = SimpleNamespace(rho_w=P.seq_logps(lw - rw, mw, ww), rho_l=P.seq_logps(ll - rl, ml, wl))
        t.h = t.rho_w - t.rho_l
        t.h_mean = t.rho_w / mw.sum(1).clamp(min=1) - t.rho_l / ml.sum(1).clamp(min=1)
        t.avg_w, t.avg_l = P.mean_logps(lw, mw), P.mean_logps(ll, ml)
        t.reward_w, t.reward_l = ro.scores[w], ro.scores[lo]
        loss = PAIR_LOSSES[a.loss](a, t)
        if a.token_weighting == "wpo":
            lss = self.log_sum_sq
            loss = loss * P.wpo_weights(lw, lss[w], mw, ll, lss[lo], ml, clamp=a.wpo_clamp)
        if a.xpo_alpha > 0:
            x = self.xpo_ref
            p = w // ro.group_size  # the prompt of each pair
            lx = completion_logprobs(self.policy, x.prompt_ids[p], x.prompt_mask[p], x.ids[p], x.mask[p],
                                     self.cfg.rollout.temperature)[0]  # fmt: skip
            loss = loss + P.xpo_term(P.seq_logps(lx, x.mask[p]), a.xpo_alpha)
        logit = t.avg_w - t.avg_l if a.loss == "simpo" else t.h
        stats = {
            "pref/reward_accuracy": (logit > 0).float().sum(),
            "pref/margin": (a.beta * t.h).sum(),
            "pref/chosen_logratio": t.rho_w.sum(),
            "pref/rejected_logratio": t.rho_l.sum(),
        }
        return loss, stats

    def labelled_losses(self, ro: Rollout, rows: torch.Tensor, desirable, adv) -> tuple[torch.Tensor, dict]:
        a = self.acfg
        logp = self.forward_rows(ro, rows)
        mask = ro.mask[rows]
        ref = ro.ref_logp[rows] if ro.ref_logp is not None else logp.detach()
        rho = P.seq_logps(logp - ref, mask)
        if a.loss == "kto":
            loss = P.kto_loss(rho, desirable, self.z_ref, a.beta, a.kto_lambda_d, a.kto_lambda_u)
        else:
            loss = P.a_lol_loss(logp, ref, mask, adv.to(logp), a.alol_variant, a.alol_clip, a.alol_kl_beta)
        stats = {"pref/desirable_frac": desirable.float().sum(), "pref/logratio": rho.detach().sum()}
        return loss, stats

    kto_warned: bool = False

    def kto_weight_ratio(self, desirable: torch.Tensor) -> float:
        """λ_D·n_D / (λ_U·n_U) of the step; KTO's Eq. 8 (and TRL's warning) asks for [1, 4/3]. Warns once outside it:
        with more undesirable than desirable samples the undesirable term drives every log-ratio down."""
        a, n_d = self.acfg, int(desirable.sum())
        n_u = len(desirable) - n_d
        ratio = a.kto_lambda_d * n_d / (a.kto_lambda_u * n_u) if n_u else math.inf
        if not 1.0 <= ratio <= 4 / 3 and not self.kto_warned and math.isfinite(ratio):
            self.kto_warned = True
            rank_zero_warn(
                f"KTO: λ_D·n_D / (λ_U·n_U) = {ratio:.2f} at step {self.step_count}, outside [1, 4/3] (KTO Eq. 8): set "
                f"algorithm.kto_lambda_d ≈ {a.kto_lambda_u * n_u / max(n_d, 1):.2f} to balance desirable and "
                "undesirable samples"
            )
        return ratio

    def distributed_blockers(self, world: int) -> list[str]:
        a, out = self.acfg, super().distributed_blockers(world)
        if a.loss == "kto":
            out.append("loss=kto's reference point scores each completion under another group's prompt, which may be "
                       "on another rank: not reduced yet.")  # fmt: skip
        if a.token_weighting in ("sampo", "tgdpo", "wpo"):
            out.append(f"token_weighting={a.token_weighting} keeps per-row quantities outside the rollout (or draws "
                       "its masks in pair order over the step): not gathered across ranks yet.")  # fmt: skip
        if a.xpo_alpha > 0:
            out.append("xpo_alpha > 0 samples a reference completion per prompt outside the rollout: not gathered "
                       "across ranks yet.")  # fmt: skip
        return out

    def update(self, ro: Rollout) -> dict[str, float]:
        opt, sched = self.optimizers(), self.lr_schedulers()
        params = [p for p in self.policy.parameters() if p.requires_grad]
        it, a = self.items, self.acfg
        paired = a.loss not in UNPAIRED
        out: dict[str, float] = {"pref/items": it.n, "pref/items_per_group": it.n / max(it.groups, 1)}
        if a.loss == "kto":
            out["pref/kto_z_ref"] = float(self.z_ref)
            out["pref/kto_weight_ratio"] = self.kto_weight_ratio(it.desirable)
        if it.n == 0:  # no pair (every group tied): nothing to learn from this step
            out["stats/optimizer_steps"] = 0
            return out
        opt.zero_grad(set_to_none=True)
        per_micro = max(1, self.cfg.train.micro_batch_size // (2 if paired else 1))
        sums: dict[str, float] = defaultdict(float)
        # on several ranks: the pairs (within groups) whose rows are this rank's; the loss divides by all ranks' items
        # host: host-side item indices
        owned = torch.ones(ro.size, dtype=torch.bool) if ro.owned is None else ro.owned.cpu()
        mine = owned[it.w] if paired else owned[it.rows]
        sharded = dist.sharded(self.policy)
        finite = True
        # host: host-side item indices
        for chunk, weight in dist.lockstep(list(torch.arange(it.n)[mine].split(per_micro)), torch.arange(1), sharded):
            if paired:
                loss_vec, stats = self.pair_losses(ro, it.w[chunk], it.l[chunk])
            else:
                loss_vec, stats = self.labelled_losses(ro, it.rows[chunk], it.desirable[chunk], it.adv[chunk])
            loss = loss_vec.sum() / it.n
            if weight and not torch.isfinite(loss):
                finite = False
                if not sharded:
                    break
            self.manual_backward(loss * weight)
            if not weight:
                continue
            sums["loss/total"] += float(loss.detach())
            for k, v in stats.items():
                sums[k] += float(v.detach()) / it.n
        if dist.any_rank(not finite):  # on any rank: every rank skips the step
            opt.zero_grad(set_to_none=True)
            self.nonfinite_skipped += 1
            return out | {"stats/optimizer_steps": 0}
        dist.all_reduce_grads(params)
        sums = defaultdict(float, dist.sum_dict(sums))
        grad_norm = dist.local(torch.nn.utils.clip_grad_norm_(params, self.cfg.optim.max_grad_norm))
        if not torch.isfinite(grad_norm):
            opt.zero_grad(set_to_none=True)
            self.nonfinite_skipped += 1
            return out | {"stats/optimizer_steps": 0}
        opt.step()
        sched.step()
        return out | dict(sums) | {"stats/grad_norm": float(grad_norm), "stats/lr": sched.get_last_lr()[0],
                                   "stats/optimizer_steps": 1}  # fmt: skip
