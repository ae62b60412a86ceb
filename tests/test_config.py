"""Config layering and start-up errors: unknown keys and wrong types name the key and the nearest valid key."""

from __future__ import annotations

import pytest

from bench.config import CONF, ConfigError, compose
from bench.registry import ALGORITHMS, TASKS, RegistryError


def test_layering_order():
    """defaults < config.yaml < model < task < algorithm < command line."""
    cfg = compose(["algorithm=grpo", "task=countdown"])
    assert cfg.model.hidden_size == 128  # conf/model/tiny.yaml
    assert cfg.rollout.max_new_tokens == 32  # conf/task/countdown.yaml
    assert cfg.rollout.group_size == 8 and cfg.optim.lr == 1e-4  # conf/config.yaml
    assert cfg.algorithm.beta == 0.04  # conf/algorithm/grpo.yaml
    cfg = compose(["algorithm=grpo", "task=countdown", "optim.lr=0.5", "rollout.group_size=3"])
    assert cfg.optim.lr == 0.5 and cfg.rollout.group_size == 3


def test_unknown_key_names_nearest():
    """A misspelt key fails at start-up with its full name and the nearest valid key."""
    with pytest.raises(ConfigError, match=r"algorithm\.clip_eps_hihg.*Did you mean 'algorithm\.clip_eps_high'"):
        compose(["algorithm=grpo", "task=countdown", "algorithm.clip_eps_hihg=0.3"])
    with pytest.raises(ConfigError, match=r"trainer\.max_step\b.*Did you mean 'trainer\.max_steps'"):
        compose(["algorithm=grpo", "task=countdown", "trainer.max_step=3"])
    with pytest.raises(ConfigError) as err:
        compose(["algorithm=grpo", "task=countdown", "algorithm.clip_eps_hgh=0.3"])
    text = str(err.value)  # one suggestion, with full keys (OmegaConf's own leaf-only one dropped)
    assert text.count("Did you mean") == 1 and "'algorithm.clip_eps_high'" in text and "?." not in text, text


def test_wrong_type_names_key():
    """A value of the wrong type names the key and the value it had, and suggests no other key (was: "Did you mean
    'rollout.group_size'", the key already typed)."""
    with pytest.raises(ConfigError) as err:
        compose(["algorithm=grpo", "task=countdown", "rollout.group_size=many"])
    text = str(err.value)
    assert "bad value for config key 'rollout.group_size'" in text and "rollout.group_size=8" in text, text
    assert "Did you mean" not in text, text


def test_algorithm_fields_are_typed_per_algorithm():
    """Algorithm keys are validated against the selected algorithm's own dataclass."""
    with pytest.raises(ConfigError, match=r"algorithm\.clip_eps_low"):
        compose(["algorithm=sft", "task=countdown", "algorithm.clip_eps_low=0.2"])


def test_unknown_algorithm_and_task_list_available():
    """Unknown names fail with the available names and a did-you-mean."""
    with pytest.raises(RegistryError, match=r"unknown algorithm 'grop'\. Available: .*grpo.*Did you mean 'grpo'"):
        compose(["algorithm=grop", "task=countdown"])
    with pytest.raises(RegistryError, match=r"unknown task 'countdwn'.*Did you mean 'countdown'"):
        compose(["algorithm=grpo", "task=countdwn"])
    with pytest.raises(ConfigError, match=r"unknown model 'tinyy'.*Did you mean 'tiny'.*name_or_path"):
        compose(["algorithm=grpo", "task=countdown", "model=tinyy"])


def test_bad_argument_form():
    with pytest.raises(ConfigError, match="not key=value"):
        compose(["algorithm"])


@pytest.mark.parametrize("algorithm", sorted(p.stem for p in (CONF / "algorithm").glob("*.yaml")))
def test_every_algorithm_yaml_validates(algorithm):
    """Every shipped conf/algorithm/*.yaml composes against its algorithm's dataclass."""
    compose([f"algorithm={algorithm}", "task=countdown"])


@pytest.mark.parametrize("task", sorted(p.stem for p in (CONF / "task").glob("*.yaml")))
def test_every_task_yaml_validates(task):
    """Every shipped conf/task/*.yaml composes against its task's dataclass."""
    compose(["algorithm=grpo", f"task={task}"])


