"""From scratch at tiny scale: the study's arms (`task.ARMS`) trained on `task.Task`, a task where the context
decides the answer, at one length, and tested where `task.TESTS` says (longer, with more distractors).

The models are the project's own HF classes (`RepoLlamaForCausalLM`: RoPE, NoPE, or RePo, in every layer or
from layer n_layers // 3 with RoPE below, as the paper's 1B has it), trained by a plain AdamW loop on freshly
drawn batches, one thread each: what is measured is the position mode, at a size one core trains in minutes.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F

from ...modes import F_PHI_WEIGHTS
from .task import Arm, Task, TinyModel

__all__ = ["F_PHI_STREAM", "accuracy", "build", "train"]


F_PHI_STREAM = 1_000_003
"""f_phi's weights are drawn with seed F_PHI_STREAM + the model's seed, apart from the weights every arm shares."""


def build(arm: Arm, shape: TinyModel, seed: int, yarn: int = 1) -> torch.nn.Module:
    """A fresh `RepoLlamaForCausalLM` of `arm` for `seed`; `yarn` > 1: its RoPE (and RePo's rotation) YaRN-scaled
    by that factor from the training length.

    Matched across arms: every tensor but f_phi's is the one a RoPE model drawn with `seed` starts from (HF draws
    f_phi's weights between the other layers', so without this a RePo model and its control would start apart)."""
    from ...hf import RepoLlamaConfig, RepoLlamaForCausalLM
    from ...rope import repo_layers

    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": shape.theta}
    if yarn > 1:
        rope = {**rope, "rope_type": "yarn", "factor": float(yarn),
                "original_max_position_embeddings": shape.task.length}  # fmt: skip

    def model(modes: dict[str, Any], draw: int) -> torch.nn.Module:
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
            **modes,
        )
        torch.manual_seed(draw)
        return RepoLlamaForCausalLM(config)

    built = model(
        {"pe_mode": arm.mode, "pe_start_layer": shape.layers // 3 if arm.upper else 0}, F_PHI_STREAM + seed
    )
    shared = model({}, seed).state_dict()
    with torch.no_grad():
        for name, tensor in built.state_dict().items():
            if name in shared:
                tensor.copy_(shared[name])
            else:  # f_phi's: nothing else may be drawn apart
                assert name.rsplit(".", 2)[-2] in F_PHI_WEIGHTS, f"{name}: a tensor no RoPE model has"
        if arm.zero_final:
            for layer in repo_layers(built):
                layer.final_map.weight.zero_()
    return built


def train(arm: Arm, shape: TinyModel, seed: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Train `arm` from scratch (AdamW (0.9, 0.95), weight decay 0.1, clipping 1.0; a linear warm-up, the peak
    held, then a linear decay to 0 over the last fifth: recall appears after a plateau, at the peak rate; f_phi at
    `arm.lr_multiplier` times the rate, and RePo layers blended with the index as `arm.blend` says) on
    `arm.shaped(shape).steps` fresh batches drawn with `seed` (the same for every arm), on their targets (the answers and the
    noise); returns the model (eval mode, no blend) and its facts: `loss`, the mean loss on the answers over the
    last 100 steps; `curve`, that mean for every 100 steps (when the recall appeared); `wall_s`."""
    from ...modes import index_blend
    from ...rope import repo_layers, set_index_blend

    shape = arm.shaped(shape)
    model = build(arm, shape, seed).train()
    f_phi = {id(p) for layer in repo_layers(model) for p in layer.f_phi_weights()}
    groups = [
        {"params": [p for p in model.parameters() if id(p) not in f_phi], "scale": 1.0},
        {"params": [p for p in model.parameters() if id(p) in f_phi], "scale": arm.lr_multiplier},
    ]
    opt = torch.optim.AdamW(groups, lr=shape.lr, betas=(0.9, 0.95), weight_decay=0.1)
    blend_steps = round(arm.blend * shape.steps)
    gen = torch.Generator().manual_seed(seed)
    start, losses, curve = time.monotonic(), [], []
    for step in range(shape.steps):
        warm, decay = (step + 1) / shape.warmup, (shape.steps - step) / (0.2 * shape.steps)
        for group in opt.param_groups:
            group["lr"] = shape.lr * group["scale"] * min(1.0, warm, decay)
        if blend_steps:
            set_index_blend(model, index_blend(1.0, blend_steps, step))
        ids, targets, answers = shape.task.batch(gen, shape.batch)
        logits = model(ids).logits  # [B, T, vocab]
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="none")
        opt.zero_grad(set_to_none=True)
        loss.sum().div((targets != -100).sum()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss[answers.flatten()].mean().item())
        if step % 100 == 99 or step == shape.steps - 1:
            curve.append(round(sum(losses[-100:]) / len(losses[-100:]), 5))
    set_index_blend(model, 0.0)
    facts = {
        "loss": sum(losses[-100:]) / len(losses[-100:]),
        "curve": curve,
        "wall_s": time.monotonic() - start,
    }
    return model.eval(), facts


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
