"""ai2-olmo 0.6.0: what the RePo block, the factory, the trainer and the loaders take from OLMo's internals.

What OLMo lacks, and what this module does about it:

- No extension point for blocks: `OLMoBlock.build` is a hard-coded classmethod and `BlockType` a closed Enum.
  `route_block_build(build)` replaces the classmethod (idempotently); `STOCK_BLOCK_BUILD` is the original.
- No way to hand a block's attention anything but OLMo's own arguments: `OLMoSequentialBlock.forward` passes
  its `attention_bias` argument through untouched into `attention()`, also into its fine-grained activation
  checkpoint call. `BiasAndPositions` rides in that argument: the recomputation in backward sees the same
  positions, and nothing is stored on the module.
- `OLMoBlock.attention` rotates keys after caching them, by integer index. The RePo block keeps its
  structure with the rotation moved: `heads()` and `attend()` are its two halves, restated from
  `OLMoBlock.attention`, around the private `_cast_attn_bias` and `_scaled_dot_product_attention`.
- `OLMo._make_state_dict_compatible` (private) renames the keys of older checkpoints and of FSDP/DDP
  wrappers; `make_state_dict_compatible` calls it.
- `olmo.train.fused_loss_fn` is None without flash-attn: `fused_loss_available()`.
- The trainer (`olmo_repo.ai2olmo.trainer.RepoTrainer`) relies on `Trainer.fit` asking `check_if_cancelled`
  every `cfg.canceled_check_interval` steps, and on `Trainer.close` calling `wandb.finish(quiet=True)`.
- No extension point for evaluators beyond `label_to_task_map` (whose tasks get only the tokenizer, and whose
  metric is one `ICLMetric` number named `eval/downstream/{label}_{type}`). `build_evaluators` looks up the
  module global `olmo.eval.build_evaluator` once per config: `route_evaluator_build(build)` replaces it
  (idempotently); `STOCK_EVALUATOR_BUILD` is the original. The in-loop NIAH evaluator
  (`olmo_repo.ai2olmo.niah`) subclasses `Evaluator` and relies on `Trainer.eval`'s protocol: per evaluator
  `reset_metrics()`, every batch of `eval_loader` (`len` and `iter`; `subset_num_batches` caps them),
  `eval_step` -> `eval_batch` -> `model_forward` (reads `input_ids` and the optional mask/bias keys only,
  so extra batch keys ride along) -> `update_metrics(batch, ce_loss, logits [B, T, V])`, then
  `compute_metrics()` to the console (and `metrics.jsonl`) and W&B.

- No per-group learning rate: `Trainer.train_step` sets every param group's lr to the scheduler's value at
  `scheduler_current` right before `optim.step()` (its own TODO says so), and `load_trainer_state_dict`
  does the same on restore and resets the weight decay of every group that has one to the config's. f_phi's
  group (`olmo_repo.ai2olmo.trainer`) gets its own values back after both: before every step through a
  step pre-hook of torch's optimizer (`hold_group_settings`, with `scheduled_lr`, the value `train_step`
  computes), and after every restore. Its parameters leave the groups `build_optimizer` made
  (`get_param_groups`: decay and no-decay, by parameter name, FSDP's original parameters with
  `use_orig_params`) into a group of their own (`split_param_group`), which `fix_optim_state_dict` restores
  like the others (same group count; OLMo's group fields from the current optimizer, the rest from the
  checkpoint). The trainer reads steps completed as `global_step - 1` inside `train_step`, as `Trainer.fit`
  counts the step before it runs it.

`CANARIES` holds the source hashes of everything above at ai2-olmo 0.6.0 (`tests/test_upstream.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import olmo.eval
import olmo.train
import torch
from olmo.config import EvaluatorConfig, ModelConfig, TrainConfig
from olmo.eval import Evaluator
from olmo.model import BufferCache, OLMo, OLMoBlock
from olmo.tokenizer import Tokenizer
from olmo.train import Trainer
from torch import Tensor
from torch.utils.hooks import RemovableHandle

__all__ = [
    "CANARIES",
    "STOCK_BLOCK_BUILD",
    "STOCK_EVALUATOR_BUILD",
    "BiasAndPositions",
    "attend",
    "fused_loss_available",
    "heads",
    "hold_group_settings",
    "make_state_dict_compatible",
    "route_block_build",
    "route_evaluator_build",
    "scheduled_lr",
    "split_param_group",
]

VERSION = "0.6.0"
CANARIES = {
    "olmo_repo.upstream.olmo.STOCK_BLOCK_BUILD": "9ad1fd516bbef20e",  # OLMoBlock.build before the routing
    "olmo.model.OLMoBlock.attention": "eca522c0062f8adc",
    "olmo.model.OLMoBlock._cast_attn_bias": "f4c240b502aa245c",
    "olmo.model.OLMoBlock._scaled_dot_product_attention": "24b382e72b2eb6ed",
    "olmo.model.OLMoSequentialBlock.forward": "5a363c238dbacb0d",
    "olmo.model.OLMo._make_state_dict_compatible": "b01163ab254d1c0f",
    "olmo.train.Trainer.fit": "4b584d30c8bfb201",
    "olmo.train.Trainer.close": "2831541caa2efac5",
    "olmo_repo.upstream.olmo.STOCK_EVALUATOR_BUILD": "9b11634fa98a18dd",  # olmo.eval.build_evaluator before the routing
    "olmo.eval.build_evaluators": "5b913672aac0a1c4",
    "olmo.eval.evaluator.Evaluator": "34e5e05307c9ffcd",
    "olmo.train.Trainer.eval": "0d5e997d7defd624",
    "olmo.train.Trainer.eval_step": "a9b417655dc033f9",
    "olmo.train.Trainer.eval_batch": "4b85d88f8cea9452",
    "olmo.train.Trainer.model_forward": "94274a85de63985d",
    "olmo.train.Trainer.train_step": "059f5a8620a64ce8",  # one lr for every group, then optim.step()
    "olmo.train.Trainer.load_trainer_state_dict": "0117753eb6151990",  # lr and weight decay reset
    "olmo.optim.get_param_groups": "a52dcc81b9530d08",
    "olmo.optim.fix_optim_state_dict": "8aad9a18d0c018e6",
}

KVCache = tuple[Tensor, Tensor]
Build = Callable[[type[OLMoBlock], int, ModelConfig, BufferCache], OLMoBlock]

STOCK_BLOCK_BUILD: Build = OLMoBlock.__dict__["build"].__func__


def route_block_build(build: Build) -> None:
    """Make `OLMoBlock.build` call `build` (idempotent)."""
    if OLMoBlock.__dict__["build"].__func__ is not build:
        OLMoBlock.build = classmethod(build)  # type: ignore[method-assign,assignment]


EvaluatorBuild = Callable[[TrainConfig, EvaluatorConfig, Tokenizer, torch.device], Evaluator]

STOCK_EVALUATOR_BUILD: EvaluatorBuild = olmo.eval.build_evaluator


def route_evaluator_build(build: EvaluatorBuild) -> None:
    """Make OLMo's `build_evaluators` call `build` for every evaluator config (idempotent); `build` hands the
    configs it does not claim to `STOCK_EVALUATOR_BUILD`."""
    olmo.eval.build_evaluator = build


class BiasAndPositions(NamedTuple):
    """What the RePo block passes as `attention_bias`: OLMo's bias and the positions of this block."""

    bias: Tensor | None
    positions: Tensor | None  # [B, H_kv, T] fp32 (or broadcasting to it), RePo layers only


