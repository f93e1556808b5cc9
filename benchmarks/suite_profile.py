"""Where the test suite's time goes: compiles, tracing and programs, per test and per file.

As a pytest plugin it writes, for every test, its wall seconds and the
XLA work of its worker process (JAX's monitoring events: backend compiles
and their seconds by program, tracing and lowering seconds, programs
loaded from the persistent cache, which JAX times as compiles) to
`$SUITE_PROFILE_OUT/<pid>.jsonl`; as a script it sums those files per file
and in all, and counts the distinct programs the run compiled (the entries
of the compilation cache it shared, launchers' subprocesses included):

  out=/tmp/prof; cache=$(mktemp -d)
  SUITE_PROFILE_OUT=$out CASCADE_JAX_XLA_CACHE=$cache PYTHONPATH=benchmarks \\
    bash scripts/test.sh -p suite_profile
  python benchmarks/suite_profile.py $out --cache=$cache

Subprocesses' compiles are in their test's wall seconds, not its compiles.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import time

import pytest

_OUT = os.environ.get('SUITE_PROFILE_OUT')
_EVENTS = {'/jax/core/compile/backend_compile_duration': 'compile',
           '/jax/core/compile/jaxpr_trace_duration': 'trace',
           '/jax/core/compile/jaxpr_to_mlir_module_duration': 'lower',
           '/jax/compilation_cache/cache_retrieval_time_sec': 'cache_hit'}
_now: collections.Counter = collections.Counter()
_programs: collections.Counter = collections.Counter()   # name -> compile s
_hit = [False]
_registered = False


def _listen(event: str, duration: float, **kw) -> None:
  name = _EVENTS.get(event)
  if not name:
    return
  _now[name + '_s'] += duration
  _now[name + 's'] += 1
  if name == 'cache_hit':
    _hit[0] = True
  elif name == 'compile':
    # A compile that loaded its program from the persistent cache is
    # counted as a hit, not a compile (JAX times both as one event).
    if _hit[0]:
      _now['loaded_s'] += duration
      _hit[0] = False
    else:
      _programs[kw.get('fun_name', '?')] += duration


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  global _registered
  if _OUT and not _registered:
    from jax import monitoring  # pylint: disable=g-import-not-at-top
    monitoring.register_event_duration_secs_listener(_listen)
    _registered = True
  _now.clear()
  _programs.clear()
  t = time.perf_counter()
  yield
  if _OUT:
    rec = dict(test=item.nodeid, wall=round(time.perf_counter() - t, 3),
               **{k: round(v, 3) for k, v in _now.items()},
               programs={k: round(v, 3) for k, v in _programs.items()})
    os.makedirs(_OUT, exist_ok=True)
    with open(os.path.join(_OUT, f'{os.getpid()}.jsonl'), 'a') as f:
      f.write(json.dumps(rec) + '\n')


def summarize(out: str, cache: str | None = None, top: int = 25) -> str:
  recs = [json.loads(line) for path in glob.glob(os.path.join(out, '*.jsonl'))
          for line in open(path)]
  keys = ('wall', 'compiles', 'compile_s', 'trace_s', 'lower_s', 'cache_hits')
  files = collections.defaultdict(collections.Counter)
  programs = collections.Counter()
  for r in recs:
    f = files[r['test'].split('::')[0]]
    f['tests'] += 1
    for k in keys:
      f[k] += r.get(k, 0)
    # Compiles from the persistent cache are loads: counted apart.
    f['compiles'] -= r.get('cache_hits', 0)
    f['compile_s'] -= r.get('loaded_s', 0)
    programs.update(r.get('programs', {}))
  total = sum(files.values(), collections.Counter())
  head = f"{'file':40s} {'tests':>5s} " + ' '.join(f'{k:>10s}' for k in keys)
  row = lambda name, f: (f'{name:40s} {f["tests"]:5d} ' + ' '.join(
      f'{f[k]:10.0f}' if k in ('compiles', 'cache_hits') else f'{f[k]:10.1f}'
      for k in keys))
  lines = [head, row('all', total)]
  for name, f in sorted(files.items(), key=lambda kv: -kv[1]['wall'])[:top]:
    lines.append(row(name, f))
  if programs:
    lines.append('\nprograms by compile seconds (in-process compiles):')
    lines += [f'{s:8.1f} s  {name}' for name, s in programs.most_common(top)]
  if cache:
    n = sum(len(fs) for _, _, fs in os.walk(cache))
    lines.append(f'distinct programs in the shared compilation cache: {n}')
  return '\n'.join(lines)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('out')
  p.add_argument('--cache')
  p.add_argument('--top', type=int, default=25)
  a = p.parse_args()
  print(summarize(a.out, a.cache, a.top))


if __name__ == '__main__':
  main()
