"""From scratch at tiny scale: RoPE, NoPE and RePo trained on `task.Task`, a task where the context decides the
answer, at one length, and tested at that length and at 4x (with and without YaRN) with more distractors.

The models are the project's own HF classes (`RepoLlamaForCausalLM`: RoPE, NoPE in every layer, or RePo from
layer n_layers // 3 with RoPE below, as the paper's 1B has it), trained by a plain AdamW loop on freshly drawn
batches, one thread each: what is measured is the position mode, at a size one core trains in minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .task import Task, TinyModel

__all__ = ["accuracy", "build", "train"]


def build(arm: str, shape: TinyModel, seed: int, yarn: int = 1) -> torch.nn.Module:
    """A fresh `RepoLlamaForCausalLM` of `arm`; `yarn` > 1: its RoPE (and RePo's rotation) YaRN-scaled by that
    factor from the training length."""
    from ...hf import RepoLlamaConfig, RepoLlamaForCausalLM

    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": shape.theta}
    if yarn > 1:
        rope = {**rope, "rope_type": "yarn", "factor": float(yarn),
                "original_max_position_embeddings": shape.task.length}  # fmt: skip
    modes = {"RoPE": {}, "NoPE": {"pe_mode": "nope"},
             "RePo": {"pe_mode": "repo", "pe_start_layer": shape.layers // 3}}  # fmt: skip
    config = RepoLlamaConfig(
        vocab_size=shape.task.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.mlp,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        head_dim=shape.hidden // shape.heads,
        max_position_embeddings=shape.task.length * max(yarn, 1),
        rope_parameters=rope,
        tie_word_embeddings=True,
        initializer_range=0.02,
        **modes[arm],
    )
    torch.manual_seed(seed)
    return RepoLlamaForCausalLM(config)


def train(
    arm: str, shape: TinyModel, seed: int, progress: Callable[[int, float], None] | None = None
) -> tuple[torch.nn.Module, dict[str, float]]:
    """Train `arm` from scratch (AdamW (0.9, 0.95), weight decay 0.1, clipping 1.0; a linear warm-up, the peak
    held, then a linear decay to 0 over the last fifth: recall appears after a plateau, at the peak rate) on
    `shape.steps` fresh batches drawn with `seed`, on their targets (the answers and the noise); returns the
    model (eval mode), the mean loss on the answers over the last 100 steps and the wall time.
    `progress(step, loss)` every 100 steps."""
    model = build(arm, shape, seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=shape.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    start, losses = time.monotonic(), []
    for step in range(shape.steps):
        warm, decay = (step + 1) / shape.warmup, (shape.steps - step) / (0.2 * shape.steps)
        for group in opt.param_groups:
            group["lr"] = shape.lr * min(1.0, warm, decay)
        ids, targets, answers = shape.task.batch(gen, shape.batch)
        logits = model(ids).logits  # [B, T, vocab]
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="none")
        opt.zero_grad(set_to_none=True)
        loss.sum().div((targets != -100).sum()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss[answers.flatten()].mean().item())
        if progress is not None and (step % 100 == 99 or step == shape.steps - 1):
            progress(step + 1, sum(losses[-100:]) / len(losses[-100:]))
    return model.eval(), {"loss": sum(losses[-100:]) / len(losses[-100:]), "wall_s": time.monotonic() - start}


@torch.no_grad()
def accuracy(model: torch.nn.Module, task: Task, n: int, seed: int) -> tuple[int, int]:
    """(right, scored) greedy answers (the queried values) of `model` on n test sequences of `task` drawn with `seed`."""
    gen = torch.Generator().manual_seed(seed)
    right = scored = 0
    for rows in range(0, n, 50):
        ids, targets, answers = task.batch(gen, min(50, n - rows))
        predicted = model(ids).logits.argmax(-1)
        right += int((predicted[answers] == targets[answers]).sum())
        scored += int(answers.sum())
    return right, scored