@pytest.mark.parametrize("model", sorted(p.stem for p in (CONF / "model").glob("*.yaml")))
def test_every_model_yaml_validates(model):
    compose(["algorithm=grpo", "task=countdown", f"model={model}"])


def test_every_registered_name_has_yaml():
    """Each algorithm and task ships its conf/ file (the paper's defaults with reasons)."""
    for name in ALGORITHMS.names():
        assert (CONF / "algorithm" / f"{name}.yaml").exists(), name
    for name in TASKS.names():
        assert (CONF / "task" / f"{name}.yaml").exists(), name


def test_added_defaults_are_the_defaults_and_leave_identities_unchanged():
    """Every key of ADDED_DEFAULTS is recorded at its actual default (so a default config hashes exactly as it did
    before the key existed), and setting one to anything else changes the hash."""
    from bench.config import ADDED_DEFAULTS, config_hash, flatten

    # conf/task/countdown.yaml sets demo_error_rate 0.5 and conf/task/delay.yaml filler varied: new defaults on purpose
    # (new warm starts and cells), so set them back. A key exists only where it applies (critic_warmup: actor-critic).
    cfgs = [
        compose(["algorithm=grpo", "task=countdown", "task.demo_error_rate=0.0"]),
        compose(["algorithm=ppo", "task=countdown", "task.demo_error_rate=0.0"]),
        compose(["algorithm=grpo", "task=delay", "task.filler=fixed"]),
        compose(["algorithm=grpo", "task=reasoning_gym"]),
    ]
    flats = [flatten(c) for c in cfgs]
    for key, value in ADDED_DEFAULTS.items():
        where = [f for f in flats if key in f]
        assert where, f"{key} is in none of the configs checked"
        assert all(f[key] == value for f in where), (key, [f[key] for f in where], value)
    for cfg, flat in zip(cfgs, flats, strict=True):
        before = {k: v for k, v in flat.items() if k not in ADDED_DEFAULTS}  # the config as it was before these keys
        assert config_hash(cfg) == config_hash(before)
    stale = compose(["algorithm=grpo", "task=countdown", "task.demo_error_rate=0.0", "rollout.staleness=1"])
    assert config_hash(stale) != config_hash(cfgs[0])


def test_setup_cfg_asks_for_the_omegaconf_that_supports_literal_fields():
    """The config dataclasses use typing.Literal fields, which OmegaConf supports from 2.4; setup.cfg asked for
    >=2.3, where a fresh install could resolve to a version that rejects them at start-up."""
    import configparser

    from packaging.requirements import Requirement

    from bench import ROOT

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = [x.split("#")[0].strip() for x in cfg["options"]["install_requires"].splitlines()]
    (req,) = [Requirement(x) for x in lines if x.startswith("omegaconf")]
    assert not req.specifier.contains("2.3.0") and req.specifier.contains("2.4.0"), req


@pytest.mark.parametrize(
    "task,key,bad,valid",
    [
        ("countdown", "rollout.sampler_dtype", "fp8", "['float32', 'bfloat16', 'float16']"),
        ("countdown", "rollout.sampler_attention", "flash", "['model', 'eager', 'sdpa']"),
        ("countdown", "rollout.prompt_pool", "easy", "['all', 'solvable']"),
        ("countdown", "trainer.strategy", "deepspeed", "['auto', 'ddp', 'fsdp']"),
        ("countdown", "task.demo_error_mode", "mix", "['replace', 'add']"),
        ("chain", "task.reward", "dense", "['outcome', 'partial']"),
        ("delay", "task.position", "middle", "['end', 'start']"),
        ("delay", "task.filler", "random", "['fixed', 'varied']"),
        ("text_to_sql", "task.schema_format", "json", "['compact', 'create']"),
    ],
)
def test_a_value_outside_a_keys_choices_names_the_key_and_the_choices(task, key, bad, valid):
    """The choice-valued keys are typed Literal (OmegaConf validates them): a bad value fails at start-up naming the
    key, the value and every valid one."""
    with pytest.raises(ConfigError) as e:
        compose(["algorithm=grpo", f"task={task}", f"{key}={bad}"])
    assert f"'{key}'" in str(e.value) and f"'{bad}'" in str(e.value) and valid in str(e.value), str(e.value)
