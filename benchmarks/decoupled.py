"""Decoupled rollouts against the synchronous loop: one RL stage of the main job, steps per second.

  python -m benchmarks.decoupled --run=runs/cascade --stage=if_rl \
      --out=docs/results/decoupled_<date>

The arms (`--arms`), one after the other, each `experiments.rerun_stage`
of `--stage` from the run's checkpoint of its start (the stage's own
config otherwise):
- `sync`: the synchronous loop (`rl.max_staleness=0`, rollouts in the
  learner's process), free to use every core;
- `decoupled`: the learner pinned to core 0 (`taskset`), the sampler
  process to core 1 (`rl.rollout_worker=process`, `rl.rollout_cpus=1`),
  `rl.max_staleness=--staleness`: it samples step t + 1 while the learner
  updates on step t;
- `decoupled_shared`: the same without pinning (both processes on every
  core, the OS scheduling them).
- `thread`: a sampler thread in the learner's process
  (`rl.rollout_worker=thread`) on the learner's device, `--staleness`
  behind: the two share the process's cores, its XLA and its memory; no
  weights cross the host.
Each arm's stage window is from its first step's start to its last step's
end (the metrics rows' times; the evaluations before and after are outside
it). Printed and written (results.json, README.md): steps per second and
their ratio, each phase's mean seconds a step, each core's busy fraction in
the window (from /proc/stat, sampled every 0.5 s), and each arm's change on
every domain against the stage's start (prompt by prompt, paired SE).

The rule, fixed before the first run: the decoupled arm at
staleness 1 reaches at least 1.2 x the synchronous arm's steps per second
over the stage window, and its own domain rises beyond two paired standard
errors (as the synchronous stage's does), on the cascade's seed (one pair:
the figure is a speed measurement on a shared machine, its ratio measured
side by side).
"""

import json
import os
import subprocess
import sys
import threading
import time

from absl import app
from absl import flags

from cascade_jax import utils

_RUN = flags.DEFINE_string('run', None, 'A cascade run directory (its SFT '
                           'at least).', required=True)
_STAGE = flags.DEFINE_string('stage', 'if_rl', 'The RL stage.')
_CONFIG = flags.DEFINE_string('config', 'configs/cascade.py',
                              'The cascade config the run used.')
_OUT = flags.DEFINE_string('out', None, 'Results directory.', required=True)
_STALENESS = flags.DEFINE_integer('staleness', 1, 'The decoupled arm\'s '
                                  'rl.max_staleness.')
_ARMS = flags.DEFINE_list('arms', ['sync', 'decoupled'], 'Arms, in order.')
_INIT = flags.DEFINE_string('init_from', '', "Start from this stage of the "
                            "run instead of the stage's own start.")
_SET = flags.DEFINE_multi_string('set', [], 'Extra --config.stages.STAGE.KEY=V '
                                 'overrides for both arms (KEY=V).')


def _cpu_times():
  """{cpu: (busy, total)} jiffies from /proc/stat."""
  out = {}
  with open('/proc/stat') as f:
    for line in f:
      if line.startswith('cpu') and line[3].isdigit():
        name, *v = line.split()
        v = [int(x) for x in v]
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        out[int(name[3:])] = (sum(v) - idle, sum(v))
  return out


class _Sampler(threading.Thread):
  """/proc/stat every 0.5 s, with the time."""

  def __init__(self):
    super().__init__(daemon=True)
    self.samples, self._done = [], threading.Event()

  def run(self):
    while not self._done.is_set():
      self.samples.append((time.time(), _cpu_times()))
      self._done.wait(0.5)

  def stop(self):
    self._done.set()
    self.join()
    self.samples.append((time.time(), _cpu_times()))

  def busy(self, t0, t1) -> dict[int, float]:
    """Each core's busy fraction between the samples nearest t0 and t1."""
    a = min(self.samples, key=lambda s: abs(s[0] - t0))[1]
    b = min(self.samples, key=lambda s: abs(s[0] - t1))[1]
    return {c: (b[c][0] - a[c][0]) / max(b[c][1] - a[c][1], 1) for c in a}


