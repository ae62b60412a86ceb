"""The sweep report on a real MLflow store whose cell runs carry synthetic evaluations of known effect: the report's
paired differences, power sentence, noise decomposition and compute fits are recomputed here from the runs read
back through MlflowClient, a known large effect is found and a null one is not, and the report never overwrites a
committed report when the sweep was run with overrides."""

from __future__ import annotations

import csv
import json
import math
import re
import statistics

import numpy as np
import pytest
import yaml
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from scipy import stats as sps

from bench import stats as S
from bench.config import ConfigError
from bench.run.report import _out_dir, report
from bench.run.sweep import load_plan

STEPS = list(range(0, 101, 10))
M = 300
EFFECT = {"grpo": 0.0, "dr_grpo": 0.0, "dapo": 0.6}  # probit skill gained by the end of training


def _sweep_file(tmp, name="synthetic", seeds=5, axes=None, report=None):
    spec = {
        "name": name,
        "description": "synthetic runs of known effect",
        "axes": axes or {"algorithm": list(EFFECT), "seed": list(range(seeds))},
        "overrides": [
            f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}",
            f"output_dir={tmp / 'runs'}",
            f"task.num_eval={M}",
            "trainer.eval_every=10",
        ],  # fmt: skip
        "report": {"out": str(tmp / "results" / name), "baseline": "grpo", "bootstrap_reps": 300, "fit_reps": 30,
                   **(report or {})},
    }  # fmt: skip
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _log_runs(tmp, path, effect=lambda cell: EFFECT[cell.cfg.algorithm.name], keep=lambda cell: True) -> dict:
    """One FINISHED MLflow run per planned cell that ``keep`` accepts: accuracy curves from a probit model
    (problem difficulty b_j, a per-seed skill shared by the variants of a seed, a variant's gain rising as a sigmoid
    in tokens) and the per-problem outcomes of every evaluation as artifacts, exactly as a training run logs them."""
    spec, cells = load_plan(str(path))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
    exp = client.create_experiment(f"sweep-{spec.name}", artifact_location=(tmp / "mlartifacts").as_uri())
    parent = client.create_run(exp, run_name=f"sweep-{spec.name}", tags={"sweep": spec.name, "role": "sweep"})
    rng = np.random.default_rng(0)
    b = rng.normal(0.5, 1.0, M)  # problem difficulty
    seed_skill = rng.normal(0, 0.15, 10)
    truth = {}
    for cell in filter(keep, cells):
        algo, seed = cell.cfg.algorithm.name, int(cell.cfg.seed)
        tags = {"sweep": spec.name, "sweep.cell": cell.id, "role": "cell", "mlflow.parentRunId": parent.info.run_id}
        run = client.create_run(exp, run_name=cell.name, tags=tags)
        rid = run.info.run_id
        noise = rng.normal(0, 0.08)
        metrics, tokens = [], 0.0
        for step in STEPS:
            tokens = step * 2500.0
            gain = effect(cell) / (1 + (1.0e5 / max(tokens, 1e-9)) ** 2.0) if step else 0.0
            theta = seed_skill[seed] + (noise if step else 0.0) + gain
            correct = (theta - b + rng.normal(0, 0.7, M) > 0).astype(int)
            rows = [{"uid": f"p{j}", "correct": int(c), "score": float(c), "length": 20} for j, c in enumerate(correct)]
            client.log_text(rid, "".join(json.dumps(r) + "\n" for r in rows), f"eval/outcomes/step_{step:06d}.jsonl")
            metrics += [Metric("eval/accuracy", float(correct.mean()), 0, step),
                        Metric("eval/at_tokens_generated", tokens, 0, step),
                        Metric("eval/at_samples_seen", step * 128.0, 0, step)]  # fmt: skip
            if step:
                metrics += [
                    Metric("time/step", 0.5, 0, step - 1),
                    Metric("rollout/completion_len_mean", 20.0, 0, step - 1),
                ]
        metrics.append(Metric("rollout/tokens_generated", tokens, 0, STEPS[-1]))
        client.log_batch(rid, metrics=metrics)
        client.set_terminated(rid, "FINISHED")
        truth[cell.id] = (algo, seed, rid)
    client.set_terminated(parent.info.run_id, "FINISHED")
    return {"client": client, "parent": parent.info.run_id, "truth": truth, "spec": spec, "cells": cells}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    path = _sweep_file(tmp)
    logged = _log_runs(tmp, path)
    summary = report(str(path))
    return tmp, path, logged, summary


