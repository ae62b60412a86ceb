"""The GPU path, checked on this CPU (issue 40): where each tensor is made, which device each engine gets, what a Ray
cell's environment says, and that the manual's multi-GPU commands (docs/devices.md) build the runs they promise.

On a CPU every tensor is on the one device and a tensor made on the wrong one fails nowhere. Two means make such a
bug fail here: a lint over every tensor constructor in the harness (a constructor without ``device=`` must say why
the host is right for it, ``# host: ...``), and torch's ``meta`` device as a second device, which refuses to meet a
CPU tensor in an op exactly as CUDA does."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import dist
from bench.config import compose

ROOT = Path(__file__).resolve().parents[1]
CONSTRUCTORS = {"tensor", "as_tensor", "zeros", "ones", "full", "empty", "arange", "linspace", "eye", "rand", "randn",
                "randint", "randperm"}  # fmt: skip


def bare_constructors(source: str) -> list[tuple[int, str]]:
    """(line, code) of each ``torch.<constructor>(...)`` call without ``device=`` and without a ``# host`` note on
    its lines or the line above."""
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and node.func.attr in CONSTRUCTORS):  # fmt: skip
            continue
        if any(k.arg == "device" for k in node.keywords):
            continue
        span = lines[max(node.lineno - 2, 0) : node.end_lineno]
        if not any("# host" in line for line in span):
            out.append((node.lineno, lines[node.lineno - 1].strip()))
    return sorted(set(out))


def harness_files() -> list[Path]:
    return sorted([*ROOT.glob("bench/**/*.py"), *ROOT.glob("algorithms/*.py"), *ROOT.glob("tasks/*.py")])


def test_every_tensor_the_harness_makes_is_made_on_a_device_or_says_why_the_host():
    found = {
        f"{p.relative_to(ROOT)}:{n}": code for p in harness_files() for n, code in bare_constructors(p.read_text())
    }
    assert not found, (
        "tensors made without device= (on a GPU they land on the CPU and fail when they meet a CUDA tensor or reach "
        "an NCCL collective): pass device= (the device of what they meet), or note `# host: <why>` when the host "
        f"is right (host-side indices, a batch Lightning moves): {found}"
    )


def test_the_lint_catches_issue_40s_first_bug_put_back():
    """``sum_floats`` as it was: its tensor on the CPU, which NCCL refuses."""
    source = (ROOT / "bench" / "dist.py").read_text()
    fixed = "torch.tensor(values, dtype=torch.float64, device=comm_device())"
    assert fixed in source
    assert not bare_constructors(source)
    assert [code for _, code in bare_constructors(source.replace(fixed, "torch.tensor(values, dtype=torch.float64)"))]


def test_a_collective_refuses_a_tensor_on_another_device_with_the_fix(monkeypatch):
    """``dist.check``: what every collective helper runs on its tensor (a GPU run's comm device is its CUDA device)."""
    monkeypatch.setattr(dist, "comm_device", lambda: torch.device("meta"))
    monkeypatch.setattr(dist.dist, "get_backend", lambda *a: "nccl")
    with pytest.raises(RuntimeError, match=r"gather_rows: a tensor on cpu .*needs meta.*device="):
        dist.check(torch.zeros(2), "gather_rows")
    x = torch.zeros(2, device="meta")
    assert dist.check(x, "gather_rows") is x
    assert dist.comm_device() == torch.device("meta")


def test_the_comm_device_is_the_cpu_without_a_process_group():
    assert not dist.active() and dist.comm_device() == torch.device("cpu")


# ---- 5: the hf engine's behaviour copy follows the policy to its device -----------------------------------------
def test_the_behaviour_copy_made_before_the_policy_moves_follows_it():
    """Under FSDP the copy is made in configure_model, before Lightning moves the policy to its device, and it is no
    nn.Module of the LightningModule. The meta device stands in for CUDA: before the fix the step-0 weight copy
    failed (a meta tensor copied into a CPU one), as a CUDA one would meet the CPU copy."""
    from bench.engine.behaviour import BehaviourPolicy
    from bench.engine.policy import load_policy

    cfg = compose(["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64"])
    policy, _ = load_policy(cfg.model, 0)
    behaviour = BehaviourPolicy("bfloat16", 1)
    behaviour.prepare(policy)  # configure_model, before the move
    assert next(behaviour.copy.parameters()).device.type == "cpu"
    policy.to("meta")  # what Lightning's strategy does next (to cuda:r)
    copy = behaviour.model(policy, 0)
    assert {p.device.type for p in copy.parameters()} == {"meta"}
    assert {p.dtype for p in copy.parameters()} == {torch.bfloat16}


# ---- 6: KTO's labels meet the log-ratios on their device ---------------------------------------------------------
def test_kto_loss_takes_host_labels_with_values_on_another_device():
    from bench.pref.losses import kto_loss
    from bench.pref.pairs import labelled_rows

    rows, desirable, _ = labelled_rows(torch.tensor([1.0, 0.0, 0.5, 0.5]), 2)  # as advantages() makes them: host
    rho = torch.zeros(len(rows), device="meta")
    out = kto_loss(rho, desirable, torch.zeros((), device="meta"), 0.1)
    assert out.device.type == "meta" and out.shape == (2,)
    cpu = kto_loss(torch.tensor([0.3, -0.2]), desirable, torch.tensor(0.0), 0.1)  # the values themselves unchanged
    torch.testing.assert_close(
        cpu, torch.tensor([1 - torch.sigmoid(torch.tensor(0.03)), 1 - torch.sigmoid(torch.tensor(0.02))])
    )


# ---- 4, 10: one vLLM engine per rank, on the rank's GPU, in the rank's folder -----------------------------------
def test_each_ranks_engine_runs_under_the_external_launcher_on_its_own_gpu():
    from bench.engine.vllm import executor_args

    assert executor_args(False, 1, 2, 0) == ({}, {})  # CPU: vLLM's default executor, as tested on this machine
    assert executor_args(True, 0, 1, 0) == ({}, {})  # one GPU: nothing changes
    kw, env = executor_args(True, 3, 4, 3)
    assert kw == {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1}
    assert env == {"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "4"}  # LOCAL_RANK: the GPU vLLM's worker takes


def test_ranks_write_their_engine_weights_to_their_own_folders():
    source = (ROOT / "bench" / "rl" / "module.py").read_text()
    assert 'where / "engine" / f"rank{dist.rank()}"' in source  # the folder each rank's engine loads step 0 from


# ---- 8: a Ray cell keeps the GPUs Ray gave it ---------------------------------------------------------------------
@pytest.mark.slow  # a local Ray cluster: about 50 s
def test_a_ray_cell_gets_the_gpus_ray_assigned_not_the_drivers():
    """A real local Ray cluster declaring 2 GPUs (none needed: Ray only assigns ids); the driver's environment says
    CUDA_VISIBLE_DEVICES=7, as an exported variable or SLURM would. Each cell must see the id Ray gave its task."""
    ray = pytest.importorskip("ray")
    from bench.run import sweep as S

    assert S.cell_env({"CUDA_VISIBLE_DEVICES": "1", "A": "w"}, {"CUDA_VISIBLE_DEVICES": "7", "A": "d", "B": "d"}) == {
        "CUDA_VISIBLE_DEVICES": "1", "A": "d", "B": "d"}  # fmt: skip
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(S._ray_run).options(num_cpus=1, num_gpus=1)
        argv = [sys.executable, "-c", "import os; print('seen', os.environ.get('CUDA_VISIBLE_DEVICES'))"]
        refs = [task.remote(argv, str(ROOT), {"CUDA_VISIBLE_DEVICES": "7", "PYTHONUNBUFFERED": "1"}) for _ in range(2)]
        seen = sorted(re.search(r"seen (\S+)", out).group(1) for rc, out in ray.get(refs))
    finally:
        ray.shutdown()
    assert "7" not in seen and set(seen) <= {"0", "1"}, seen


# ---- 9: float16 is refused (the update's clipping does not unscale) -----------------------------------------------
def test_float16_mixed_precision_is_refused_with_the_reason():
    from bench.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match=r"16-mixed.*loss scaler.*Choose 32-true or bf16-mixed"):
        compose(["trainer.precision=16-mixed"])


# ---- 2: the manual's multi-device commands build the runs they say ------------------------------------------------
def readme_device_commands() -> list[tuple[str, list[str]]]:
    """(command, its arguments after `bench train|sweep`) of each command in docs/devices.md's block."""
    text = (ROOT / "docs" / "devices.md").read_text()
    start = text.index("## Commands")
    block = text[text.index("```bash", start) + 7 : text.index("```", text.index("```bash", start) + 7)]
    block = block.replace("\\\n", " ")
    out = []
    for line in block.splitlines():
        m = re.search(r"-m bench (train|sweep) (.*)", line)
        if m:
            args = [a for a in m.group(2).replace("[--launcher ray]", "").split() if a != "..."]
            out.append((m.group(1), args))
    return out


def test_the_manuals_multi_gpu_commands_resolve_to_gpu_runs():
    from bench.run.sweep import load_plan

    commands = readme_device_commands()
    assert len(commands) >= 6
    for kind, args in commands:
        if kind == "train":
            cfg = compose(args)
            on_cpu = "trainer.accelerator=gpu" not in args
            assert cfg.trainer.accelerator == ("cpu" if on_cpu else "gpu"), args
            assert cfg.trainer.devices >= 2 and cfg.model.name in ("smollm2-135m", "tiny"), args
            if not on_cpu:
                assert cfg.model.name == "smollm2-135m"
        else:
            spec, cells = load_plan(args[0], args[1:])
            assert spec.resources.devices_per_cell == 2 and spec.resources.gpus_per_cell == 1
            assert {c.cfg.trainer.accelerator for c in cells} == {"gpu"}
    assert any("trainer.strategy=fsdp" in a for _, a in commands)
    assert any("trainer.num_nodes=2" in a for _, a in commands)


def test_bench_config_prints_the_gpu_run_of_the_readmes_first_command():
    """The command-line path, as a user would check a command before running it: ``bench config``."""
    kind, args = readme_device_commands()[0]
    out = subprocess.run([sys.executable, "-m", "bench", "config", *args], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert re.search(r"accelerator: gpu", out.stdout) and re.search(r"devices: 2", out.stdout)


# ---- make gpu-check fails where it cannot run ---------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="shows what a machine without CUDA gets")
def test_gpu_check_fails_where_its_tests_would_skip():
    """``--gpu-strict`` (what scripts/gpu_check.sh passes): a gpu-marked test that skips (here: no CUDA) fails, with the
    skip's reason; without it the same test skips, as everywhere else."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-p", "no:xdist",
           "tests/test_gpu.py::test_engine_logprobs_equal_the_learners_on_cuda"]  # fmt: skip
    lenient = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    strict = subprocess.run([*cmd, "--gpu-strict"], cwd=ROOT, capture_output=True, text=True)
    assert lenient.returncode == 0 and "2 skipped" in lenient.stdout, lenient.stdout[-800:]
    assert strict.returncode == 1 and re.search(r"\b2 (failed|errors)\b", strict.stdout), strict.stdout[-800:]
    assert "make gpu-check needs this test to run, and it skipped: Skipped: no CUDA device" in strict.stdout


def test_gpu_check_script_refuses_a_machine_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("shows what a machine without CUDA gets")
    p = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True,
                       env={**__import__("os").environ, "OUT": str(tmp_path), "PY": sys.executable})  # fmt: skip
    assert p.returncode == 1
    assert "torch has no CUDA device here" in (tmp_path / "gpu_check.txt").read_text()
