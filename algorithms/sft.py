"""SFT: supervised warm start on a task's demonstrations (maximum likelihood of the completion tokens only).

ℒ = −(1/N) Σ_{i,t} m_{i,t} log π_θ(y_{i,t} | x_i, y_{i,<t}), with m = 1 on demonstration tokens and the EOS that ends
them, 0 on prompt and padding (N = Σ m, token-mean over the optimizer step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench import dist
from bench.engine.policy import position_ids
from bench.rl.module import AlgorithmConfig, PolicyModule


@dataclass
class SFTConfig(AlgorithmConfig):
    name: str = "sft"
    label_smoothing: float = 0.0
    """Label smoothing of the cross-entropy (0: plain maximum likelihood)."""


def sft_loss(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Token-mean cross-entropy on positions whose label is not -100. logits [B, L, V], labels [B, L]."""
    shift_logits = logits[:, :-1].float()  # position t predicts token t+1
    shift_labels = labels[:, 1:]
    return torch.nn.functional.cross_entropy(
        shift_logits.reshape(-1, shift_logits.shape[-1]),
        shift_labels.reshape(-1),
        ignore_index=-100,
        label_smoothing=label_smoothing,
    )


class SFT(PolicyModule):
    Config = SFTConfig
    multi_turn = True  # an environment's demonstrations are whole episodes (Task.collate_demonstrations)
    description = "Supervised fine-tuning on demonstrations (completion tokens only); the warm start for RL"
    train_stream = "demonstrations"

    def training_step(self, batch: dict, batch_idx: int):
        # On several ranks each takes its share of the step's examples; the loss is the sum over its tokens divided by
        # the step's token count over all ranks, times the ranks (DDP averages the gradients): the one-process loss.
        n = batch["input_ids"].shape[0]
        batch = {k: v[dist.part(n)] if torch.is_tensor(v) else v for k, v in batch.items()}
        mask = batch["attention_mask"]
        logits = self.policy(input_ids=batch["input_ids"], attention_mask=mask, position_ids=position_ids(mask)).logits
        loss = sft_loss(logits, batch["labels"], self.acfg.label_smoothing)
        if dist.active():
            tokens = (batch["labels"][:, 1:] != -100).sum().double()
            loss = loss * tokens / dist.all_sum(tokens.clone()) * dist.world()
        self.log_metrics(
            {
                "loss/sft": dist.all_sum(loss.detach().clone()) / dist.world(),
                "stats/lr": self.lr_schedulers().get_last_lr()[0],
                "stats/tokens": (batch["labels"] != -100).sum(),
            }
        )
        self.log("loss", loss.detach(), prog_bar=True, logger=False)
        return loss

    def distributed_blockers(self, world: int) -> list[str]:
        b = self.cfg.train.batch_size
        return [f"train.batch_size={b} must divide by them (each rank takes an equal share)."] if b % world else []

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, gradient_clip_val=self.cfg.optim.max_grad_norm, gradient_clip_algorithm="norm")
