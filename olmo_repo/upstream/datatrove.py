"""datatrove 0.10.1 (its own environment, .venv-data): the tokenizer stage of `olmo_repo.data`, as a subclass of
datatrove's `DocumentTokenizer` with three things upstream does not offer as arguments.

- **uint32 always.** Upstream picks the token width from the vocabulary (`token_size`: 2 bytes up to 65,536
  tokens, else 4); the trainers read one dtype for every source of a run, so the width is 4 whatever the model.
- **The model's end id after each document.** Upstream takes the end token as text (`eos_token`) and looks its id
  up; a model states an id (its config.json's `eos_token_id`), so the stage sets the post-processor that appends
  that id and nothing else: a tokenizer's own
  template (Llama 3's begin-of-text) is replaced, as datatrove replaces it for `eos_token`, so the ids are
  `encode(text, add_special_tokens=False) + [eos]`, what `scripts/tokenize_text.py` writes.
- **No truncation or padding.** A tokenizer.json may carry either (a model's maximum length); a document longer than
  the training window is kept whole and split into windows by the trainer's dataset, never cut.

The file names upstream gives a task's shards (`get_output_filename`) are what `olmo_repo.data.prepare` renames.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from datatrove.pipeline.tokens.tokenizer import DocumentTokenizer
from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing

__all__ = ["CANARIES", "VERSION", "ModelTokenizer", "shard_name"]

VERSION = "0.10.1"
CANARIES = {  # what the subclass relies on: the width and tokenizer properties, where the stage writes, the names
    "datatrove.utils.tokenization.PipelineStepWithTokenizer": "8188dde0f830cfad",
    "datatrove.pipeline.tokens.tokenizer.DocumentTokenizer.run": "eaf00cf59ec90fc2",
    "datatrove.pipeline.tokens.tokenizer.DocumentTokenizer.write_unshuffled": "590fed1eb467d46b",
    "datatrove.pipeline.tokens.tokenizer.TokenizedFile.copy": "0d2380414893903e",
    "datatrove.pipeline.tokens.tokenizer.get_output_filename": "40c289e88400322b",
}


def shard_name(rank: int, sub_rank: int) -> str:
    """The name datatrove gives the `sub_rank`-th shard of task `rank` (documents shuffled within the task, split
    at `max_tokens_per_file`): `get_output_filename(None, rank, "doc_shuffled", sub_rank)`."""
    from datatrove.pipeline.tokens.tokenizer import get_output_filename

    return get_output_filename(None, rank, "doc_shuffled", sub_rank)


class ModelTokenizer(DocumentTokenizer):
    """datatrove's tokenizer stage with a model's tokenizer.json and end id, uint32 ids, nothing truncated."""

    token_size = 4  # bytes per id: uint32 for every vocabulary (upstream: 2 below 65,537 tokens)

    def __init__(self, *args: Any, eos_token_id: int, **kwargs: Any) -> None:
        super().__init__(*args, eos_token=None, **kwargs)
        self.eos_token_id = eos_token_id

    @cached_property
    def tokenizer(self) -> Tokenizer:
        from datatrove.utils.tokenization import load_tokenizer

        tokenizer = load_tokenizer(self.tokenizer_name_or_path)
        tokenizer.no_truncation()
        tokenizer.no_padding()
        tokenizer.post_processor = TemplateProcessing(  # "<EOS>" names the id in the template only
            single="$A <EOS>", pair=None, special_tokens=[("<EOS>", self.eos_token_id)]
        )
        return tokenizer