def _arm(name: str, workdir: str) -> list[str]:
  st = f'--config.stages.{_STAGE.value}'
  cmd = [sys.executable, '-m', 'experiments.rerun_stage',
         f'--config={_CONFIG.value}', f'--run={_RUN.value}',
         f'--stage={_STAGE.value}', f'--workdir={workdir}']
  cmd += [f'{st}.{kv}' for kv in _SET.value]
  if _INIT.value:
    cmd.append(f'--init_from={_INIT.value}')
  ahead = lambda worker: [f'{st}.rl.max_staleness={_STALENESS.value}',
                          f'{st}.rl.rollout_worker={worker}']
  if name == 'decoupled':
    return ['taskset', '-c', '0'] + cmd + ahead('process') + [
        f'{st}.rl.rollout_cpus=1']
  if name == 'decoupled_shared':
    return cmd + ahead('process')
  if name == 'thread':
    return cmd + ahead('thread')
  if name != 'sync':
    raise ValueError(f'unknown arm {name!r} (sync, decoupled, '
                     'decoupled_shared, thread)')
  return cmd


_PHASES = ('sample_s', 'score_s', 'train_s', 'weight_sync_s',
           'rollout_wait_s', 'sampler_wall_s', 'sampler_cpu_s', 'step_s')


def _summary(workdir: str, sampler: _Sampler) -> dict:
  with open(os.path.join(workdir, 'rl_metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  steps = [r for r in rows if 'step_s' in r]
  t0 = steps[0]['time'] - steps[0]['step_s']
  t1 = steps[-1]['time']
  with open(os.path.join(workdir, 'rerun.json')) as f:
    rerun = json.load(f)
  return dict(
      steps=len(steps), window_s=t1 - t0, steps_per_s=len(steps) / (t1 - t0),
      phases={k: sum(r.get(k, 0.0) for r in steps) / len(steps)
              for k in _PHASES},
      busy=sampler.busy(t0, t1),
      staleness=sum(r.get('policy_staleness', 0) for r in steps) / len(steps),
      stale_dropped=sum(r.get('stale_dropped', 0) for r in steps),
      domains=[{k: r[k] for k in ('domain', 'own', 'before', 'after',
                                  'change', 'se')} for r in rerun['rows']],
      wall_s=rerun.get('meta', {}).get('wall_s'))


def _table(results: dict) -> str:
  arms = list(results)
  lines = ['| | ' + ' | '.join(arms) + ' |', '|---|' + '---:|' * len(arms)]
  row = lambda label, f: lines.append(
      f'| {label} | ' + ' | '.join(f(results[a]) for a in arms) + ' |')
  row('steps / s (stage window)', lambda r: f"{r['steps_per_s']:.3f}")
  row('window s', lambda r: f"{r['window_s']:.1f}")
  for k in _PHASES:
    row(f'{k} (mean a step)', lambda r, k=k: f"{r['phases'][k]:.3f}")
  cores = sorted(next(iter(results.values()))['busy'])
  for c in cores:
    row(f'core {c} busy', lambda r, c=c: f"{r['busy'][c]:.2f}")
  row('mean staleness', lambda r: f"{r['staleness']:.2f}")
  for d in next(iter(results.values()))['domains']:
    def cell(r, name=d['domain']):
      x = next(e for e in r['domains'] if e['domain'] == name)
      beyond = abs(x['change']) > 2 * x['se']
      return f"{x['change']:+.3f} ± {2 * x['se']:.3f}{' *' if beyond else ''}"
    row(f"{d['domain']}{' (own)' if d['own'] else ''}: change ± 2 SE", cell)
  return '\n'.join(lines)


def main(argv):
  del argv
  os.makedirs(_OUT.value, exist_ok=True)
  results = {}
  for name in _ARMS.value:
    workdir = os.path.join(_OUT.value, 'runs', name)
    cmd = _arm(name, workdir)
    print(f'[bench_decoupled] {name}: {" ".join(cmd)}', flush=True)
    sampler = _Sampler()
    sampler.start()
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    sampler.stop()
    results[name] = dict(_summary(workdir, sampler), command=cmd,
                         total_s=time.perf_counter() - t0)
  out = dict(meta=utils.provenance(), stage=_STAGE.value, run=_RUN.value,
             staleness=_STALENESS.value, arms=results)
  if 'sync' in results:
    out['ratio'] = {a: r['steps_per_s'] / results['sync']['steps_per_s']
                    for a, r in results.items() if a != 'sync'}
  with open(os.path.join(_OUT.value, 'results.json'), 'w') as f:
    json.dump(out, f, indent=2)
  table = _table(results)
  print(table)
  for a, x in out.get('ratio', {}).items():
    print(f'{a} / sync steps per second: {x:.3f}')


if __name__ == '__main__':
  app.run(main)
