"""A model loaded once for the explorer: the positions its RePo layers assign to a prompt, and their analysis."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..eval.loading import position_overrides, read_config
from ..eval.positions import model_positions, position_patterns, position_spans
from ..integrity import ModelOpener, hf_dir_as_is
from ..modes import PositionSource, layer_modes, repo_layer_ids
from ..positions import spread

__all__ = ["CHUNK", "EPS", "MAX_PROMPT_CHARS", "BadRequest", "ExplorerModel"]

MAX_PROMPT_CHARS = 100_000  # longer prompts are refused; prompts over max_tokens tokens are truncated
CHUNK, EPS = 16, 0.2  # the paper's chunk analysis (olmo_repo.eval.positions)


class BadRequest(ValueError):
    """A request that cannot be answered; the message is one line for the client (HTTP 400)."""


class ExplorerModel:
    """MODEL (an HF directory of OLMo 2/3, Llama or Qwen 3, stock or RePo, opened by `open_model`:
    `scripts/explore.py` passes `olmo_repo.checkpoint.as_hf_dir`, which takes an ai2-olmo checkpoint too), loaded
    once without its LM head; `positions` runs one request at a time.

    Positions come from `output_positions=True` of the HF model ({layer: [B, H_kv, T]}, fp32 as computed);
    `positions` replaces them at load as the evaluation does (`olmo_repo.eval.loading.position_overrides`: the
    token index, or one constant position), and the explorer then shows what the RePo layers rotate by instead.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "cpu",
        max_tokens: int = 512,
        open_model: ModelOpener = hf_dir_as_is,
        positions: str = PositionSource.learned,
    ):
        with open_model(str(path)) as hf_dir:
            config = read_config(hf_dir)  # every family evaluation takes; the reference's format too
            config.update(position_overrides(config, positions, f"{path}/config.json"))
            self.tokenizer = AutoTokenizer.from_pretrained(hf_dir)
            causal_lm = AutoModelForCausalLM.from_pretrained(hf_dir, config=config)
        # Only the decoder is kept: positions need no logits (and a 100k-vocabulary head is large).
        self.model = causal_lm.model.to(device).eval()
        self.name = str(path)
        self.device = device
        self.max_tokens = max_tokens
        # One position per key/value head (grouped-query attention: shared by its query heads).
        self.n_heads: int = config.num_key_value_heads
        self.n_query_heads: int = config.num_attention_heads
        self.layer_modes: list[str] = layer_modes(config)
        self.repo_layers = repo_layer_ids(config)
        self.position_source = str(positions)
        self._lock = threading.Lock()

    def info(self) -> dict[str, Any]:
        """What the page needs to know about the model."""
        return dict(
            name=self.name,
            layer_modes=self.layer_modes,
            repo_layers=self.repo_layers,
            n_heads=self.n_heads,
            n_query_heads=self.n_query_heads,
            max_tokens=self.max_tokens,
            positions=self.position_source,
        )

    def tokens(self, prompt: str, max_tokens: int | None = None) -> dict[str, Any]:
        """The prompt's tokens (the first `max_tokens`): {tokens, token_ids, prompt_tokens, truncated}."""
        limit = self.max_tokens if max_tokens is None else max_tokens
        if not 1 <= limit <= self.max_tokens:
            raise BadRequest(f"max_tokens={limit} is out of range: allowed 1..{self.max_tokens}")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise BadRequest(f"prompt has {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
        ids = self.tokenizer(prompt)["input_ids"]
        if not prompt or not ids:
            raise BadRequest("prompt is empty")
        return dict(
            tokens=[self.tokenizer.decode([i]) for i in ids[:limit]],
            token_ids=ids[:limit],
            prompt_tokens=len(ids),
            truncated=len(ids) > limit,
        )

    def positions(
        self, prompt: str, layer: int | None = None, head: int | None = None, max_tokens: int | None = None
    ) -> dict[str, Any]:
        """Positions of the RePo layers (or `layer`) and heads (or `head`) for the prompt's tokens.

        Returns the `tokens` fields plus layers, heads, positions [layers][heads][tokens] (fp32 values),
        spans [layers][heads], patterns [layers] ({"heads": [shares per head], "all": shares of the layer's
        chunks}, shares: {constant, monotonic, hybrid}), with chunk and eps, and spread [layers] (`positions.spread`
        of the heads': {min, max, std, p05, p95, rank_corr}, as the trainers log them). Raises `BadRequest`.
        """
        if not self.repo_layers:
            raise BadRequest(f"{self.name} has no RePo layer (layer modes: {', '.join(self.layer_modes)})")
        if layer is not None and layer not in self.repo_layers:
            raise BadRequest(
                f"layer {layer} is not a RePo layer of {self.name}; its RePo layers: "
                + ", ".join(map(str, self.repo_layers))
            )
        if head is not None and not 0 <= head < self.n_heads:
            raise BadRequest(f"head {head} is out of range: {self.name} has heads 0..{self.n_heads - 1}")
        out = self.tokens(prompt, max_tokens)
        layers = self.repo_layers if layer is None else [layer]
        heads = list(range(self.n_heads)) if head is None else [head]
        ids = torch.tensor([out["token_ids"]], device=self.device)  # [1, T]
        with self._lock, torch.inference_mode():
            computed = model_positions(self.model, ids)  # {layer: [1, H, T]}
        z = torch.stack([computed[i][0, heads] for i in layers]).cpu()  # [L, heads, T]
        return dict(
            out,
            layers=layers,
            heads=heads,
            positions=z.tolist(),
            spans=position_spans(z).tolist(),  # [L, heads]
            patterns=[
                {
                    "heads": [position_patterns(zh, CHUNK, EPS) for zh in zl],
                    "all": position_patterns(zl, CHUNK, EPS),
                }
                for zl in z
            ],
            chunk=CHUNK,
            eps=EPS,
            spread=[spread(zl) for zl in z],
        )
