"""The CPU kernels' choice on the sampler: 'auto' against every kernel on and every kernel off.

  python -m benchmarks.cpu_kernels --out=docs/results/cpu_kernels_<date>

Generates with the main job's model (`small`, vocab 1024, *E*E) as its RL
stages do (128-token prompts, 48 new tokens, temperature 1, no stop) at
decode batch 64 and 8, in one process, the three settings interleaved over
rounds so that drift in the machine's speed hits all of them: `none` (XLA's
ops alone, CASCADE_JAX_CPU_KERNELS=0), `all` (every kernel, =1) and `auto`
(the calibration's choice on this machine, the default). Prints a table of
tokens/s (the median over rounds) and writes results.json with the
calibration it used and the run's provenance.
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
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Interleaved rounds.')
_BATCHES = flags.DEFINE_list('batches', ['64', '8'], 'Decode batch sizes.')
_NEW = flags.DEFINE_integer('new_tokens', 48, 'Tokens generated a row.')
_PROMPT = flags.DEFINE_integer('prompt_len', 128, 'Prompt tokens a row.')


def _setting(name: str, auto: dict) -> dict[str, str]:
  """The forced implementation of each kernel op for a setting."""
  on = {'none': set(), 'all': set(ops.CPU_KERNEL_OPS),
        'auto': {op for op in ops.CPU_KERNEL_OPS if auto[op]['use']}}[name]
  return {op: 'cpu_kernel' if op in on else 'xla' for op in ops.CPU_KERNEL_OPS}


def main(argv):
  del argv
  if jax.default_backend() != 'cpu':
    raise SystemExit('bench_cpu_kernels: the CPU kernels run on the CPU only')
  auto = ops.cpu_kernel_calibration()          # measured now if not cached
  model = rollout.main_job_model()
  rng = np.random.RandomState(0)
  settings = ('none', 'all', 'auto')
  tok_s = {(s, int(b)): [] for s in settings for b in _BATCHES.value}
  for r in range(_ROUNDS.value):
    for b in map(int, _BATCHES.value):
      prompts = rng.randint(2, model.cfg.vocab_size,
                            (b, _PROMPT.value)).tolist()
      cfg = rollout.SampleConfig(max_new_tokens=_NEW.value, temperature=1.0,
                                 prompt_bucket=_PROMPT.value)
      for s in settings:
        # Each setting is traced afresh: a compiled sampler keeps the
        # implementations it was traced with.
        jax.clear_caches()
        with ops.forced(**_setting(s, auto)):
          run = lambda: jax.block_until_ready(rollout.generate(  # pylint: disable=cell-var-from-loop
              model, prompts, cfg=cfg, stop_ids=(),  # pylint: disable=cell-var-from-loop
              key=jax.random.key(r)).tokens)
          run()                                 # compile
          t0 = time.perf_counter()
          run()
          tok_s[(s, b)].append(b * _NEW.value / (time.perf_counter() - t0))
      print(f'[bench_cpu_kernels] round {r + 1}/{_ROUNDS.value} batch {b}: '
            + ', '.join(f'{s} {tok_s[(s, b)][-1]:,.0f}' for s in settings)
            + ' tok/s', flush=True)
  rows = []
  for b in map(int, _BATCHES.value):
    med = {s: statistics.median(tok_s[(s, b)]) for s in settings}
    rows.append(dict(batch=b, **{f'{s}_tok_s': round(med[s], 1)
                                 for s in settings},
                     auto_vs_none=round(med['auto'] / med['none'], 3),
                     auto_vs_all=round(med['auto'] / med['all'], 3)))
  chosen = [op for op in ops.CPU_KERNEL_OPS if auto[op]['use']] or ['none']
  print(f"\nauto on this machine: {', '.join(chosen)}")
  print(f"{'batch':>5} {'none tok/s':>11} {'all tok/s':>10} {'auto tok/s':>11}"
        f" {'auto/none':>9} {'auto/all':>8}")
  for row in rows:
    print(f"{row['batch']:>5} {row['none_tok_s']:>11,.0f} "
          f"{row['all_tok_s']:>10,.0f} {row['auto_tok_s']:>11,.0f} "
          f"{row['auto_vs_none']:>9.3f} {row['auto_vs_all']:>8.3f}")
  if _OUT.value:
    os.makedirs(_OUT.value, exist_ok=True)
    with open(os.path.join(_OUT.value, 'results.json'), 'w') as f:
      json.dump(dict(rows=rows, tok_s={f'{s}@{b}': v
                                       for (s, b), v in tok_s.items()},
                     calibration=auto, prompt_len=_PROMPT.value,
                     new_tokens=_NEW.value, rounds=_ROUNDS.value,
                     **utils.provenance()), f, indent=1)


if __name__ == '__main__':
  app.run(main)
