"""Code: small Python function tasks with hidden unit tests, strict pass / fail in the sandbox.

Records carry `entry_point`, `tests` (assert lines, or HumanEval-style code
defining `check(candidate)`; a list of strings is joined) and optionally
`setup` (trusted helper code the tests use). The prompt shows at most one
example; the tests are hidden. The reward is 1 only if every test passes.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import random
import threading
from collections.abc import Callable

from absl import logging

from cascade_jax.domains import _base
from cascade_jax.sandbox import SANDBOX_ERROR
from cascade_jax.sandbox import Sandbox


@dataclasses.dataclass(frozen=True)
class Task:
  """A task family: description, reference body, input sampler, bug."""
  name: str
  level: int
  describe: str                       # uses {k} / {c}
  body: str                           # the reference return expression
  args: Callable[[random.Random, dict], tuple]
  bug: str                            # a buggy return expression (for swe)
  params: Callable[[random.Random], dict] = lambda rng: {}


def _ints(rng, n=None):
  return [rng.randint(-9, 20) for _ in range(n or rng.randint(1, 6))]


def _word(rng, alphabet='abcde'):
  return ''.join(rng.choice(alphabet) for _ in range(rng.randint(1, 7)))


_K = lambda rng: {'k': rng.randint(1, 9)}
TASKS = (
    Task('add_k', 1, 'returns x plus {k}', 'x + {k}',
         lambda rng, p: (rng.randint(-20, 50),), 'x - {k}', _K),
    Task('times_k', 1, 'returns x times {k}', 'x * {k}',
         lambda rng, p: (rng.randint(-20, 50),), 'x + {k}', _K),
    Task('is_even', 1, 'returns True if the integer n is even, else False',
         'n % 2 == 0', lambda rng, p: (rng.randint(-50, 50),), 'n % 2 == 1'),
    Task('first_char', 1, 'returns the first character of the string s',
         's[0]', lambda rng, p: (_word(rng),), 's[-1]'),
    Task('largest', 2, 'returns the largest number in the list xs',
         'max(xs)', lambda rng, p: (_ints(rng),), 'min(xs)'),
    Task('total', 2, 'returns the sum of the list xs', 'sum(xs)',
         lambda rng, p: (_ints(rng),), 'sum(xs[1:])'),
    Task('reverse', 2, 'returns the string s reversed', 's[::-1]',
         lambda rng, p: (_word(rng),), 's[1:]'),
    Task('count_char', 2, "returns how many times '{c}' occurs in the string s",
         "s.count('{c}')", lambda rng, p: (_word(rng),), "s.find('{c}')",
         lambda rng: {'c': rng.choice('abcde')}),
    Task('head_k', 2, 'returns the first {k} characters of the string s',
         's[:{k}]', lambda rng, p: (_word(rng),), 's[:{k} - 1]',
         lambda rng: {'k': rng.randint(2, 5)}),
    Task('sum_even', 3, 'returns the sum of the even numbers in the list xs',
         'sum(x for x in xs if x % 2 == 0)', lambda rng, p: (_ints(rng),),
         'sum(x for x in xs if x % 2 == 1)'),
    Task('count_above', 3,
         'returns how many numbers in the list xs are greater than {k}',
         'sum(1 for x in xs if x > {k})', lambda rng, p: (_ints(rng),),
         'sum(1 for x in xs if x >= {k})', _K),
    Task('sort_desc', 3,
         'returns the list xs sorted from largest to smallest',
         'sorted(xs, reverse=True)', lambda rng, p: (_ints(rng),), 'sorted(xs)'),
    Task('repeat_k', 3, 'returns the string s repeated {k} times', 's * {k}',
         lambda rng, p: (_word(rng),), 's * ({k} + 1)',
         lambda rng: {'k': rng.randint(2, 4)}),
)
_ARG = {'add_k': 'x', 'times_k': 'x', 'is_even': 'n', 'first_char': 's',
        'largest': 'xs', 'total': 'xs', 'reverse': 's', 'count_char': 's',
        'head_k': 's', 'sum_even': 'xs', 'count_above': 'xs',
        'sort_desc': 'xs', 'repeat_k': 's'}


def source(task: Task, params: dict, *, buggy: bool = False) -> str:
  expr = (task.bug if buggy else task.body).format(**params)
  return f'def {task.name}({_ARG[task.name]}):\n    return {expr}\n'


def run_reference(src: str, name: str, args: tuple):
  """Our own generated reference code only: never model output."""
  ns: dict = {}
  exec(src, ns)  # pylint: disable=exec-used
  return ns[name](*args)


def make_instance(rng: random.Random, level: int, n_tests: int = 5):
  """A task instance: (task, params, reference source, tests, example)."""
  task = rng.choice([t for t in TASKS if t.level == level])
  params = task.params(rng)
  ref = source(task, params)
  calls, seen = [], set()
  for _ in range(50):
    args = task.args(rng, params)
    if repr(args) in seen or (task.name == 'first_char' and not args[0]):
      continue
    seen.add(repr(args))
    calls.append((args, run_reference(ref, task.name, args)))
    if len(calls) == n_tests + 1:
      break
  fmt = lambda a: ', '.join(repr(x) for x in a)
  tests = [f'assert {task.name}({fmt(a)}) == {out!r}' for a, out in calls[1:]]
  example = f'{task.name}({fmt(calls[0][0])}) == {calls[0][1]!r}'
  return task, params, ref, tests, example


def _make(rng: random.Random, level: int):
  task, params, ref, tests, example = make_instance(rng, level)
  desc = task.describe.format(**params)
  prompt = (f'Write a Python function {task.name}({_ARG[task.name]}) that '
            f'{desc}. For example, {example}.')
  key = f"{task.name}:{sorted(params.items())}"
  return key, dict(messages=_base.user(prompt), entry_point=task.name,
                   tests=tests, response=ref,
                   buggy_response=source(task, params, buggy=True))


def _flaw(rng: random.Random, rec: dict) -> str:
  """The task's typical bug (e.g. min for max, s[1:] for a reversal)."""
  del rng
  return rec['buggy_response']


