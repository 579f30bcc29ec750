"""A run's data: corpora to token files and the folders both trainers read.

- `folder`: what a data folder of `scripts/prepare_data.py` is (`data.json`, its shards, the tokenizer it was made
  with, a mix's `mix.json`) and the checks both trainers run on one; standard library only.
- `prepare` (`scripts/prepare_data.py`): corpora (jsonl, parquet; local or S3) tokenised by datatrove on every core
  or N machines into such a folder, after `inputs` checked every record; `pipeline` holds the pipeline's own steps,
  `store` the folder's files through datatrove's I/O.
- `mix`: a mix of sources (the OLMo 2 stage-2 mix) as a folder per source and the fragment both trainers read.
- `tokens` (`scripts/tokenize_text.py`): text files to one token file with a model's tokenizer.
"""