def _matrices(client, truth, kind: str) -> dict[str, np.ndarray]:
    """[seeds, problems] per variant, rebuilt from the outcome artifacts read back from MLflow."""
    per = {}
    for algo, seed, rid in truth.values():
        steps = {}
        for s in STEPS:
            with open(client.download_artifacts(rid, f"eval/outcomes/step_{s:06d}.jsonl")) as f:
                steps[s] = np.array([json.loads(line)["correct"] for line in f], float)
        if kind == "final":
            v = steps[STEPS[-1]]
        else:
            v = sum((b - a) * (steps[a] + steps[b]) / 2 for a, b in zip(STEPS, STEPS[1:], strict=False)) / STEPS[-1]
        per.setdefault(algo, {})[seed] = v
    return {a: np.stack([d[s] for s in sorted(d)]) for a, d in per.items()}


def test_paired_differences_are_recomputed_from_the_outcomes(synthetic):
    tmp, _, logged, _ = synthetic
    rows = list(csv.DictReader((tmp / "results" / "synthetic" / "comparisons.csv").open()))
    kinds = ("final", "auc", "final@samples", "auc@samples", "final@tokens", "auc@tokens")
    assert {(r["variant"], r["kind"]) for r in rows} == {(v, k) for v in ("dr_grpo", "dapo") for k in kinds}
    rows = [r for r in rows if "@" not in r["kind"]]  # at equal steps here; at equal budget: test_equal_budget_*
    for kind in ("final", "auc"):
        mats = _matrices(logged["client"], logged["truth"], kind)
        for v in ("dr_grpo", "dapo"):
            (row,) = [r for r in rows if r["variant"] == v and r["kind"] == kind]
            paired = S.difference(mats[v], mats["grpo"], paired=True)
            unpaired = S.difference(mats[v], mats["grpo"], paired=False)
            assert float(row["estimate"]) == pytest.approx(paired.estimate, abs=1e-12)
            assert (float(row["paired_lo"]), float(row["paired_hi"])) == pytest.approx((paired.lo, paired.hi))
            assert (float(row["unpaired_lo"]), float(row["unpaired_hi"])) == pytest.approx((unpaired.lo, unpaired.hi))
            assert float(row["narrowing"]) == pytest.approx(1 - paired.half_width / unpaired.half_width)
            assert row["seeds"] == "5" and row["problems"] == str(M)
        # Holm over the two comparisons of this kind
        ps = [S.difference(mats[v], mats["grpo"], paired=True).p for v in ("dr_grpo", "dapo")]
        adj = S.adjust(ps, "holm")
        for v, a in zip(("dr_grpo", "dapo"), adj, strict=True):
            (row,) = [r for r in rows if r["variant"] == v and r["kind"] == kind]
            assert float(row["p_adjusted"]) == pytest.approx(a)


def test_run_level_auc_equals_the_mean_of_per_problem_aucs(synthetic):
    tmp, _, logged, _ = synthetic
    runs = {r["run_id"]: r for r in csv.DictReader((tmp / "results" / "synthetic" / "runs.csv").open())}
    mats = _matrices(logged["client"], logged["truth"], "auc")
    for algo, seed, rid in logged["truth"].values():
        assert float(runs[rid]["auc"]) == pytest.approx(mats[algo][seed].mean(), abs=1e-12)


def test_the_known_effect_is_found_and_the_null_one_is_not(synthetic):
    _, _, _, summary = synthetic
    text = summary.read_text()
    assert "dapo is higher than grpo by" in text
    assert "dr_grpo cannot be told apart from grpo" in text