def generate(*, split, n, seed, levels=(1, 2, 3), eval_fraction=0.2,
             split_by='problem', response_quality=1.0):
  return _base.sample(_make, domain='code', split=split, n=n, seed=seed,
                      levels=levels, eval_fraction=eval_fraction,
                      split_by=split_by, response_quality=response_quality,
                      flaw=_flaw)


# ----------------------------------------------------------- verifying

_DEFAULT_SANDBOX: Sandbox | None = None
_LOCK = threading.Lock()


def default_sandbox() -> Sandbox:
  """One shared sandbox (a pool sized to the machine) for verifiers."""
  global _DEFAULT_SANDBOX
  with _LOCK:
    if _DEFAULT_SANDBOX is None:
      _DEFAULT_SANDBOX = Sandbox()
    return _DEFAULT_SANDBOX


def tests_text(rec) -> str:
  t = rec['tests']
  return '\n'.join(t) + '\n' if isinstance(t, list) else str(t)


# Verdicts by (limits, program, tests, setup, entry point). RL groups often
# sample the same program several times, and greedy evaluations after
# successive stages repeat most answers: each distinct job runs once.
_VERDICTS: collections.OrderedDict[str, _base.Score] = collections.OrderedDict()
_MAX_VERDICTS = 100_000


def _job_key(sandbox: Sandbox, job: dict) -> str:
  blob = json.dumps([repr(sandbox.limits), job], sort_keys=True)
  return hashlib.sha256(blob.encode()).hexdigest()


def run_programs(records, programs, sandbox=None) -> list[_base.Score]:
  """Strict pass / fail of each program against its record's tests.

  Identical jobs run once (within a call, and across calls through a
  bounded cache of verdicts), in parallel on the sandbox's pool.
  """
  sandbox = sandbox or default_sandbox()
  jobs = [dict(program=p, tests=tests_text(r), entry_points=[r['entry_point']],
               setup=r.get('setup', '')) for r, p in zip(records, programs,
                                                         strict=True)]
  keys = [_job_key(sandbox, j) for j in jobs]
  with _LOCK:
    todo = {k: j for k, j in zip(keys, jobs) if k not in _VERDICTS}
  results = dict(zip(todo, sandbox.run_tests_batch(list(todo.values()))))
  # A sandbox that failed to start says nothing about the program: once
  # more, then a failing score that is not kept (nor is a timeout: both may
  # go another way on a quieter machine).
  again = [k for k, res in results.items() if res.status == SANDBOX_ERROR]
  if again:
    results.update(zip(again, sandbox.run_tests_batch([todo[k]
                                                       for k in again])))
    for k in again:
      if results[k].status == SANDBOX_ERROR:
        logging.warning('code: the sandbox failed twice to start: %s',
                        results[k].error)
  fresh = {k: _base.binary(res.passed, status=res.status,
                           error=res.error[:300])
           for k, res in results.items()}
  with _LOCK:
    for k, score in fresh.items():
      if score.details['status'] not in ('timeout', SANDBOX_ERROR):
        _VERDICTS[k] = score
    out = []
    for k in keys:
      if k in _VERDICTS:
        _VERDICTS.move_to_end(k)
      out.append(fresh.get(k) or _VERDICTS[k])
    while len(_VERDICTS) > _MAX_VERDICTS:
      _VERDICTS.popitem(last=False)
  return out


def verify(records, responses, *, sandbox=None):
  return run_programs(records, [_base.extract_code(r) for r in responses],
                      sandbox)


DOMAIN = _base.Domain(
    name='code', generate=generate, verify=verify,
    required_fields=('entry_point', 'tests'), needs_sandbox=True,
    description='Python functions, hidden tests, strict pass/fail (sandbox)')
