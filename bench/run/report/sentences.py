"""The report's plain sentences: what the sweep can detect, what ran, which variants differ from the baseline and which
cannot be told apart, and the number formats they share."""

from __future__ import annotations

import math

from omegaconf import OmegaConf

from bench import stats as S
from bench.run.report.compare import Comparison, Power
from bench.run.report.data import KINDS
from bench.run.sweep import (
    Cell,
    ReportSpec,
    SweepSpec,
)


# ---- text -----------------------------------------------------------------------------------------------------------
def _fmt(m: float, ci: float, digits: int = 3) -> str:
    if m is None or math.isnan(m):
        return "–"
    return f"{m:.{digits}f}" + ("" if ci is None or math.isnan(ci) else f" ± {ci:.{digits}f}")


def _big(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:,.0f}"


def _ci(d: S.Difference | None, digits: int = 3) -> str:
    if d is None or math.isnan(d.lo):
        return "–"
    return f"{d.estimate:+.{digits}f} [{d.lo:+.{digits}f}, {d.hi:+.{digits}f}]"


def _mde(c: Comparison, rep: ReportSpec) -> str:
    """The difference this comparison detects with the report's power (its own seed SD and problem term)."""
    d = c.main
    m = d.mde(alpha=rep.alpha, power=rep.power) if not math.isnan(d.se) else math.nan
    return "–" if math.isnan(m) else f"{m:.3f}"


