"""Continuous batching against a fixed batch: the same samples, tokens per second.

  python -m benchmarks.continuous --out=docs/results/continuous_<date>

The main job's model (`small`, vocab 1024, *E*E) answers `prompts` prompts
of 8-32 tokens at temperature 1 with a budget of `new_tokens`. Responses end
at any of the ids 1..`stop_tokens` (at this random initialisation about
`stop_tokens / 1024` a step), so lengths spread like a sampled RL batch's:
most rows end early, a few run to the budget. Both ways draw with a key a
prompt, so they produce the same tokens up to float rounding (rows whose
samples differ are counted, with the log-prob gap before they part):
- `fixed`: `rollout.generate` over `batch` prompts at a time; every batch
  decodes until its longest row ends;
- `continuous`: `rollout.generate_continuous` with `batch` slots, a row
  refilled from the waiting prompts when it ends.
Interleaved over rounds (medians); prints tokens/s, decode steps and the
live fraction of the rows a step computes; writes results.json with the
run's provenance.
"""

import json
import os
import statistics
import time

import jax
import numpy as np
from absl import app
from absl import flags

from cascade_jax import rollout
from cascade_jax import utils

_OUT = flags.DEFINE_string('out', '', 'Writes results.json here if set.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Interleaved rounds.')
_BATCHES = flags.DEFINE_list('batches', ['16', '64'], 'Rows decoded together.')
_PROMPTS = flags.DEFINE_integer('prompts', 256, 'Prompts answered.')
_NEW = flags.DEFINE_integer('new_tokens', 128, 'Response budget.')
_STOPS = flags.DEFINE_integer('stop_tokens', 24, 'Responses end at ids 1..this.')


def _fixed(model, prompts, keys, cfg, stops, b):
  outs = [rollout.generate(model, prompts[i:i + b], cfg=cfg, stop_ids=stops,
                           key=keys[i:i + b])
          for i in range(0, len(prompts), b)]
  steps = sum(int(o.mask.sum(1).max()) for o in outs)
  return outs, steps


def _agreement(fixed, out):
  """Rows whose tokens differ, and the largest log-prob gap before any row's
  first difference (a sample flips where two tokens' Gumbel scores tie to
  float rounding: the two ways batch the prefill's matmuls differently)."""
  toks = np.concatenate([np.asarray(o.tokens * o.mask) for o in fixed])
  lps = np.concatenate([np.asarray(o.logprobs) for o in fixed])
  differ = np.any(toks != np.asarray(out.tokens * out.mask), axis=1)
  first = np.where(differ, np.argmax(toks != np.asarray(out.tokens * out.mask),
                                     axis=1), toks.shape[1])
  before = np.arange(toks.shape[1])[None, :] < first[:, None]
  gap = np.abs(lps - np.asarray(out.logprobs)) * before
  return int(differ.sum()), float(gap.max())


def main(argv):
  del argv
  model = rollout.main_job_model()
  rng = np.random.RandomState(0)
  n = _PROMPTS.value
  prompts = [rng.randint(_STOPS.value + 1, model.cfg.vocab_size,
                         rng.randint(8, 33)).tolist() for _ in range(n)]
  cfg = rollout.SampleConfig(max_new_tokens=_NEW.value, temperature=1.0,
                             prompt_bucket=32)
  stops = tuple(range(1, _STOPS.value + 1))
  keys = jax.random.split(jax.random.key(0), n)
  res = {}
  for r in range(_ROUNDS.value):
    for b in map(int, _BATCHES.value):
      if n % b:
        raise ValueError(f'--prompts={n} is not a multiple of batch {b}')
      # The first round compiles (and checks the two ways agree).
      t0 = time.perf_counter()
      fixed, steps = _fixed(model, prompts, keys, cfg, stops, b)
      t_fixed = time.perf_counter() - t0
      st = {}
      t0 = time.perf_counter()
      out = rollout.generate_continuous(model, prompts, cfg=cfg,
                                        stop_ids=stops, slots=b, keys=keys,
                                        stats=st)
      jax.block_until_ready(out.tokens)
      t_cont = time.perf_counter() - t0
      if r == 0:
        differ, gap = _agreement(fixed, out)
        lengths = np.asarray(out.mask.sum(1))
        res[b] = dict(fixed_s=[], continuous_s=[], tokens=int(lengths.sum()),
                      rows_differing=differ, logprob_gap=gap,
                      fixed_steps=steps, continuous_steps=st['steps'],
                      refills=st['refills'],
                      length_mean=float(lengths.mean()),
                      length_p90=float(np.percentile(lengths, 90)),
                      length_max=int(lengths.max()))
        print(f'batch {b}: compiled; lengths mean {lengths.mean():.1f}, '
              f'p90 {np.percentile(lengths, 90):.0f}, max {lengths.max()}; '
              f'{differ} of {n} rows differ from the fixed batch (log-probs '
              f'within {gap:.1e} before)', flush=True)
        continue
      res[b]['fixed_s'].append(t_fixed)
      res[b]['continuous_s'].append(t_cont)
      print(f'round {r} batch {b}: fixed {t_fixed:.2f} s, continuous '
            f'{t_cont:.2f} s', flush=True)
  rows = []
  for b, x in res.items():
    f, c = statistics.median(x['fixed_s']), statistics.median(x['continuous_s'])
    x.update(fixed_tok_s=x['tokens'] / f, continuous_tok_s=x['tokens'] / c,
             ratio=f / c,
             fixed_live=x['tokens'] / (x['fixed_steps'] * b),
             continuous_live=x['tokens'] / (x['continuous_steps'] * b))
    rows.append([b, x['tokens'], round(x['fixed_tok_s']),
                 round(x['continuous_tok_s']), round(x['ratio'], 2),
                 x['fixed_steps'], x['continuous_steps'],
                 round(x['fixed_live'], 2), round(x['continuous_live'], 2)])
  print(utils.format_table(
      ['batch', 'tokens', 'fixed tok/s', 'continuous tok/s', 'ratio',
       'fixed steps', 'cont. steps', 'fixed live', 'cont. live'], rows))
  if _OUT.value:
    os.makedirs(_OUT.value, exist_ok=True)
    with open(os.path.join(_OUT.value, 'results.json'), 'w') as fh:
      json.dump(dict(provenance=utils.provenance(),
                     flags=dict(rounds=_ROUNDS.value, batches=_BATCHES.value,
                                prompts=n, new_tokens=_NEW.value,
                                stop_tokens=_STOPS.value),
                     results={str(k): v for k, v in res.items()}), fh,
                indent=2)


if __name__ == '__main__':
  app.run(main)
