"""Tokenised SFT examples in ArrayRecord files: chat rows converted once, then read by index.

A chat-messages source (`chat=`) is read, converted and tokenised whole at
the start of every run, on every host: seconds at CPU scale, but hours and
tens of GB of host memory for the public SFT set. `convert_chat_rows` does
it once: one ArrayRecord record an example (its `inputs`, `targets` and
`mask` as little-endian int32 rows), and a source `array_record=PATH` reads
it through Grain's `ArrayRecordDataSource`, by index, so shuffling, mixing
by weight, packing and the iterator state saved with each checkpoint work
as for any source, with only what the batches need in memory.

Beside `PATH` the conversion writes `PATH.json`: the format, the
tokenizer's fingerprint, `seq_len` and `loss_on` it was made with, and per
input file the rows read, skipped (malformed, too long, empty) and the
examples and tokens written. A run refuses a file made with another
tokenizer or another `loss_on`, or with a longer `seq_len` than its own,
naming both values.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence

import numpy as np

from cascade_jax.data import _chat
from cascade_jax.data import _chat_rows

FORMAT = 'cascade_jax.sft_examples.v1'
_FIELDS = ('inputs', 'targets', 'mask')


def fingerprint(tok) -> str:
  """A hash of what decides a tokenizer's ids: the sentencepiece model, or a
  Hugging Face tokenizer's tokenizer.json and tokenizer_config.json (its
  special tokens and chat template)."""
  h = hashlib.sha256()
  if hasattr(tok, 'proto'):
    h.update(b'sentencepiece\0' + tok.proto)
  else:
    for name in ('tokenizer.json', 'tokenizer_config.json'):
      path = os.path.join(tok.directory, name)
      if os.path.exists(path):
        with open(path, 'rb') as f:
          h.update(name.encode() + b'\0' + f.read())
  return h.hexdigest()[:16]


def encode(ex: dict) -> bytes:
  return np.stack([np.asarray(ex[k], np.int32) for k in _FIELDS]).astype(
      '<i4').tobytes()


def decode(blob: bytes) -> dict:
  rows = np.frombuffer(blob, '<i4').reshape(len(_FIELDS), -1)
  return {k: rows[i].astype(np.int32) for i, k in enumerate(_FIELDS)}


def meta_path(path: str) -> str:
  return path + '.json'


def convert_chat_rows(tok, files: Sequence[str], out: str, *, seq_len: int,
                      loss_on: str = 'assistant', too_long: str = 'skip',
                      empty: str = 'skip', on_error: str = 'raise',
                      log_every: int = 10000) -> dict:
  """Writes the examples of chat-messages `files` (JSONL or Parquet, read
  row by row) to ArrayRecord `out`, tokenised with `tok`'s chat template;
  returns (and writes to `out`.json) its description. Rows skipped under
  `too_long` / `empty` / `on_error` = 'skip' are counted per file."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  if not files:
    raise ValueError('convert_chat_rows: no input files')
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  tmp = out + '.tmp'
  writer = array_record_module.ArrayRecordWriter(tmp, 'group_size:1')
  per_file, t0, total = [], time.perf_counter(), 0
  try:
    for path in files:
      rep = dict(file=os.path.abspath(path), rows=0, malformed=0,
                 too_long=0, empty=0, examples=0, tokens=0)
      bad: list = []
      for rec in _chat_rows.iter_chat_rows(path, on_error=on_error,
                                           skipped=bad):
        rep['rows'] += 1
        ex = _chat.encode_record(tok, rec, loss_on=loss_on)
        why = ('empty' if ex is None else
               'too_long' if len(ex['inputs']) > seq_len else '')
        if why:
          if (too_long if why == 'too_long' else empty) != 'skip':
            raise ValueError(
                f"{path}: record {rec['id']} is "
                + ('empty' if why == 'empty' else
                   f"{len(ex['inputs'])} tokens, over seq_len={seq_len}")
                + f" (pass {why}='skip' to skip such records)")
          rep[why] += 1
          continue
        writer.write(encode(ex))
        rep['examples'] += 1
        rep['tokens'] += len(ex['inputs'])
        total += 1
        if log_every and total % log_every == 0:
          print(f'[array_record] {total} examples '
                f'({time.perf_counter() - t0:.0f} s)', flush=True)
      rep['malformed'] = len(bad)
      rep['rows'] += len(bad)
      per_file.append(rep)
  finally:
    writer.close()
  if not total:
    os.remove(tmp)
    raise ValueError(f'convert_chat_rows: no usable examples in {list(files)}')
  os.replace(tmp, out)
  meta = dict(format=FORMAT, tokenizer=fingerprint(tok), seq_len=seq_len,
              loss_on=loss_on, examples=total,
              tokens=sum(r['tokens'] for r in per_file), files=per_file,
              seconds=round(time.perf_counter() - t0, 1))
  with open(meta_path(out) + '.tmp', 'w') as f:
    json.dump(meta, f, indent=1)
  os.replace(meta_path(out) + '.tmp', meta_path(out))
  return meta


def open_examples(tok, name: str, path: str, *, seq_len: int, loss_on: str):
  """(a Grain MapDataset of `path`'s examples, its description), after
  checking it was made for this tokenizer, loss_on and a seq_len that fits."""
  import grain  # pylint: disable=g-import-not-at-top
  if not os.path.isfile(path):
    raise FileNotFoundError(f'data source {name!r}: {path} does not exist')
  try:
    with open(meta_path(path)) as f:
      meta = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f'data source {name!r}: {meta_path(path)} (written by '
                     'the conversion beside its file) is missing or not '
                     f'JSON ({e}); convert again with experiments.'
                     'convert_data') from None
  want = dict(format=FORMAT, tokenizer=fingerprint(tok), loss_on=loss_on)
  for key, value in want.items():
    if meta.get(key) != value:
      raise ValueError(
          f'data source {name!r}: {path} was made with {key} '
          f'{meta.get(key)!r}, this run has {value!r}; convert it again '
          'with this run\'s tokenizer (experiments.convert_data --run=...)')
  if meta['seq_len'] > seq_len:
    raise ValueError(
        f'data source {name!r}: {path} holds examples up to seq_len '
        f"{meta['seq_len']} tokens, longer than this run's data.seq_len="
        f'{seq_len}; raise data.seq_len or convert with --seq_len={seq_len}')
  ds = grain.MapDataset.source(
      grain.sources.ArrayRecordDataSource(path)).map(decode)
  if len(ds) != meta['examples']:
    raise ValueError(f'data source {name!r}: {path} holds {len(ds)} records, '
                     f"its description says {meta['examples']}")
  return ds, meta
