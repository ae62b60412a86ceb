"""One process of tests/test_dist.py's comparisons, started by torchrun (1 or 2 processes): train an algorithm for a
few steps through bench.run.train.train (Lightning's DDP strategy on CPU with gloo when there are 2), on injected
rollouts: every completion, its log-probs and its score are pure functions of the row's global identity (step, round,
prompt, sample), so one process and two see the same global batch whatever the model does. Several algorithms run one
after another in the same processes (one process group; the launcher's start-up is paid once). Rank 0 writes each
run's final weights (train() does) and a JSON line per run with its directory.

    torchrun --standalone --nproc_per_node 2 tests/dist_step.py OUT_DIR ALGORITHM[,ALGORITHM...] [key=value ...]

``inject=false`` after the algorithms trains on the real policy's samples and the task's reward instead.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dist as bench_dist  # noqa: E402
from bench.config import compose  # noqa: E402
from bench.engine.rollout import Generation, sample_seed  # noqa: E402
from bench.registry import TASKS  # noqa: E402
from bench.rl.module import RLModule  # noqa: E402
from bench.run.train import train  # noqa: E402


def injected_sample(self, batch, group_size, temperature, seeds, model=None):
    """G completions per prompt from the prompt's own seed: random lengths and tokens (never padding), EOS ending the
    ones shorter than the budget."""
    T, eos, pad = self.cfg.rollout.max_new_tokens, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
    vocab = len(self.tokenizer)
    ids, logp, mask, ended = [], [], [], []
    for seed in seeds:
        g = torch.Generator().manual_seed(seed % 2**62)
        for _ in range(group_size):
            n = int(torch.randint(2, T + 1, (1,), generator=g))
            row = torch.randint(3, vocab, (n,), generator=g)
            if n < T:
                row[-1] = eos
            ids.append(torch.cat([row, torch.full((T - n,), pad)]))
            mask.append(torch.cat([torch.ones(n), torch.zeros(T - n)]))
            logp.append(-torch.rand(T, generator=g) * mask[-1])
            ended.append(n < T)
    m = torch.stack(mask)
    dev = self.device
    return Generation(torch.stack(ids).to(dev), m.to(dev), torch.stack(logp).to(dev), m.sum(1).long().to(dev),
                      ~torch.tensor(ended, device=dev))  # fmt: skip


def injected_score(self, ro) -> None:
    """Scores 0, 0.5 or 1 from each row's global identity (so groups have reward variance and DAPO drops some)."""
    s = [sample_seed("score", int(k)) % 3 / 2 for k in ro.row_key.tolist()]
    ro.scores = torch.tensor(s, dtype=torch.float32, device=self.device)
    ro.correct = ro.scores == 1.0
    ro.components = {"half": (ro.scores == 0.5).float()}


# The global batch here is 4 prompts x 4 completions = 16 rows; CISPO's file asks for minibatches of 32: two of 8
# (two optimizer steps per rollout, each minibatch's rows split across the ranks by ownership).
# VinePPO: a state every 3 tokens and 3 continuations each, so that the step's prefixes fill several chunks (dealt out
# across the ranks). The trees: G = 4 leaves as 2 x 2 segments of 4 tokens, grown from the real policy (the injected
# sampler is the group sampler's; the trees' scores are injected).
PER_ALGORITHM = {
    "cispo": ["train.minibatch_size=8"],
    "vineppo": ["algorithm.steps=every", "algorithm.step_tokens=3", "algorithm.mc_rollouts=3"],
    "treepo": ["algorithm.fanout=[2,2]", "algorithm.segment_tokens=4"],
    "spo_tree": ["algorithm.fanout=[2,2]", "algorithm.segment_tokens=4"],
    "spo_stream": [
        "rollout.prompts_per_step=8",
        "rollout.group_size=1",
        "trainer.max_steps=2",
        "task.num_train=16",
        "algorithm.pool_factor=2",
    ],
}


def run(out: str, algorithm: str, extra: list[str]) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # torchrun --nnodes N: N nodes of `local` processes
    task = [] if any(a.startswith("task=") for a in extra) else ["task=countdown"]
    args = [f"algorithm={algorithm}", *task, "model.hidden_size=32", "model.num_layers=2",
            "model.num_heads=2", "model.intermediate_size=64", "rollout.prompts_per_step=4", "rollout.group_size=4",
            "rollout.max_new_tokens=12", "rollout.logp_from_sampler=false", "task.num_eval=6", "eval.batch_size=6",
            "trainer.max_steps=1", "trainer.eval_every=100", "trainer.progress_bar=false", "trainer.accelerator=cpu",
            f"trainer.devices={local}", f"trainer.num_nodes={world // local}",
            f"tracking.tracking_uri=sqlite:///{out}/mlflow.db", f"output_dir={out}/runs",
            f"cache_dir={out}/cache", "optim.lr=1e-3", "train.micro_batch_size=4", *PER_ALGORITHM.get(algorithm, []),
            *extra]  # fmt: skip
    result = train(compose(args))
    if int(os.environ.get("RANK", "0")) == 0:
        line = {"algorithm": algorithm, "run_dir": str(result.run_dir), "run_id": result.run_id}
        print("DIST-RESULT " + json.dumps(line), flush=True)


if __name__ == "__main__":
    out, algorithms, *extra = sys.argv[1:]
    for arg in [a for a in extra if a.startswith("include=")]:  # a dropped-in task file's directory
        TASKS.include(Path(arg.removeprefix("include=")))
        extra.remove(arg)
    if "inject=false" in extra:
        extra.remove("inject=false")
    else:
        RLModule.sample, RLModule.score = injected_sample, injected_score
    for algorithm in algorithms.split(","):
        run(f"{out}/{algorithm}", algorithm, extra)
    bench_dist.shutdown()  # as `python -m bench` does: the process group goes before the interpreter's teardown