def heads(block: OLMoBlock, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The first half of `OLMoBlock.attention`: q/k norms, then [B, T, C] -> [B, heads, T, head_dim]."""
    B, T, C = q.size()
    head_dim, n_kv = C // block.config.n_heads, block.config.effective_n_kv_heads
    if block.q_norm is not None and block.k_norm is not None:
        q, k = block.q_norm(q).to(k.dtype), block.k_norm(k).to(k.dtype)
    q = q.view(B, T, block.config.n_heads, head_dim).transpose(1, 2)  # [B, H, T, hd]
    k = k.view(B, T, n_kv, head_dim).transpose(1, 2)  # [B, H_kv, T, hd]
    v = v.view(B, T, n_kv, head_dim).transpose(1, 2)
    return q, k, v


def attend(
    block: OLMoBlock,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    layer_past: KVCache | None,
    use_cache: bool,
    max_doc_len: int | None,
    cu_doc_lens: Tensor | None,
) -> tuple[Tensor, KVCache | None]:
    """The second half of `OLMoBlock.attention` for keys that are already rotated: they are cached as they
    are (stock rotates after caching). q, k, v [B, heads, T, hd] -> output [B, T, d_model] and the cache."""
    B, _, T, _ = q.shape
    dtype = k.dtype
    if layer_past is not None:
        k = torch.cat((layer_past[0], k), dim=-2)
        v = torch.cat((layer_past[1], v), dim=-2)
    present = (k, v) if use_cache else None
    if bias is not None:
        query_len, key_len = q.shape[-2], k.shape[-2]
        bias = block._cast_attn_bias(bias[:, :, key_len - query_len : key_len, :key_len], dtype)
    att = block._scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=bias,
        dropout_p=0.0 if not block.training else block.config.attention_dropout,
        is_causal=bias is None,
        max_doc_len=max_doc_len,
        cu_doc_lens=cu_doc_lens,
    )
    att = att.transpose(1, 2).contiguous().view(B, T, -1)  # [B, T, d_model]
    return block.attn_out(att), present


def make_state_dict_compatible(model: OLMo, state_dict: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's model state dict with OLMo's own key renames (older layouts, wrapper prefixes)."""
    return model._make_state_dict_compatible(state_dict)[0]


def fused_loss_available() -> bool:
    """Whether OLMo's Trainer can use `fused_loss=true` (it needs flash-attn's cross-entropy)."""
    return olmo.train.fused_loss_fn is not None


def scheduled_lr(trainer: Trainer) -> float:
    """The learning rate `Trainer.train_step` gives every param group at this step (and
    `load_trainer_state_dict` on restore): the scheduler's, at `scheduler_current` of `scheduler_max`."""
    cfg = trainer.cfg
    return trainer.scheduler.get_lr(
        cfg.optimizer.learning_rate, trainer.scheduler_current, trainer.scheduler_max
    )


def split_param_group(
    optim: torch.optim.Optimizer, select: Callable[[str], bool], settings: dict[str, Any]
) -> list[dict[str, Any]]:
    """Move the parameters whose names `select` accepts into param groups of their own with `settings`: one
    per group of `get_param_groups` that holds any (with its other fields), or that group itself where it
    holds nothing else. Before the first step (no optimizer state yet). Returns the groups."""
    assert not optim.state, "param groups are split before the first step"
    groups = []
    for group in list(optim.param_groups):
        picked = [select(name) for name in group["param_names"]]
        if not any(picked):
            continue
        if all(picked):
            group.update(settings)
            groups.append(group)
            continue
        moved: dict[str, Any] = {k: v for k, v in group.items() if k not in ("params", "param_names")}
        for key in ("params", "param_names"):
            moved[key] = [x for x, pick in zip(group[key], picked) if pick]
            group[key] = [x for x, pick in zip(group[key], picked) if not pick]
        optim.add_param_group({**moved, **settings})
        groups.append(optim.param_groups[-1])
    return groups


def hold_group_settings(
    optim: torch.optim.Optimizer, settings: Callable[[dict[str, Any]], dict[str, Any] | None]
) -> RemovableHandle:
    """Before every `optim.step()` (after `Trainer.train_step` has set every group's lr to one value), update
    each group by `settings(group)` (None: leave it). Idempotent: torch may run the hook twice for one step (a
    patched subclass `step` calling its patched parent's)."""

    def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            if (update := settings(group)) is not None:
                group.update(update)

    return optim.register_step_pre_hook(hook)