def test_power_sentence_comes_first_and_says_what_its_number_is(synthetic):
    """The headline detectable difference is the median comparison's, recomputed here from the outcomes: its own seed
    SD on n − 1 degrees of freedom with the problem term held fixed, its χ² interval, and each comparison's own
    detectable difference in the differences table; seeds needed hold the problem term fixed and the floor it sets
    is stated (was: "differences smaller than X are not detectable", X from se·√n, problem term scaled with seeds)."""
    tmp, _, logged, summary = synthetic
    lines = [line for line in summary.read_text().splitlines() if line.strip()]
    assert lines[1].startswith("Headline differences are at equal training steps")  # the axis, first
    lines = lines[1:]
    assert lines[1].startswith("**countdown**: with 5 seeds and 300 evaluation problems, a difference of **")
    assert "is detected with power 0.8 at α = 0.05 (two-sided); smaller ones may be missed" in lines[1]
    assert "not detectable" not in lines[1]
    mats = _matrices(logged["client"], logged["truth"], "final")
    ds = {v: S.difference(mats[v], mats["grpo"], paired=True) for v in ("dr_grpo", "dapo")}
    ranked = sorted(ds.items(), key=lambda kv: kv[1].mde())
    head, d = ranked[0]  # the lower middle of two
    lo, hi = d.mde_interval()
    assert f"a difference of **{d.mde():.3f}** [95% CI {lo:.3f}, {hi:.3f}]" in lines[1], lines[1]
    assert f"the median of 2 comparisons, {head}'s" in lines[1] and "on 4 degrees of freedom" in lines[1]
    need = S.seeds_needed(0.02, d.seed_sd, paired=True, problem_var=d.problem_var)
    want = "no number of seeds" if need == math.inf else f"{need:.0f} seeds per variant"
    assert f"Detecting a difference of 0.02 would take {want}" in lines[1], lines[1]
    if d.problem_var > 0:
        assert f"nothing below {S.mde_floor(d.problem_var):.3f} (final)" in lines[1]
    # the statsmodels MDE without a problem term against the textbook (t_{0.975,4} + t_{0.8,4}) · sd / sqrt(5)
    approx = (sps.t.ppf(0.975, 4) + sps.t.ppf(0.8, 4)) * d.seed_sd / math.sqrt(5)
    assert S.mde(d.seed_sd, 5, paired=True) == pytest.approx(approx, rel=0.15)
    text = summary.read_text()
    for v, dv in ds.items():  # each comparison's own detectable difference in its row
        row = next(line for line in text.splitlines() if line.startswith(f"| {v} | {dv.estimate:+.3f}"))
        assert f"| {dv.mde():.3f} |" in row, row
    rows = list(csv.DictReader((tmp / "results" / "synthetic" / "comparisons.csv").open()))
    for r in rows:
        if r["kind"] == "final":
            assert float(r["mde"]) == pytest.approx(ds[r["variant"]].mde())


def test_holm_family_and_improvement_claims_are_stated_and_calibrated(synthetic):
    """The report names the Holm family (per task and metric), and the probability-of-improvement table carries the
    exact permutation p-value, Holm-adjusted over its pairs, beside rliable's interval (described, not used for
    claims)."""
    tmp, _, logged, summary = synthetic
    text = summary.read_text()
    assert "Holm-adjusted within one family: the comparisons with the baseline in one task" in text
    assert "the final value and the AUC being two families" in text
    assert "over the comparisons of a task" not in text
    assert "| X | Y | P(X > Y) [95% CI] | p | adj. p |" in text and "Holm-adjusted over the 3 pairs" in text
    mats = _matrices(logged["client"], logged["truth"], "final")
    means = {v: m.mean(1)[:, None] for v, m in mats.items()}
    names = sorted(means)
    ps = {(x, y): S.improvement_test(means[x], means[y]) for i, x in enumerate(names) for y in names[i + 1 :]}
    adj = dict(zip(ps, S.adjust(list(ps.values())), strict=True))
    for (x, y), pv in ps.items():
        row = next(line for line in text.splitlines() if line.startswith(f"| {x} | {y} | "))
        assert row.endswith(f"| {_fmt_p(pv)} | {_fmt_p(adj[(x, y)])} |"), row


