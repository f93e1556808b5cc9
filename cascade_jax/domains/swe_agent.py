"""Agentic SWE: fix a bug in a small repository with tools, turn by turn; graded by hidden tests after `submit`.

The recipe's SWE RL has an agentless half (the `swe` domain: one reply, a
fixed function or a patch) and this one: execution-based and multi-turn.
Each task is a repository of a few files (a package with the buggy function
among correct ones, a helper module, a visible test file) and a prompt
that says what fails. The model calls tools,

  list_files(), read_file(path), search(text), replace(path, old, new),
  apply_patch(patch), run_tests(), submit()

as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one or more
a message; each result comes back as a `tool` message. `submit` ends the
episode: reward 1 if the hidden tests (all of the task's, the failing one
among them) pass against the edited repository in the sandbox, else 0. An
episode that runs out of turns or tokens earns 0 (`rollout.run_episodes`).
The visible tests also run in the sandbox; their report is an observation,
never a reward.

Levels change what the model must find out for itself:
1. the failing test and the buggy function are in the prompt (replace, submit);
2. the failing test is named, the code is not shown (read, replace, submit);
3. only "a test fails" (run_tests, read, replace, submit).
Records carry a demonstration (`turns`) of that shortest path, for SFT.
"""

from __future__ import annotations

import random

from cascade_jax import envs
from cascade_jax.domains import _base
from cascade_jax.domains import code
from cascade_jax.domains import swe

MODULE, TEST_PATH = 'pkg/ops.py', 'tests/test_ops.py'
TOOLS_TEXT = ('Tools: list_files, read_file(path), search(text), '
              'replace(path, old, new), apply_patch(patch), run_tests, submit.')
MAX_CALLS_PER_TURN = 4


def _fn_lines(src: str) -> tuple[str, str]:
  head, body = src.rstrip('\n').split('\n')
  return head, body.strip()


def _make(rng: random.Random, level: int):
  task, params, ref, tests, _ = code.make_instance(rng, level)
  buggy = code.source(task, params, buggy=True)
  failing = swe.failing_tests(buggy, tests)
  if not failing:                # the bug is invisible to these inputs
    return _make(rng, level)
  # A correct neighbour in the same module, from another task family,
  # before or after it.
  # (never one holding the buggy line: the fix must name one place).
  _, bad_line = _fn_lines(buggy)
  other = rng.choice([t for t in code.TASKS if t.name != task.name])
  neighbour = code.source(other, other.params(rng))
  if bad_line in neighbour:
    return _make(rng, level)
  fns = [neighbour, buggy]
  if rng.random() < 0.5:
    fns.reverse()
  ops = '\n\n'.join(src.rstrip('\n') for src in fns)
  shown = rng.choice(failing)
  visible = [shown] + [t for t in tests if t != shown][:1]
  files = {
      'pkg/__init__.py': '"""Small helpers."""\n',
      MODULE: ops.rstrip('\n') + '\n',
      'pkg/util.py': 'def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n',
      TEST_PATH: f'from pkg.ops import {task.name}\n\n' + '\n'.join(visible)
                 + '\n',
  }
  _, good_line = _fn_lines(ref)
  fix = envs.format_call('replace', path=MODULE, old=bad_line, new=good_line)
  if level == 1:
    ask = f'The test `{shown}` fails. The bug is in {MODULE}:\n{buggy}'
    turns = [fix]
  elif level == 2:
    ask = f'The test `{shown}` fails. The code is in {MODULE}.'
    turns = [envs.format_call('read_file', path=MODULE), fix]
  else:
    ask = f'A test of {task.name} fails. Find the bug.'
    turns = [envs.format_call('run_tests'),
             envs.format_call('read_file', path=MODULE), fix]
  turns.append(envs.format_call('submit'))
  prompt = f'{TOOLS_TEXT}\n{ask}'
  rec = dict(messages=_base.user(prompt), files=files, module='pkg.ops',
             entry_point=task.name, tests=tests, test_path=TEST_PATH)
  rec['turns'] = _demonstration(rec, turns)
  # One problem: a bug and the test that shows it (the neighbours vary).
  key = f'{task.name}:{sorted(params.items())}:{shown}'
  return key, rec



def _demonstration(rec, replies, reward=1.0) -> list[dict]:
  """The conversation after the prompt, the environment's answers included.

  Tool outputs that would need the sandbox (run_tests) are computed by our
  own code here (the repository is ours): a demonstration never runs
  anything the model wrote.
  """
  env = SweAgentEnv(sandbox=_HostRunner())
  convo, step = envs.run_scripted(env, rec, replies)
  if not (step.done and step.reward == reward):
    raise AssertionError(f'swe_agent: the demonstration earns {step.reward}, '
                         f'not {reward} ({step})')
  return convo[len(rec['messages']):]


def _flaw(rng: random.Random, rec: dict) -> list[dict]:
  """A weak teacher's episode: it looks where the demonstration looks, then
  submits without the fix (the fix is what RL has to learn to keep)."""
  del rng
  calls = [m['content'] for m in rec['turns'] if m['role'] == 'assistant']
  return _demonstration(rec, calls[:-2] + calls[-1:], 0.0)


