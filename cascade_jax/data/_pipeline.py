"""SFT data: sources (generated domains, user JSONL) mixed by weight, tokenised, packed with Grain.

Sources are a mapping name -> spec, e.g.

  math=dict(weight=2.0, n=4000, levels=(1, 2, 3))        # generated domain
  mine=dict(weight=1.0, jsonl='/data/math.jsonl')         # user records
  sft=dict(weight=3.0, chat='/data/sft/math.parquet')     # chat-messages rows
  big=dict(weight=3.0, array_record='/data/sft.array_record')  # converted

A generated source is named after its domain (or gives `domain=`). Each
source is tokenised with the chat template, shuffled, repeated and mixed by
weight (a converted source, `_array_record`, is tokenised already and read
by index from its file); Grain packs the stream into fixed-length rows with segment ids and
per-segment positions, so attention never crosses examples. The pipeline is
deterministic given its seed, and its iterator state (a small dict) is
saved with each checkpoint so a resumed run neither replays nor skips data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import grain
import grain.experimental as grain_exp
import numpy as np

from cascade_jax import domains
from cascade_jax.data import _array_record
from cascade_jax.data._chat import encode_record
from cascade_jax.data._chat_rows import load_chat_rows
from cascade_jax.data._tokenizer import Tokenizer

_FIELDS = ('inputs', 'targets', 'mask')
_SOURCE_KEYS = {'weight', 'n', 'levels', 'domain', 'jsonl', 'chat',
                'array_record', 'on_error', 'options'}


@dataclasses.dataclass
class SourceReport:
  name: str
  examples: int
  skipped_too_long: int = 0
  skipped_empty: int = 0
  skipped_rows: int = 0       # malformed JSONL rows (on_error='skip')
  tokens: int = 0


def source_records(name: str, spec: Mapping, *, seed: int, split: str = 'train'):
  """Records of one source (generated or JSONL) and how many rows were skipped."""
  unknown = set(spec) - _SOURCE_KEYS
  if unknown:
    raise ValueError(f'data source {name!r}: unknown keys {sorted(unknown)}; '
                     f'known: {sorted(_SOURCE_KEYS)}')
  given = [k for k in ('jsonl', 'chat', 'array_record') if k in spec]
  if len(given) > 1:
    raise ValueError(f'data source {name!r}: one of jsonl= (records), chat= '
                     '(chat-messages rows) and array_record= (converted '
                     f'examples), not {given}')
  if 'array_record' in spec:
    raise ValueError(f'data source {name!r}: {spec["array_record"]} holds '
                     'tokenised examples, not records (a tokenizer cannot be '
                     'trained on it: set tokenizer.path or init_from)')
  if 'chat' in spec:   # the public SFT set's schema, JSONL or Parquet
    recs, skipped = load_chat_rows(spec['chat'],
                                   on_error=spec.get('on_error', 'raise'))
    return recs, len(skipped)
  if 'jsonl' in spec:
    recs, report = domains.load_jsonl(spec['jsonl'], domain=spec.get('domain'),
                                      on_error=spec.get('on_error', 'raise'))
    return recs, len(report.skipped)
  domain = spec.get('domain', name)
  recs = domains.generate(domain, split=split, n=int(spec.get('n', 1000)),
                          seed=seed, levels=tuple(spec.get('levels', (1, 2, 3))),
                          **dict(spec.get('options', {})))
  return recs, 0


def tokenize_records(tok: Tokenizer, name: str, records, *, seq_len: int,
                     loss_on: str, too_long: str, empty: str):
  """Tokenised examples of one source, with a report of what was skipped.

  Nothing is truncated: an example longer than `seq_len` (or with an empty
  response) raises, or is skipped and counted if the config says 'skip'.
  """
  for what, policy in (('too_long', too_long), ('empty_response', empty)):
    if policy not in ('error', 'skip'):
      raise ValueError(f"data.{what} must be 'error' or 'skip', got {policy!r}")
  report = SourceReport(name, 0)
  out = []
  for rec in records:
    ex = encode_record(tok, rec, loss_on=loss_on)
    if ex is None:
      if empty == 'error':
        raise ValueError(f"data source {name!r}: record {rec['id']} has no "
                         "response (set data.empty_response='skip' to skip)")
      report.skipped_empty += 1
      continue
    if len(ex['inputs']) > seq_len:
      if too_long == 'error':
        raise ValueError(
            f"data source {name!r}: record {rec['id']} is "
            f"{len(ex['inputs'])} tokens, longer than data.seq_len={seq_len} "
            "(raise seq_len, or set data.too_long='skip')")
      report.skipped_too_long += 1
      continue
    report.tokens += len(ex['inputs'])
    out.append(ex)
  report.examples = len(out)
  if not out:
    raise ValueError(f'data source {name!r} has no usable examples')
  return out, report


def build_dataset(tok: Tokenizer, sources: Mapping[str, Mapping], *,
                  seq_len: int, batch_size: int, seed: int,
                  loss_on: str = 'assistant', too_long: str = 'error',
                  empty_response: str = 'error', num_packing_bins: int = 0):
  """The packed, batched training stream and a report per source.

  Batches hold `inputs`, `targets`, `mask` [B, L] and `segment_ids`,
  `positions` [B, L] (segment 0 = padding).
  """
  if not sources:
    raise ValueError('data.sources is empty')
  datasets, weights, reports = [], [], []
  for i, (name, spec) in enumerate(sorted(sources.items())):
    if 'array_record' in spec:
      unknown = set(spec) - {'array_record', 'weight'}
      if unknown:
        raise ValueError(f'data source {name!r}: {sorted(unknown)} do not '
                         'apply to a converted (array_record) source')
      src, meta = _array_record.open_examples(
          tok, name, spec['array_record'], seq_len=seq_len, loss_on=loss_on)
      f = meta['files']
      reports.append(SourceReport(
          name, meta['examples'], tokens=meta['tokens'],
          skipped_too_long=sum(r['too_long'] for r in f),
          skipped_empty=sum(r['empty'] for r in f),
          skipped_rows=sum(r['malformed'] for r in f)))
    else:
      recs, bad_rows = source_records(name, spec, seed=seed)
      exs, rep = tokenize_records(tok, name, recs, seq_len=seq_len,
                                  loss_on=loss_on, too_long=too_long,
                                  empty=empty_response)
      rep.skipped_rows = bad_rows
      reports.append(rep)
      src = grain.MapDataset.source(exs)
    datasets.append(src.shuffle(seed=seed + i).repeat(None))
    w = float(spec.get('weight', 1.0))
    if w <= 0:
      raise ValueError(f'data source {name!r}: weight must be > 0, got {w}')
    weights.append(w)
  mixed = grain.MapDataset.mix(datasets, weights=weights).to_iter_dataset()
  packed = grain_exp.FirstFitPackIterDataset(
      mixed, length_struct={k: seq_len for k in _FIELDS},
      num_packing_bins=num_packing_bins or max(batch_size, 8), seed=seed)
  ds = packed.map(_rename).batch(batch_size, drop_remainder=True)
  return ds, reports


def _rename(ex):
  return dict(inputs=ex['inputs'], targets=ex['targets'], mask=ex['mask'],
              segment_ids=ex['inputs_segment_ids'],
              positions=ex['inputs_positions'])


def packing_efficiency(batch) -> float:
  """Fraction of non-padding tokens in a packed batch."""
  return float(np.mean(np.asarray(batch['segment_ids']) > 0))
