"""Scores a run on a benchmark a package ships: pass@k with standard errors, a JSON result and a table.

  python -m experiments.evaluate --run=runs/cascade/mopd --benchmark=humaneval
  python -m experiments.evaluate --run=RUN --benchmark=humaneval \\
      --samples=10 --k=1,5,10 --temperature=0.8 --limit=20
  python -m experiments.evaluate --run=RUN --benchmark=ifbench \\
      [--benchmark_file=IFBench_test.jsonl]

`--samples` responses a problem (greedy when 1; sampled at `--temperature`
otherwise), scored by the benchmark's own tests in the sandbox; pass@k is
the unbiased estimator over those samples, averaged over problems, with
the standard error over problems (IFBench: a response passes when it
follows every instruction, strict; the loose mode and the instruction-level
shares are reported beside it). The result (`--out`, default
RUN/eval/BENCHMARK.json) records where the benchmark came from (package,
version, file), the run and its checkpoint step, the settings, each
problem's correct count and the code's commit. Benchmarks:
cascade_jax/domains/benchmarks.py.
"""

import json
import os
import time

import jax
from absl import app
from absl import flags

from cascade_jax import checkpoint
from cascade_jax import rollout
from cascade_jax import train
from cascade_jax import utils
from cascade_jax.domains import benchmarks
from cascade_jax.sandbox import Sandbox

_RUN = flags.DEFINE_string('run', None, 'A run directory.', required=True)
_BENCHMARK = flags.DEFINE_enum('benchmark', None, list(benchmarks.BENCHMARKS),
                               'Which benchmark.', required=True)
_FILE = flags.DEFINE_string('benchmark_file', '', "The benchmark's data file "
                            "where no package ships it (IFBench: "
                            "IFBench_test.jsonl).")
_SAMPLES = flags.DEFINE_integer('samples', 1, 'Responses a problem.')
_K = flags.DEFINE_list('k', ['1'], 'pass@k for each k (at most --samples).')
_TEMPERATURE = flags.DEFINE_float(
    'temperature', None, 'Sampling temperature (default: 0, greedy, for one '
    'sample; 0.8 for several).')
_MAX_NEW = flags.DEFINE_integer('max_new_tokens', 512, 'Tokens a response.')
_LIMIT = flags.DEFINE_integer('limit', 0, 'The first N problems (0: all).')
_BATCH = flags.DEFINE_integer('batch_size', 64, 'Prompts a generation batch.')
_SEED = flags.DEFINE_integer('seed', 0, 'Sampling seed.')
_OUT = flags.DEFINE_string('out', '', 'The JSON result (default: '
                           'RUN/eval/BENCHMARK.json).')


def table(result: dict) -> str:
  ks = sorted(result['pass_at_k'], key=int)
  head = f"{'benchmark':<12}{'problems':>9}{'samples':>8}" + ''.join(
      f'{f"pass@{k}":>18}' for k in ks)
  row = (f"{result['benchmark']:<12}{result['problems']:>9}"
         f"{result['samples']:>8}" + ''.join(
             f"{result['pass_at_k'][k]['mean']:>10.3f} "
             f"({result['pass_at_k'][k]['se']:.3f})" for k in ks))
  out = head + '\n' + row
  if 'instruction_level' in result:
    il = result['instruction_level']
    out += (f"\nloose pass@1 {result['prompt_loose']:.3f}; instructions "
            f"followed: strict {il['strict']:.3f}, loose {il['loose']:.3f} "
            f"(of {il['n']})")
  if result['source'].get('skipped'):
    out += (f"\n{len(result['source']['skipped'])} problems left out "
            '(instructions that cannot be checked here: see source.skipped)')
  return out


def evaluate(run: str, benchmark: str, *, samples: int = 1,
             ks=(1,), temperature: float | None = None,
             max_new_tokens: int = 512, limit: int = 0, batch_size: int = 64,
             seed: int = 0, file: str = '') -> dict:
  ks = sorted({int(k) for k in ks})
  if samples < 1 or max(ks) > samples or min(ks) < 1:
    raise ValueError(f'--k={ks} needs 1 <= k <= --samples ({samples})')
  if temperature is None:
    temperature = 0.0 if samples == 1 else 0.8
  if samples > 1 and temperature == 0.0:
    raise ValueError('several --samples need a --temperature above 0 '
                     '(greedy samples are all the same)')
  recs, source = benchmarks.load(benchmark, limit=limit or None, file=file)
  _, model, tok = train.restore_run(run)
  if tok is None:
    raise ValueError(f'{run} has no tokenizer to write prompts with')
  step = checkpoint.Checkpointer(os.path.join(run, 'checkpoints'))
  try:
    ckpt_step = step.latest_step()
  finally:
    step.close()
  cfg = rollout.SampleConfig(max_new_tokens=max_new_tokens,
                             temperature=temperature)
  todo = [r for r in recs for _ in range(samples)]
  t0 = time.time()
  key = jax.random.key(seed)
  responses = []
  for i in range(0, len(todo), batch_size):
    key, sub = jax.random.split(key)
    responses += rollout.responses_for(model, tok, todo[i:i + batch_size],
                                       cfg=cfg, batch_size=batch_size,
                                       key=sub)
    print(f'[evaluate] {benchmark}: generated {len(responses)} / '
          f'{len(todo)} responses ({time.time() - t0:.0f} s)', flush=True)
  scores = benchmarks.score(todo, responses, Sandbox())
  print(f'[evaluate] {benchmark}: scored {len(scores)} responses '
        f'({time.time() - t0:.0f} s)', flush=True)
  correct = [sum(s.passed for s in scores[j * samples:(j + 1) * samples])
             for j in range(len(recs))]
  pak = benchmarks.pass_at_k_table(correct, samples, ks)
  extra = {}
  if scores and 'loose' in scores[0].details:     # instruction following
    strict = [v for s in scores for v in s.details['strict']]
    loose = [v for s in scores for v in s.details['loose']]
    extra = dict(prompt_loose=sum(all(s.details['loose']) for s in scores)
                 / len(scores),
                 instruction_level=dict(strict=sum(strict) / len(strict),
                                        loose=sum(loose) / len(loose),
                                        n=len(strict)))
  return dict(
      benchmark=benchmark, source=source, run=os.path.abspath(run),
      checkpoint_step=ckpt_step, problems=len(recs), samples=samples,
      temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
      pass_at_k={str(k): dict(mean=m, se=se) for k, (m, se) in pak.items()},
      per_problem=[dict(id=r['id'], correct=c, n=samples)
                   for r, c in zip(recs, correct)],
      examples=[dict(id=todo[j]['id'], response=responses[j][:2000],
                     status=scores[j].details.get('status'))
                for j in range(min(3, len(todo)))],
      seconds=round(time.time() - t0, 1), provenance=utils.provenance(),
      **extra)


def main(argv):
  del argv
  utils.quiet_logs()
  result = evaluate(_RUN.value, _BENCHMARK.value, samples=_SAMPLES.value,
                    ks=_K.value, temperature=_TEMPERATURE.value,
                    max_new_tokens=_MAX_NEW.value, limit=_LIMIT.value,
                    batch_size=_BATCH.value, seed=_SEED.value,
                    file=_FILE.value)
  out = _OUT.value or os.path.join(_RUN.value, 'eval',
                                   f'{_BENCHMARK.value}.json')
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out + '.tmp', 'w') as f:
    json.dump(result, f, indent=1)
  os.replace(out + '.tmp', out)
  print(table(result), flush=True)
  print(f'[evaluate] wrote {out}', flush=True)


if __name__ == '__main__':
  app.run(main)
