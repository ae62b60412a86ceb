"""scripts/headroom_pilots.py: reads runs named <prefix>-s<seed> back from a real MLflow store and draws them."""

import os
import subprocess
import sys

from mlflow.tracking import MlflowClient

from bench import ROOT


def test_pilot_plot_groups_runs_by_name_and_reports_the_mean_gain(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("pilot-headroom", artifact_location=(tmp_path / "art").as_uri())
    curves = {"a-s0": [0.10, 0.20, 0.30], "a-s1": [0.20, 0.25, 0.30], "a-long-s0": [0.1, 0.9, 0.9, 0.9]}
    for name, values in curves.items():
        run = client.create_run(exp, run_name=name)
        for i, v in enumerate(values):
            client.log_metric(run.info.run_id, "eval/accuracy", v, step=20 * i)
        client.set_terminated(run.info.run_id)
    killed = client.create_run(exp, run_name="a-s2")  # not finished: left out
    client.log_metric(killed.info.run_id, "eval/accuracy", 0.0, step=0)
    client.set_terminated(killed.info.run_id, "KILLED")
    out = tmp_path / "pilots.png"
    proc = subprocess.run(
        [sys.executable, "scripts/headroom_pilots.py", "--group", "a = x=a", "--group", "none=b", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "MLFLOW_TRACKING_URI": uri},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # a-s0 and a-s1 only (not a-long-s0, not the killed a-s2): start (0.10 + 0.20) / 2, gain (0.20 + 0.10) / 2
    assert "a = x: 2 seeds, start 0.150, gain +0.150" in proc.stdout
    assert "none: no finished runs" in proc.stdout
    assert out.stat().st_size > 10_000
