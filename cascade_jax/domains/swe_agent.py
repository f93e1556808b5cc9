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

import json
import random
import threading

from cascade_jax import envs
from cascade_jax.domains import _base
from cascade_jax.domains import code
from cascade_jax.domains import swe
from cascade_jax.sandbox import Limits
from cascade_jax.sandbox import Sandbox
from cascade_jax.sandbox import ScriptResult
from cascade_jax.sandbox import TestResult

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
  # The replies alone: `generate` replays them in the environment, with
  # what the sandbox answers, once the records are drawn.
  rec['turns'] = _replies(turns)
  # One problem: a bug and the test that shows it (the neighbours vary).
  key = f'{task.name}:{sorted(params.items())}:{shown}'
  return key, rec


def _replies(calls):
  return [{'role': 'assistant', 'content': c} for c in calls]


def _flaw(rng: random.Random, rec: dict) -> list[dict]:
  """A weak teacher's episode: it looks where the demonstration looks, then
  submits without the fix (the fix is what RL has to learn to keep)."""
  del rng
  calls = [m['content'] for m in rec['turns'] if m['role'] == 'assistant']
  return _replies(calls[:-2] + calls[-1:])


# ---------------------------------------------------------- demonstrations
#
# A demonstration's tool outputs (the visible tests' report, the hidden
# tests' verdict) come from running the repository: in the sandbox, as every
# other program. One sandbox process runs many (a process a tool call would
# cost ~80 ms each: minutes for an SFT mix), each in a fresh directory and
# module table; the trainer's own modules, path and stdout are never touched.

# Limits of one batch process (DEMO_BATCH repositories, ours, small).
DEMO_LIMITS = Limits(wall_seconds=300, cpu_seconds=300, memory_bytes=1 << 30,
                     processes=8, output_bytes=64 << 20, tmpfs_bytes=64 << 20)
DEMO_BATCH = 512

_BATCH = """\
import contextlib, io, json, os, shutil, sys, tempfile
_jobs = json.loads({jobs!r})
_results = []
for _kind, _program, _tests in _jobs:
    _out, _failed, _path = io.StringIO(), False, list(sys.path)
    _dir = tempfile.mkdtemp()
    try:
        _ns = {{'__name__': '__main__', '_BASE': _dir}}
        with contextlib.redirect_stdout(_out):
            try:
                exec(_program, _ns)
                exec(_tests, _ns)
            except SystemExit:
                pass
            except Exception:
                _failed = True
    finally:
        sys.path[:] = _path
        for _m in [m for m in sys.modules if m == 'pkg' or m.startswith('pkg.')]:
            del sys.modules[_m]
        shutil.rmtree(_dir, ignore_errors=True)
    _results.append([_out.getvalue(), _failed])
sys.stdout.write(json.dumps(_results))
"""


class _Recorder:
  """Pass 1: notes each program a replay would run; answers with nothing."""

  class limits:  # pylint: disable=invalid-name
    wall_seconds = DEMO_LIMITS.wall_seconds

  def __init__(self):
    self.jobs: list[tuple[str, str, str]] = []

  def run_script(self, program):
    self.jobs.append(('script', program, ''))
    return ScriptResult(0, 'ok', '', '', 0.0)

  def run_tests_batch(self, jobs):
    self.jobs += [('tests', j['program'], j['tests']) for j in jobs]
    # 'timeout' so that code.run_programs keeps no verdict of this pass.
    return [TestResult(False, 'timeout') for _ in jobs]


class _Answers:
  """Pass 2: the sandbox's answers to the recorded programs."""

  class limits:  # pylint: disable=invalid-name
    # Its own key in code's verdict cache (its repr): these verdicts come
    # from our repositories run with DEMO_LIMITS, not the RL sandbox's.
    wall_seconds = DEMO_LIMITS.wall_seconds

  def __init__(self, answers: dict):
    self.answers = answers

  def run_script(self, program):
    out, _ = self.answers['script', program, '']
    return ScriptResult(0, 'ok', out, '', 0.0)

  def run_tests_batch(self, jobs):
    return [TestResult(not failed, 'failed' if failed else 'passed')
            for _, failed in (self.answers['tests', j['program'], j['tests']]
                              for j in jobs)]


def _run_batches(jobs, sandbox: Sandbox) -> dict:
  """{job: (stdout, failed)}, DEMO_BATCH jobs a sandbox process."""
  todo = list(dict.fromkeys(jobs))
  chunks = [todo[i:i + DEMO_BATCH] for i in range(0, len(todo), DEMO_BATCH)]
  results = sandbox.run_scripts_batch(
      [_BATCH.format(jobs=json.dumps(c)) for c in chunks])
  answers = {}
  for chunk, res in zip(chunks, results):
    if res.status != 'ok':
      raise RuntimeError(f'swe_agent: a batch of {len(chunk)} demonstration '
                         f'runs failed in the sandbox ({res.status}, exit '
                         f'{res.returncode}): {res.stderr[-2000:]}')
    answers.update(zip(chunk, (tuple(r) for r in json.loads(res.stdout))))
  return answers


def demonstrations(records, sandbox: Sandbox | None = None) -> list[dict]:
  """`records` with each one's `turns` (its replies) replaced by the whole
  conversation after the prompt, the environment's answers included, run in
  the sandbox; each must earn 1 (0 for a `flawed` record)."""
  replies = [[m['content'] for m in r['turns'] if m['role'] == 'assistant']
             for r in records]
  recorder = _Recorder()
  for r, calls in zip(records, replies):
    envs.run_scripted(SweAgentEnv(sandbox=recorder), r, calls)
  answers = _run_batches(recorder.jobs, sandbox or _demo_sandbox())
  out = []
  for r, calls in zip(records, replies):
    convo, step = envs.run_scripted(SweAgentEnv(sandbox=_Answers(answers)),
                                    r, calls)
    want = 0.0 if r.get('flawed') else 1.0
    if not (step.done and step.reward == want):
      raise AssertionError(f"swe_agent: the demonstration of {r['id']} earns "
                           f'{step.reward}, not {want} ({step})')
    out.append(dict(r, turns=convo[len(r['messages']):]))
  return out


_DEMO_SANDBOX: Sandbox | None = None
_LOCK = threading.Lock()


def _demo_sandbox() -> Sandbox:
  global _DEMO_SANDBOX
  with _LOCK:
    if _DEMO_SANDBOX is None:
      _DEMO_SANDBOX = Sandbox(DEMO_LIMITS)
    return _DEMO_SANDBOX


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
  return demonstrations(_base.sample(
      _make, domain='swe_agent', split=split, n=n, seed=seed, levels=levels,
      eval_fraction=eval_fraction, split_by=split_by,
      response_quality=response_quality, flaw=_flaw))


DOMAIN = _base.Domain(
    name='swe_agent', generate=generate, verify=_base.episode_only('swe_agent'),
    required_fields=('files', 'module', 'entry_point', 'tests', 'test_path'),
    needs_sandbox=True, env=make_env,
    episode_limits=dict(max_turns=5, max_new_tokens=72,
                        max_observation_tokens=96, max_tokens=448),
    description='fix a bug in a small repository with tools, multi-turn; '
                'hidden tests in the sandbox after submit')