class _HostRunner:
  """Stands in for the sandbox while *we* build demonstrations from our own code."""

  class limits:  # pylint: disable=invalid-name
    wall_seconds = 5.0

  def run_script(self, program):
    from cascade_jax.sandbox import ScriptResult  # pylint: disable=g-import-not-at-top
    out, _ = self._exec(program, '')
    return ScriptResult(0, 'ok', out, '', 0.0)

  def run_tests_batch(self, jobs):
    return [self.run_tests(j['program'], j['tests'], j['entry_points'])
            for j in jobs]

  def run_tests(self, program, tests, entry_points, setup=''):
    from cascade_jax.sandbox import TestResult  # pylint: disable=g-import-not-at-top
    del entry_points, setup
    _, failed = self._exec(program, tests)
    return TestResult(not failed, 'passed' if not failed else 'failed')

  @staticmethod
  def _exec(program: str, tests: str) -> tuple[str, bool]:
    """Runs `program` (then `tests`, in its namespace); (stdout, failed)."""
    import contextlib  # pylint: disable=g-import-not-at-top
    import io  # pylint: disable=g-import-not-at-top
    import sys  # pylint: disable=g-import-not-at-top
    import tempfile  # pylint: disable=g-import-not-at-top
    out, path, failed = io.StringIO(), list(sys.path), False
    with tempfile.TemporaryDirectory() as d:
      try:
        ns = {'__name__': '__main__', '_BASE': d}
        with contextlib.redirect_stdout(out):
          try:
            exec(program, ns)  # pylint: disable=exec-used
            exec(tests, ns)  # pylint: disable=exec-used
          except SystemExit:
            pass
          except Exception:  # pylint: disable=broad-except
            failed = True
      finally:
        sys.path[:] = path
        for m in [m for m in sys.modules if m == 'pkg' or m.startswith('pkg.')]:
          del sys.modules[m]
    return out.getvalue(), failed


class SweAgentEnv:
  """One episode on one repository (a fresh copy of the record's files)."""

  def __init__(self, sandbox=None):
    self.sandbox = sandbox
    self.rec: dict | None = None
    self.ws: envs.Workspace | None = None
    self.toolbox = envs.Toolbox([
        envs.Tool('list_files', (), lambda: self.ws.list_files()),
        envs.Tool('read_file', (('path', str),),
                  lambda path: self.ws.read_file(path)),
        envs.Tool('search', (('text', str),),
                  lambda text: self.ws.search(text)),
        envs.Tool('replace', (('path', str), ('old', str), ('new', str)),
                  lambda path, old, new: self.ws.replace(path, old, new)),
        envs.Tool('apply_patch', (('patch', str),),
                  lambda patch: self.ws.apply_patch(patch)),
        envs.Tool('run_tests', (),
                  lambda: self.ws.run_tests(self._sandbox(),
                                            self.rec['test_path'])),
        envs.Tool('submit', (), lambda: ''),
    ])

  def _sandbox(self):
    if self.sandbox is None:
      from cascade_jax.sandbox import Sandbox  # pylint: disable=g-import-not-at-top
      self.sandbox = Sandbox(envs.TOOL_LIMITS, workers=1)
    return self.sandbox

  def reset(self, record):
    self.rec = record
    self.ws = envs.Workspace(dict(record['files']))
    return list(record['messages'])

  def step(self, assistant: str) -> envs.Step:
    if self.ws is None:
      raise RuntimeError('SweAgentEnv.step before reset')
    try:
      calls = envs.parse_tool_calls(_base.strip_think(assistant))
    except envs.ToolCallError as e:
      return envs.Step((envs.tool_message(f'error: {e}'),))
    if not calls:
      return envs.Step((envs.tool_message(
          'error: no tool call. ' + self.toolbox.describe()),))
    out = []
    for call in calls[:MAX_CALLS_PER_TURN]:
      if call.name == 'submit':
        try:
          self.toolbox.check(call)
        except envs.ToolCallError as e:
          out.append(envs.tool_message(f'error: {e}'))
          continue
        # Through the code domain's verdict cache: the same final
        # repository (most episodes end on one of a few) is judged once.
        program = self.ws.judge_program(self.rec['module'],
                                        self.rec['entry_point'])
        passed = code.run_programs([self.rec], [program],
                                   self._sandbox())[0].passed
        return envs.Step(tuple(out), reward=float(passed), done=True,
                         info=dict(passed=passed))
      out.append(envs.tool_message(self.toolbox.run(call)))
    if len(calls) > MAX_CALLS_PER_TURN:
      out.append(envs.tool_message(
          f'error: at most {MAX_CALLS_PER_TURN} tool calls a message; the '
          'rest were not run'))
    return envs.Step(tuple(out))


def make_env(record, sandbox=None) -> SweAgentEnv:
  del record
  return SweAgentEnv(sandbox)


def generate(*, split, n, seed, levels=(1, 2, 3), eval_fraction=0.2,
             split_by='problem', response_quality=1.0):
  return _base.sample(_make, domain='swe_agent', split=split, n=n, seed=seed,
                      levels=levels, eval_fraction=eval_fraction,
                      split_by=split_by, response_quality=response_quality,
                      flaw=_flaw)


DOMAIN = _base.Domain(
    name='swe_agent', generate=generate, verify=_base.episode_only('swe_agent'),
    required_fields=('files', 'module', 'entry_point', 'tests', 'test_path'),
    needs_sandbox=True, env=make_env,
    episode_limits=dict(max_turns=5, max_new_tokens=72,
                        max_observation_tokens=96, max_tokens=448),
    description='fix a bug in a small repository with tools, multi-turn; '
                'hidden tests in the sandbox after submit')
