"""Decode over a long KV cache: reading the written blocks only against reading the whole cache.

  python -m benchmarks.decode_cache --out=docs/results/decode_cache_<date>

The main job's model (`small`, vocab 1024, *E*E) generates after a
`prompt_len`-token prompt until its cache of `caches` slots is full (the
RL recipe sizes the cache for the longest response: 2k + 8k slots), batch
8, temperature 1, no stop, with cache attention forced to `xla` (every
step reads every slot) and to `xla_written` (every step reads the blocks
written so far), interleaved over rounds. Prints tokens/s (medians) and
the ratio; writes results.json with the run's provenance.
"""

import json
import os
import statistics
import time

import jax
import numpy as np
from absl import app
from absl import flags

from cascade_jax import ops
from cascade_jax import rollout
from cascade_jax import utils

_OUT = flags.DEFINE_string('out', '', 'Writes results.json here if set.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Interleaved rounds.')
_CACHES = flags.DEFINE_list('caches', ['2048', '4096', '8192'],
                            'Cache slots: prompt + new tokens.')
_BATCH = flags.DEFINE_integer('batch', 8, 'Rows.')
_PROMPT = flags.DEFINE_integer('prompt_len', 512, 'Prompt tokens a row.')


def main(argv):
  del argv
  model = rollout.main_job_model()
  rng = np.random.RandomState(0)
  prompts = rng.randint(2, model.cfg.vocab_size,
                        (_BATCH.value, _PROMPT.value)).tolist()
  impls = ('xla', 'xla_written')
  tok_s = {(i, int(c)): [] for i in impls for c in _CACHES.value}
  for r in range(_ROUNDS.value):
    for c in map(int, _CACHES.value):
      # Every row generates its whole budget (no stop id) into a cache of
      # c slots (the sampler's: prompt + max_new_tokens): a step reads all
      # c slots whole, or the blocks written so far (about half on average).
      cfg = rollout.SampleConfig(max_new_tokens=c - _PROMPT.value,
                                 temperature=1.0,
                                 prompt_bucket=_PROMPT.value)
      for impl in impls:
        jax.clear_caches()    # each implementation traced afresh
        with ops.forced(cache_attention=impl, argmax='xla', moe_decode='xla'):
          fn = lambda: jax.block_until_ready(rollout.generate(  # pylint: disable=cell-var-from-loop
              model, prompts, cfg=cfg, stop_ids=(),  # pylint: disable=cell-var-from-loop
              key=jax.random.key(r)).tokens)
          fn()                                  # compile
          t0 = time.perf_counter()
          fn()
          dt = time.perf_counter() - t0
        tok_s[(impl, c)].append(_BATCH.value * cfg.max_new_tokens / dt)
      print(f'[bench_decode_cache] round {r + 1}/{_ROUNDS.value} cache {c}: '
            + ', '.join(f'{i} {tok_s[(i, c)][-1]:,.0f}' for i in impls)
            + ' tok/s', flush=True)
  rows = []
  for c in map(int, _CACHES.value):
    med = {i: statistics.median(tok_s[(i, c)]) for i in impls}
    rows.append(dict(cache=c, new_tokens=c - _PROMPT.value,
                     whole_tok_s=round(med['xla'], 1),
                     written_tok_s=round(med['xla_written'], 1),
                     ratio=round(med['xla_written'] / med['xla'], 3)))
  print(f"\n{'cache':>6} {'new':>6} {'whole tok/s':>12} {'written tok/s':>14}"
        f" {'ratio':>6}")
  for row in rows:
    print(f"{row['cache']:>6} {row['new_tokens']:>6} "
          f"{row['whole_tok_s']:>12,.0f} {row['written_tok_s']:>14,.0f} "
          f"{row['ratio']:>6.2f}")
  if _OUT.value:
    os.makedirs(_OUT.value, exist_ok=True)
    with open(os.path.join(_OUT.value, 'results.json'), 'w') as f:
      json.dump(dict(rows=rows, tok_s={f'{i}@{c}': v
                                       for (i, c), v in tok_s.items()},
                     batch=_BATCH.value, prompt_len=_PROMPT.value,
                     rounds=_ROUNDS.value, **utils.provenance()), f, indent=1)


if __name__ == '__main__':
  app.run(main)