def _p(p: float) -> str:
    return "–" if math.isnan(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def power_sentence(ps: list[Power], baseline: str, metric: str, spec: SweepSpec, gain: float) -> str:
    """The sentence at the top of a task's report: the difference this sweep detects with the report's power (what it
    is: the median comparison's, with its interval), the seeds a target effect needs and the floor the evaluation
    set sets, and how the gain over the start compares with the detectable difference."""
    final, auc = ps
    if final.sd == 0:
        return (
            f"**{final.task}**: every variant's final `{metric}` minus {baseline}'s was the same on every seed, so "
            "the variance of the paired differences, which sets the smallest detectable difference, is zero and "
            "cannot be estimated from this sweep."
        )
    if math.isnan(final.mde):
        return (
            f"**{final.task}**: with {final.seeds} seed(s) this sweep cannot estimate the smallest difference it can "
            "detect (a t-test needs at least 2 seeds per variant)."
        )
    rep = spec.report
    problems = f"{final.problems} evaluation problems" if final.problems else "run-level values"
    ci = lambda p: "" if math.isnan(p.mde_lo) else f" [95% CI {p.mde_lo:.3f}, {p.mde_hi:.3f}]"  # noqa: E731
    if final.comparisons:
        how = (f"paired by seed against {baseline}; " if final.paired else "unpaired; ") + (
            f"the median of {final.comparisons} comparisons, {final.headline}'s; each one's own is in its differences "
            f"table"
            if final.comparisons > 1
            else f"{final.headline} against {baseline}"
        )
        if final.paired and not math.isnan(final.mde_unpaired):
            how += f"; {final.mde_unpaired:.3f} unpaired"
        how += f". The interval is that of the seed SD on {final.df:.0f} degrees of freedom"
    else:
        how = "one variant: the SD of its own seeds, unpaired"
    noisiest = (f" The noisiest comparison detects only {final.mde_noisiest:.3f}."
                if final.mde_noisiest > 1.5 * final.mde else "")  # fmt: skip
    floor = ""
    if final.floor > 0:
        floor = (f" The evaluation set's problem term does not shrink with seeds: with any number of seeds nothing "
                 f"below {final.floor:.3f} (final) or {auc.floor:.3f} (AUC) is detected with this power.")  # fmt: skip

    def need(p: Power) -> str:
        if p.needed == math.inf:
            return f"no number of seeds (the floor is {p.floor:.3f})" if p.target <= p.floor else "more than 100,000"
        return f"{p.needed:.0f} seeds per variant" if p is final else f"{p.needed:.0f}"

    ratio = (f" The median variant's gain over the start (final − step 0) is {gain:+.3f}, {gain / final.mde:.1f}x the "
             "detectable difference." if math.isfinite(gain) else "")  # fmt: skip
    return (
        f"**{final.task}**: with {final.seeds} seeds and {problems}, a difference of **{final.mde:.3f}**{ci(final)} "
        f"in the final `{metric}` is detected with power {rep.power:g} at α = {rep.alpha:g} (two-sided); smaller ones "
        f"may be missed ({how}). Over training (AUC): {auc.mde:.3f}{ci(auc)}.{noisiest} Detecting a difference of "
        f"{final.target:g} would take {need(final)} (final) or {need(auc)} (AUC).{floor}{ratio}"
    )


def what_ran(cells: list[Cell], uids: list[str] | None) -> str:
    """The settings a task's cells actually used, read from their resolved configs (a key that differs between
    cells shows every value)."""

    def v(path: str) -> str:
        vals = sorted({str(OmegaConf.select(c.cfg, path)) for c in cells})
        return " | ".join(vals)

    c0 = cells[0].cfg
    seeds = sorted({int(c.cfg.seed) for c in cells})
    init = v("init")
    if init == "sft":
        shared = v("warm_start.seed")
        whose = "a per-seed" if shared == "None" else f"one (seed {shared}, shared by every seed)"
        init = f"sft ({whose} SFT warm start of {v('warm_start.max_steps')} steps)"
    sampled = ""
    if any(c.cfg.eval.samples_per_problem for c in cells):
        sampled = (
            f", plus {v('eval.samples_per_problem')} samples per problem at temperature {v('eval.temperature')} "
            f"(top-p {v('eval.top_p')})"
        )
    problems = len(uids) if uids else v("task.num_eval")
    return (
        f"model `{v('model.name')}` ({v('model.name_or_path')}), init {init}; {v('trainer.max_steps')} rollout steps "
        f"of {v('rollout.prompts_per_step')} prompts x {v('rollout.group_size')} completions, at most "
        f"{v('rollout.max_new_tokens')} new tokens at temperature {v('rollout.temperature')}, lr {v('optim.lr')}; "
        f"held-out: greedy pass@1 on {problems} problems of the `{c0.task.eval_split}` split every "
        f"{v('trainer.eval_every')} steps{sampled}; seeds {', '.join(map(str, seeds))}."
    )


def difference_sentences(cs: list[Comparison], spec: SweepSpec, metric: str) -> list[str]:
    """Plain sentences: which variants differ from the baseline beyond noise, and which cannot be told apart."""
    out = []
    method = {"holm": "Holm", "bh": "Benjamini-Hochberg"}[spec.report.correction]
    for kind in KINDS:
        family = [c for c in cs if c.kind == kind]
        if not family:
            continue
        what = "final value" if kind == "final" else "mean over training (AUC)"
        beyond = [c for c in family if c.p_adjusted < spec.report.alpha]
        within = [c for c in family if not c.p_adjusted < spec.report.alpha and not math.isnan(c.main.se)]
        untestable = [c for c in family if math.isnan(c.main.se)]
        base = family[0].baseline
        parts = []
        for c in beyond:
            d = c.main
            word = "higher" if d.estimate > 0 else "lower"
            parts.append(
                f"{c.variant} is {word} than {base} by {abs(d.estimate):.3f} ({_ci(d)}, adjusted p {_p(c.p_adjusted)})"
            )
        text = f"{what[0].upper()}{what[1:]}: " + ("; ".join(parts) + ". " if parts else "")
        alone = [c for c in within if not c.main.lo <= 0 <= c.main.hi]  # excludes 0 alone, not after adjustment
        held = [c for c in within if c not in alone]
        if held:
            text += (
                f"{', '.join(c.variant for c in held)} cannot be told apart from {base} "
                f"({'each interval holds 0' if len(held) > 1 else 'the interval holds 0'}). "
            )
        for c in alone:
            text += (
                f"{c.variant} − {base} = {_ci(c.main)} excludes 0 on its own, but not after {method}'s adjustment for "
                f"{len(family)} comparisons (adjusted p {_p(c.p_adjusted)}): suggestive, not established. "
            )
        if untestable:
            text += f"Not testable (fewer than 2 seeds): {', '.join(c.variant for c in untestable)}."
        out.append(text.strip())
    return out


def _fit_lines(t: str, fitted: dict) -> list[str]:
    lines = ["### Compute efficiency (ScaleRL sigmoid)", "",
             "R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) fitted to every seed's evaluations against tokens generated "
             "(R0 fixed to the mean start; the start itself left out), 95% CIs from refitting on resampled seeds. A is "
             "the asymptote, B the efficiency exponent, C_mid the compute at half the gain.", "",
             "| variant | A [95% CI] | B [95% CI] | C_mid tokens [95% CI] | C_mid samples | determined |",
             "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    tok, sam = fitted["tokens"].get(t, {}), fitted["samples"].get(t, {})
    for v in sorted(tok):
        f, s = tok[v], sam.get(v)
        if f is None:
            lines.append(f"| {v} | – | – | – | – | too few points |")
            continue
        ci = (
            {
                k: f" [{lo:.{d}f}, {hi:.{d}f}]"
                for (k, d), (lo, hi) in ((("A", 3), f.ci.get("A", (0, 0))), (("B", 2), f.ci.get("B", (0, 0))))
            }
            if f.ci
            else {}
        )
        cm = "" if "C_mid" not in f.ci else f" [{f.ci['C_mid'][0]:,.0f}, {f.ci['C_mid'][1]:,.0f}]"
        sm = "–" if s is None or math.isnan(s.C_mid) else f"{s.C_mid:,.0f}"
        det = "yes" if f.determined else f"**no**: {f.reason}"
        lines.append(
            f"| {v} | {f.A:.3f}{ci.get('A', '')} | {f.B:.2f}{ci.get('B', '')} | {f.C_mid:,.0f}{cm} | {sm} | {det} |"
        )
    return lines + [""]


def _setting_lines(points: list[dict], knob: str, metric: str) -> list[str]:
    """The setting curves as tables: per task, variants down, the knob's values across."""
    lines = [f"## Against {knob}", "", f"Final held-out {metric}, mean over seeds [95% t interval], and in brackets "
             "the mean samples until the threshold (n/N seeds that reached it). Each setting's own section below "
             "compares the variants with the baseline, paired by seed; the picture is "
             f"[settings_{knob}.png](settings_{knob}.png).", ""]  # fmt: skip
    for task in sorted({p["panel"] for p in points}):
        mine = [p for p in points if p["panel"] == task]
        xs = sorted({p["x"] for p in mine})
        thr = mine[0]["threshold"]
        head = " | ".join(f"{knob}={x:g}" for x in xs)
        lines += [f"**{task}** (threshold {thr:g})", "", f"| variant | {head} |", "|---|" + "---:|" * len(xs)]
        for v in sorted({p["variant"] for p in mine}):
            at = {p["x"]: p for p in mine if p["variant"] == v}
            cells_ = []
            for x in xs:
                p = at.get(x)
                if p is None:
                    cells_.append("–")
                    continue
                lo, hi = p["final"] - p["final_ci95"], p["final"] + p["final_ci95"]
                ci = "" if math.isnan(p["final_ci95"]) else f" [{lo:.2f}, {hi:.2f}]"
                sam = _big(p["samples_to_threshold"])
                cells_.append(f"{p['final']:.3f}{ci} ({sam}, {p['reached']}/{p['seeds']})")
            lines.append(f"| {v} | " + " | ".join(cells_) + " |")
        lines.append("")
    lines += [f"![final value and samples to threshold against {knob}](settings_{knob}.png)", ""]
    return lines