def _fmt_p(p: float) -> str:
    return "–" if math.isnan(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def test_what_ran_comes_from_the_resolved_configs(synthetic):
    _, _, _, summary = synthetic
    text = summary.read_text()
    assert "held-out: greedy pass@1 on 300 problems of the `test` split every 10 steps" in text
    assert "seeds 0, 1, 2, 3, 4" in text and "Purpose (sweep file): synthetic runs of known effect" in text


def test_noise_decomposition_and_compute_fits(synthetic):
    tmp, _, logged, summary = synthetic
    text = summary.read_text()
    mats = _matrices(logged["client"], logged["truth"], "final")
    n = S.noise(mats["grpo"])
    assert f"| grpo | final | {n.observed_sd:.4f} | {n.eval_sd:.4f} | {n.train_sd:.4f} |" in text
    assert f"| {n.within_run_se:.4f} |" in text and n.within_run_se > n.eval_sd  # difficulty is not seed noise
    fits = {(r["axis"], r["variant"]): r for r in csv.DictReader((tmp / "results" / "synthetic" / "fits.csv").open())}
    dapo = fits[("tokens", "dapo")]
    assert dapo["determined"] == "True", dapo
    assert float(dapo["C_mid"]) == pytest.approx(1.0e5, rel=0.5) and float(dapo["A_lo"]) <= float(dapo["A"])
    assert fits[("tokens", "grpo")]["determined"] == "False"  # no gain: nothing to fit


def test_mlflow_copy_links_its_images_through_the_artifact_endpoint(synthetic):
    tmp, _, logged, summary = synthetic
    client, pid = logged["client"], logged["parent"]
    logged_files = {a.path for a in client.list_artifacts(pid, "report")}
    for f in ("summary.md", "comparisons.csv", "fits.csv", "aggregates.png", "profile.png", "improvement.png",
              "differences.png", "compute_tokens.png", "curves_step.png"):  # fmt: skip
        assert f"report/{f}" in logged_files, f
        if f.endswith(".png"):
            assert (tmp / "results" / "synthetic" / f).read_bytes()[:4] == b"\x89PNG"
    with open(client.download_artifacts(pid, "report/summary.md")) as fh:
        mlflow_copy = fh.read()
    link = f"(http://127.0.0.1:5000/get-artifact?path=report/curves_step.png&run_uuid={pid})"
    assert link in mlflow_copy, "MLflow's markdown viewer shows only absolute http(s) images"
    assert "](curves_step.png)" in summary.read_text() and "get-artifact" not in summary.read_text()


def test_a_report_with_overrides_never_overwrites_the_committed_one(synthetic):
    tmp, path, _, summary = synthetic
    before = summary.read_text()
    moved = report(str(path), ["sweep.report.baseline=dapo"])
    assert moved.parent.name == "synthetic+sweep.report.baseline=dapo" and moved.parent.parent == summary.parent.parent
    assert summary.read_text() == before
    assert "Differences to dapo" in moved.read_text()
    assert "invocations with other overrides, which ran other cells, count too" in moved.read_text()
    assert "invocations with other overrides" not in before  # the sweep's own report: no overrides, no caveat
    spec = load_plan(str(path))[0]
    assert _out_dir(spec, ["sweep.report.baseline=dapo"], tmp / "chosen") == (tmp / "chosen", None)  # --out wins
    assert _out_dir(spec, ["sweep.workers=1"], None) == (summary.parent, None)  # how cells run: the committed place
    where = ["cache_dir=/elsewhere/.cache", "tracking.uri=sqlite:////elsewhere/mlflow.db", "trainer.num_threads=1"]
    assert _out_dir(spec, where, None) == (summary.parent, None)  # where things lie, not what ran: the same place
    moved_dir, note = _out_dir(spec, ["trainer.max_steps=50", "sweep.workers=1"], None)
    assert moved_dir.name == "synthetic+trainer.max_steps=50" and "trainer.max_steps=50" in note


def test_an_unknown_baseline_names_the_variants(synthetic):
    _, path, _, _ = synthetic
    with pytest.raises(ValueError, match=r"report.baseline 'ppo' has no finished runs on countdown; variants: "):
        report(str(path), ["sweep.report.baseline=ppo"])


def test_settings_are_analysed_one_by_one_and_drawn_against_the_knob(tmp_path):
    """report.settings = [task.horizon]: each horizon is its own analysis (DAPO's known effect, present only at
    horizon 8, is found there and not at horizon 1), and settings.csv / the setting curves hold each variant's
    final mean per horizon, equal to the mean over its runs in runs.csv."""
    axes = {"algorithm": ["grpo", "dapo"], "task": ["chain"], "task.horizon": [1, 8], "seed": list(range(5))}
    path = _sweep_file(tmp_path, "horizons", axes=axes, report={"settings": ["task.horizon"], "threshold": 0.5})
    _log_runs(tmp_path, path, lambda c: 0.8 * (c.cfg.algorithm.name == "dapo" and c.cfg.task.horizon == 8))
    summary = report(str(path)).read_text()
    out = tmp_path / "results" / "horizons"
    rows = list(csv.DictReader((out / "comparisons.csv").open()))
    final = {r["task"]: r for r in rows if r["kind"] == "final"}
    assert set(final) == {"chain horizon=1", "chain horizon=8"} and {r["variant"] for r in rows} == {"dapo"}
    assert float(final["chain horizon=8"]["p_adjusted"]) < 0.05 and float(final["chain horizon=8"]["estimate"]) > 0.1
    assert float(final["chain horizon=1"]["paired_lo"]) < 0 < float(final["chain horizon=1"]["paired_hi"])
    points = list(csv.DictReader((out / "settings.csv").open()))
    assert {(p["variant"], float(p["x"])) for p in points} == {(v, x) for v in ("grpo", "dapo") for x in (1.0, 8.0)}
    runs = list(csv.DictReader((out / "runs.csv").open()))
    for p in points:
        where = f"chain horizon={float(p['x']):g}"
        mine = [float(r["final"]) for r in runs if r["variant"] == p["variant"] and r["task"] == where]
        assert len(mine) == 5 and float(p["final"]) == pytest.approx(statistics.fmean(mine))
    assert (out / "settings_horizon.png").stat().st_size > 10_000
    assert "## Against horizon" in summary and "| variant | horizon=1 | horizon=8 |" in summary


def test_a_sweep_part_way_through_reports_the_settings_that_have_runs(tmp_path):
    """A sweep stopped before any cell of its second setting ran (horizon 8): the report analyses horizon 1 and lists
    the ten cells of horizon 8 as missing, instead of failing on a setting with no runs."""
    axes = {"algorithm": ["grpo", "dapo"], "task": ["chain"], "task.horizon": [1, 8], "seed": list(range(5))}
    path = _sweep_file(tmp_path, "partway", axes=axes, report={"settings": ["task.horizon"]})
    _log_runs(tmp_path, path, lambda c: 0.0, keep=lambda c: c.cfg.task.horizon == 1)
    summary = report(str(path)).read_text()
    rows = list(csv.DictReader((tmp_path / "results" / "partway" / "comparisons.csv").open()))
    assert rows and {r["task"] for r in rows} == {"chain horizon=1"}
    missing = next(line for line in summary.splitlines() if line.startswith("Cells without a finished run"))
    assert missing.count("horizon=8") == 10 and "horizon=1" not in missing


def test_a_joined_sweep_supplies_the_baseline_paired_by_seed(tmp_path):
    """report.join: a sweep of DAPO alone, joined with an earlier sweep of GRPO in the same store, is compared with
    that GRPO seed by seed: the same paired difference as when both ran in one sweep, and the summary names the
    joined sweep."""
    axes = {"algorithm": ["grpo", "dapo"], "seed": list(range(5))}
    both = _sweep_file(tmp_path, "both", axes=axes)
    _log_runs(tmp_path, both)
    report(str(both))
    base = _sweep_file(tmp_path, "base", axes={"algorithm": ["grpo"], "seed": list(range(5))})
    _log_runs(tmp_path, base)
    new = _sweep_file(tmp_path, "new", axes={"algorithm": ["dapo"], "seed": list(range(5))},
                      report={"join": [str(base)]})  # fmt: skip
    _log_runs(tmp_path, new)
    summary = report(str(new)).read_text()

    def final_row(name):
        rows = csv.DictReader((tmp_path / "results" / name / "comparisons.csv").open())
        return next(r for r in rows if r["kind"] == "final" and r["variant"] == "dapo")

    joined, together = final_row("new"), final_row("both")
    assert joined["baseline"] == "grpo" and float(joined["estimate"]) > 0.1
    for key in ("estimate", "paired_lo", "paired_hi"):
        assert float(joined[key]) == pytest.approx(float(together[key]), abs=0.03), key
    assert f"Joined from sweep `{base}`" in summary and "5 runs of grpo" in summary
    unrun = _sweep_file(tmp_path, "unrun", axes={"algorithm": ["dr_grpo"], "seed": list(range(5))})
    lonely = _sweep_file(tmp_path, "lonely", axes={"algorithm": ["dapo"], "seed": list(range(5))},
                         report={"join": [str(unrun)]})  # fmt: skip
    _log_runs(tmp_path, lonely)
    with pytest.raises(ConfigError, match="has no finished runs"):
        report(str(lonely))


def test_two_setting_axes_get_one_panel_per_value_of_the_second(tmp_path):
    """report.settings = [rollout.staleness, rollout.sampler_dtype] (the off_policy sweep): the curves against
    staleness are drawn and tabled once per sampler precision, each point the mean of its own runs only (not two
    points at one x under one label)."""
    axes = {
        "algorithm": ["grpo"],
        "algorithm.is_correction": ["none", "tis"],
        "task": ["countdown"],
        "rollout.staleness": [0, 1],
        "rollout.sampler_dtype": ["float32", "bfloat16"],
        "seed": list(range(3)),
    }
    settings = {"settings": ["rollout.staleness", "rollout.sampler_dtype"], "baseline": "grpo is_correction=none"}
    path = _sweep_file(tmp_path, "regimes", axes=axes, report=settings)
    c = lambda c: 0.8 * (c.cfg.algorithm.is_correction == "tis" and c.cfg.rollout.sampler_dtype == "bfloat16")  # noqa: E731
    _log_runs(tmp_path, path, c)
    summary = report(str(path)).read_text()
    out = tmp_path / "results" / "regimes"
    points = list(csv.DictReader((out / "settings.csv").open()))
    panels = {f"countdown rollout.sampler_dtype={d}" for d in ("float32", "bfloat16")}
    keys = [(p["panel"], p["variant"], float(p["x"])) for p in points]
    assert len(keys) == len(set(keys)) == 8 and {k[0] for k in keys} == panels, keys
    runs = list(csv.DictReader((out / "runs.csv").open()))
    for p in points:
        dtype = p["panel"].split("=")[-1]
        where = f"countdown rollout.staleness={float(p['x']):g} rollout.sampler_dtype={dtype}"
        mine = [float(r["final"]) for r in runs if r["variant"] == p["variant"] and r["task"] == where]
        assert len(mine) == 3 and float(p["final"]) == pytest.approx(statistics.fmean(mine)), (p, where)
    gain = {(p["panel"], p["x"]): float(p["final"]) for p in points if p["variant"] == "grpo is_correction=tis"}
    base = {(p["panel"], p["x"]): float(p["final"]) for p in points if p["variant"] == "grpo is_correction=none"}
    for k in gain:
        assert (gain[k] - base[k] > 0.1) == k[0].endswith("bfloat16"), (k, gain[k], base[k])
    for panel in panels:
        assert f"**{panel}**" in summary
    assert "| variant | rollout.staleness=0 | rollout.staleness=1 |" in summary
    assert (out / "settings_rollout.staleness.png").stat().st_size > 10_000


def test_a_long_legend_sits_beside_the_axes_inside_the_saved_figure(tmp_path):
    """Labels of a sweep with several config axes are long: the legend goes beside the axes (not over the curves),
    the figure widens for it (the axes keep their width), and the saved PNG holds all of it."""
    from PIL import Image

    from bench.run import plots

    fig, (ax,) = plots._panels(1)
    labels = [f"ppo critic=head beta={b} whiten_adv={w} critic_warmup=0 (n=5)" for b in (0.0, 0.05) for w in "TF"]
    for i, label in enumerate(labels):
        ax.plot([0, 1], [i, i + 1], label=label)
    axes_width = ax.get_window_extent().width
    plots._legend(ax)
    plots._save(fig, tmp_path / "long.png")
    legend, frame = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 > frame.x1, (legend, frame)  # beside, not over the curves
    assert ax.get_window_extent().width >= 0.8 * axes_width
    width, _ = Image.open(tmp_path / "long.png").size
    assert width >= legend.x1 * 110 / fig.dpi - 2, (width, legend)

    fig, (ax,) = plots._panels(1)
    ax.plot([0, 1], [0, 1], label="grpo (n=5)")
    plots._legend(ax)
    plots._save(fig, tmp_path / "short.png")
    assert not ax.get_legend().beside  # short labels: inside the axes as before


def test_equal_budget_comparisons_reduce_to_equal_steps_when_every_variant_sees_the_same_samples(synthetic):
    """Every synthetic run sees 128 samples per step and 2500 tokens per step: at equal samples and tokens the
    comparisons are the equal-step ones (to 1e-9), over the same range."""
    tmp, *_ = synthetic
    rows = list(csv.DictReader((tmp / "results" / "synthetic" / "comparisons.csv").open()))
    by = {(r["variant"], r["kind"]): r for r in rows}
    for v in ("dr_grpo", "dapo"):
        for kind in ("final", "auc"):
            for axis, per_step in (("samples", 128), ("tokens", 2500)):
                b, s = by[(v, f"{kind}@{axis}")], by[(v, kind)]
                for col in ("estimate", "paired_lo", "paired_hi", "p_adjusted"):
                    assert float(b[col]) == pytest.approx(float(s[col]), abs=1e-9), (v, kind, axis, col)
                assert (float(b["budget_lo"]), float(b["budget_hi"])) == (0.0, STEPS[-1] * per_step)


def _budget_group(variant: str, per_step: float, slope: float, offsets: list[float], uids=None):
    from omegaconf import OmegaConf

    from bench.run.report.data import Group, RunStats
    from bench.run.sweep import Cell

    runs = []
    for k, e in enumerate(offsets):
        cell = Cell({"algorithm": variant, "seed": k}, OmegaConf.create({"seed": k}), f"{variant}{k}", variant, "t")
        curve = {s: slope * s + 0.01 * k + (e if s else 0.0) for s in STEPS}
        x = {"samples": {s: per_step * s for s in STEPS}, "tokens": {s: 10 * per_step * s for s in STEPS}}
        runs.append(RunStats(cell, f"r-{variant}{k}", curve, x, 20.0, 1.0, 1.0, 1.0))
    return Group("t", variant, runs)


def test_equal_budget_golden_values_and_a_variant_that_wins_per_step_only():
    """A variant that draws twice the samples per step and learns twice as fast per step is the baseline per sample:
    at equal samples the difference is its seed offsets alone (hand-computed: their mean), compared at the
    baseline's last budget (the largest both reach) and over [0, that]; at equal steps it is ahead by 0.2, and the
    report names it as winning per step but not per sample."""
    from bench.run.report.budget import BUDGETS, compare_budget, per_step_not_per_budget
    from bench.run.report.compare import compare
    from bench.run.sweep import SweepSpec

    offsets = [0.004, -0.003, 0.001, -0.002, 0.002]
    base = _budget_group("grpo", 100.0, 0.002, [0.0] * 5)
    fast = _budget_group("fast", 200.0, 0.004, offsets)
    spec = SweepSpec()
    cs = compare([base, fast], base, None, spec)
    cs += [c for axis in BUDGETS for c in compare_budget([base, fast], base, None, spec, axis)]
    by = {c.kind: c for c in cs}
    assert by["final"].main.estimate == pytest.approx(0.2 + np.mean(offsets))
    for axis, hi in (("samples", 10_000.0), ("tokens", 100_000.0)):
        f, a = by[f"final@{axis}"], by[f"auc@{axis}"]
        assert f.budget == (0.0, hi) and a.budget == (0.0, hi)
        assert f.main.estimate == pytest.approx(np.mean(offsets), abs=1e-12)
        # AUC over [0, hi]: the offset applies from the first evaluation after 0 (step 10 of the fast runs, budget
        # 2000 samples): the mean of a curve that ramps from 0 to e over [0, 0.2 hi] and stays e is 0.9 e
        assert a.main.estimate == pytest.approx(0.9 * np.mean(offsets), abs=1e-12)
    named = per_step_not_per_budget(cs, 0.05)
    assert any(s.startswith("**fast wins per step but not per sample**") for s in named), named
    assert any("per token" in s for s in named), named
    # each estimate once, with its interval: "+0.004 [lo, hi] at equal steps", not "+0.004 +0.004 [lo, hi]"
    assert not any(re.search(r"([+-]\d\.\d{3}) \1 \[", s) for s in named), named


def test_until_step_reads_every_run_up_to_that_step(tmp_path):
    """report.until_step = 20: "final" is each run's value at step 20 (the paired difference is the seeds' mean
    difference of step-20 accuracies, read back from the outcome artifacts), not at step 100, and the summary says
    the runs were cut. DAPO's synthetic gain rises as a sigmoid in tokens, so it is small at step 20,
    large at 100."""
    axes = {"algorithm": ["grpo", "dapo"], "seed": list(range(5))}
    full = _sweep_file(tmp_path, "full", axes=axes)
    _log_runs(tmp_path, full)
    report(str(full))
    early = _sweep_file(tmp_path, "early", axes=axes, report={"until_step": 20})
    logged = _log_runs(tmp_path, early)  # the same runs (the same generator seed), under this sweep's name
    summary = report(str(early)).read_text()

    def final_row(name):
        rows = csv.DictReader((tmp_path / "results" / name / "comparisons.csv").open())
        return next(r for r in rows if r["kind"] == "final" and r["variant"] == "dapo")

    acc = {}
    for algo, seed, rid in logged["truth"].values():
        with open(logged["client"].download_artifacts(rid, "eval/outcomes/step_000020.jsonl")) as f:
            acc[algo, seed] = statistics.fmean(json.loads(line)["correct"] for line in f)
    by_hand = statistics.fmean(acc["dapo", s] - acc["grpo", s] for s in range(5))
    assert float(final_row("early")["estimate"]) == pytest.approx(by_hand, abs=1e-9)
    assert float(final_row("full")["estimate"]) > float(final_row("early")["estimate"]) + 0.1
    assert "**Read up to step 20** (`report.until_step`)" in summary


def test_a_variant_has_the_same_colour_in_the_curves_and_in_the_differences_to_the_baseline(tmp_path, monkeypatch):
    """The differences plot leaves the baseline out; its variants still take the colours the learning curves give
    them (it once coloured by position without the baseline, so gspo there had grpo's colour in the curves)."""
    from types import SimpleNamespace

    from bench.run import plots

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig))
    variants = ["dr_grpo", "grpo", "gspo", "gtpo"]
    plots.plot([_budget_group(v, 8.0, 0.01 * k, [0.0, 0.01]) for k, v in enumerate(variants)], "step", "m", tmp_path)
    point = SimpleNamespace(estimate=0.0, lo=-0.1, hi=0.1)
    plots.plot_differences({"t": ("grpo", {v: [(s, point) for s in STEPS] for v in variants if v != "grpo"})}, "m",
                           tmp_path)  # fmt: skip

    def colours(fig):
        return {
            line.get_label().split(" ")[0]: line.get_color()
            for line in fig.axes[0].get_lines()
            if line.get_label()[0] != "_"
        }

    curves, differences = colours(figures[0]), colours(figures[1])
    assert set(differences) == {"dr_grpo", "gspo", "gtpo"}
    assert all(differences[v] == curves[v] for v in differences), (curves, differences)
    assert len(set(curves.values())) == 4

    from rliable import plot_utils

    given, draw = {}, plot_utils.plot_interval_estimates
    monkeypatch.setattr(
        plot_utils, "plot_interval_estimates", lambda *a, **kw: (given.update(kw["colors"]), draw(*a, **kw))[1]
    )
    agg = {v: {k: [(0.5, 0.4, 0.6), (0.5, 0.4, 0.6)] for k in plots.KINDS} for v in variants}
    scores = {k: {v: np.full((2, 1), 0.1 * i) for i, v in enumerate(variants)} for k in plots.KINDS}
    plots.plot_rliable(scores, agg, {}, "m", tmp_path)
    assert given == curves  # rliable's interval estimates too, not its own palette
