"""Where bench_rollout's decode step goes at one batch size: XLA:CPU's per-op trace.

  python docs/results/perf/rollout_xeon_2026-12-06/step_profile/profile_step.py --batch=64

bench_rollout's model and generation (benchmarks/configs/rollout.py: greedy,
32 prompt + 64 new tokens, one array a layer), the CPU kernels as the
calibration picks them. Times the generation as bench_rollout does (the
whole minus one new token, over 63 steps; interleaved medians), then
traces one generation (jax.profiler) and sums each of its compiled
program's ops over the trace; the HLO dump names what each op is (a
custom call's target, a fusion's dot shapes). The traced run is slower
than the timed ones (the tracer's own cost).
"""

import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

from absl import app
from absl import flags

_BATCH = flags.DEFINE_integer('batch', 64, 'Rows.')
_REPEATS = flags.DEFINE_integer('repeats', 7, 'Timed repeats (medians).')


def _describe(dump_dir: str) -> dict[str, str]:
  """op name -> what it is, from the optimized HLO of the generation."""
  files = [f for f in glob.glob(os.path.join(dump_dir, '*_generate*'))
           if f.endswith('after_optimizations.txt')]
  text = open(max(files, key=os.path.getsize)).read()
  comps, cur = {}, None
  for line in text.splitlines():
    m = re.match(r'^(?:ENTRY )?%?([\w.\-]+) .*\{$', line)
    if m:
      cur = m.group(1)
      comps[cur] = []
    elif cur:
      comps[cur].append(line)
  what = {}
  for lines in comps.values():
    for line in lines:
      m = re.match(r'\s*(?:ROOT )?%?([\w.\-]+) = (\(.*?\)|\S+) (\w[\w-]*)\(',
                   line)
      if not m:
        continue
      name, shape, op = m.groups()
      if op == 'custom-call':
        t = re.search(r'custom_call_target="([^"]+)"', line)
        what[name] = f'custom-call {t.group(1) if t else "?"} -> {shape}'
      elif op == 'fusion':
        called = re.search(r'calls=%?([\w.\-]+)', line)
        body = comps.get(called.group(1), []) if called else []
        dots = [re.search(r'= (\S+) dot\(', b) for b in body]
        dots = [d.group(1) for d in dots if d]
        what[name] = (f'fusion, dot -> {", ".join(dots)}' if dots else
                      f'fusion -> {shape}')
      else:
        what[name] = f'{op} -> {shape}'
  return what


def main(argv):
  del argv
  dump = tempfile.mkdtemp()
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             f' --xla_dump_to={dump} --xla_dump_hlo_as_text')
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.getcwd())
  from cascade_jax import model as model_lib  # pylint: disable=g-import-not-at-top
  from cascade_jax import rollout  # pylint: disable=g-import-not-at-top
  from cascade_jax import utils  # pylint: disable=g-import-not-at-top
  from configs import bench_rollout  # pylint: disable=g-import-not-at-top
  from experiments import bench_rollout as bench_rollout_lib  # pylint: disable=g-import-not-at-top
  c = bench_rollout.get_config()
  b = _BATCH.value
  cfg = bench_rollout_lib.model_config(c)
  m = model_lib.split_model(model_lib.Transformer(cfg, rngs=nnx.Rngs(0)))
  prompts = np.random.RandomState(0).randint(
      1, c.vocab_size, (b, c.prompt_len)).tolist()

  def run(n):
    sc = rollout.SampleConfig(max_new_tokens=n, temperature=0.0,
                              prompt_bucket=c.prompt_len)
    return np.asarray(rollout.generate(m, prompts, cfg=sc, stop_ids=-1).tokens)

  for n in (c.new_tokens, 1, c.new_tokens, 1):
    run(n)
  times = {c.new_tokens: [], 1: []}
  for _ in range(_REPEATS.value):
    for n in times:
      run(n)
      t0 = time.perf_counter()
      run(n)
      times[n].append(time.perf_counter() - t0)
  whole, fixed = (float(np.median(times[n])) for n in times)
  steps = c.new_tokens - 1
  step_ms = (whole - fixed) / steps * 1e3
  print(f'batch {b}: generation {whole * 1e3:.1f} ms, fixed (one new token) '
        f'{fixed * 1e3:.1f} ms, a decode step {step_ms:.3f} ms '
        f'({b * c.new_tokens / whole:,.0f} tok/s); jax {jax.__version__}')
  trace = tempfile.mkdtemp()
  with jax.profiler.trace(trace):
    run(c.new_tokens)
  f = glob.glob(f'{trace}/**/*.trace.json.gz', recursive=True)[0]
  agg = collections.defaultdict(lambda: [0.0, 0])
  for e in json.load(gzip.open(f))['traceEvents']:
    if e.get('ph') == 'X' and not e['name'].startswith(('$', 'Thunk', 'Pjit',
                                                         'Common', 'Slinky')):
      agg[e['name']][0] += e['dur']
      agg[e['name']][1] += 1
  what = _describe(dump)
  rows, per_step = [], 0.0
  for name, (us, n) in sorted(agg.items(), key=lambda x: -x[1][0]):
    if n == steps:   # once a decode step: the loop body's ops
      per_step += us / n
      w = what.get(name, '?')
      rows.append([name, us / n, w if len(w) < 72 else w[:69] + '...'])
  print(f'\nThe decode loop\'s ops (run {steps} times in the traced '
        f'generation), us a step; their sum {per_step / 1e3:.3f} ms:')
  print(utils.format_table(['op', 'us a step', 'what'], rows[:30]))
  # What a step computes: 2 x the weights a token uses (the embedding table
  # aside: a row is gathered) for each row, and its attention over the
  # cache up to each step's length (QK and PV: 2 x 2 x slots x head dim a
  # query head).
  n = model_lib.count_params(cfg)
  active = n.active - n.embedding
  slots = c.prompt_len + c.new_tokens / 2   # the steps' mean length
  attn = 4 * slots * cfg.head_dim * cfg.num_heads * c.layers
  flop = b * (2 * active + attn)
  print(f'\nA step computes {flop / 1e6:.0f} MFLOP (2 x {active / 1e6:.2f} M '
        f'weights a token, and attention over {slots:.0f} slots on average, '
        f'x {b} rows): {flop / step_ms / 1e6:.0f} GFLOP/s over the measured '
        'step.')
  summary = collections.defaultdict(float)
  for name, us, _ in rows:
    w = what.get(name, '?')
    summary[w.split(' ->')[0] if 'custom-call' in w else
            'matmul fusions' if 'dot' in w else 'other ops'] += us
  print('\nBy kind, us a step:')
  print(utils.format_table(['kind', 'us a step', 'share'],
                           [[k, v, v / per_step] for k, v in sorted(
                               summary.items(), key=lambda x: -x[1])]))


if __name__ == '__main__':
  app.run(main)
