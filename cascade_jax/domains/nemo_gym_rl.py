"""NeMo-Gym rows as an RL domain: the public RL set's prompts trained on, each verified as `experiments.verify` verifies a rollout.

  python -m experiments.rl --config=configs/rl.py --config.data.domain=nemo_gym \
      --config.data.files=math.jsonl,code.jsonl [--config.data.eval_files=held.jsonl]

Rows are read and checked by `nemo_gym.read_rows` (a malformed row names its
file, line and field); a row becomes a record `{id, domain: 'nemo_gym',
messages, kind, source, <the verifier's fields>}`, its id a hash of its
prompt messages. Without `eval_files`, `eval_fraction` of the prompts (split
by that hash, the same split in every run) is held out for evaluation.
Rows of instruction following whose instructions cannot be checked here
(`_if_registry.unknown_ids`) are refused, named, before training. The
generated domains' `levels` have no meaning for these rows and are ignored.

Rewards, per row kind (as `nemo_gym.verify_rows`):
- math: math-verify's verdict against `expected_answer` (1 / 0);
- code: the last fenced block passes every unit test in the sandbox (1 / 0;
  `nemo_gym.TEST_LIMITS` a test), run in parallel across responses;
- instruction following: the share of instructions followed under grading
  mode 'fraction', else 1 only when all are; `passed` means all, and each
  instruction is a named check (`DomainScore.by_check`);
- structured output: the response validates against the strict schema
  (v4 tool-call rows: its one call's payload does);
- conversational tool use (tool_call): the reply's next action (its
  `<tool_call>`s, else a message) against the row's expected action, as
  NeMo-Gym's single-step tool-use server compares them (`_tool_call`);
- multiple choice (mcqa): the letter read in the row's grading mode is the
  gold one (`_mcqa`).

Math rows with a stateful Python tool (kind stateful_python, NeMo-Gym's
ns_tools) are domain `nemo_gym_python` (`--config.data.domain=
nemo_gym_python`, or beside nemo_gym on the same files: each domain takes
its own rows): episodes (`PythonMathEnv`) whose calls run in a Python
session in the sandbox, rewarded by the math verdict on the episode's text.
Workplace-assistant rows (kind workplace, WorkBench) are domain
`nemo_gym_workplace`: episodes (`WorkplaceEnv`) whose calls act on the
episode's own copy of the tables (`_workplace`; their directory from
`data.per_domain.nemo_gym_workplace.workplace_db` or
$CASCADE_JAX_WORKPLACE_DB), rewarded 1 when the tables end as the ground
truth's calls leave them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
import threading

from cascade_jax import envs
from cascade_jax.domains import _base
from cascade_jax.domains import _if_registry
from cascade_jax.domains import _workplace
from cascade_jax.domains import nemo_gym
from cascade_jax.sandbox import Sandbox

NAME = 'nemo_gym'
# Rows played as episodes: a Python session (domain `nemo_gym_python`), a
# workplace's tables (`nemo_gym_workplace`).
PYTHON_NAME = 'nemo_gym_python'
WORKPLACE_NAME = 'nemo_gym_workplace'
EPISODE_DOMAINS = {'stateful_python': PYTHON_NAME,
                   'workplace': WORKPLACE_NAME}
# The domains that read data.files / data.eval_files (each its own rows).
FILE_DOMAINS = (NAME, PYTHON_NAME, WORKPLACE_NAME)
_LOCK = threading.Lock()
_SANDBOX: Sandbox | None = None


def record(row: nemo_gym.Row) -> dict:
  """A row as a record of this domain."""
  key = json.dumps(row.messages, sort_keys=True)
  return dict(id=hashlib.sha256(key.encode()).hexdigest()[:16],
              domain=EPISODE_DOMAINS.get(row.kind, NAME),
              messages=row.messages, kind=row.kind, source=row.where,
              **row.fields)


@functools.lru_cache(maxsize=8)
def _read(files: str) -> tuple[dict, ...]:
  """The records of comma-separated JSONL files, checked, in file order;
  a prompt seen before is kept once."""
  paths = [p.strip() for p in files.split(',') if p.strip()]
  if not paths:
    raise ValueError(f'{NAME}: data.files names no file (comma-separated '
                     'NeMo-Gym JSONL files)')
  out, seen = [], set()
  for path in paths:
    for row in nemo_gym.read_rows(os.path.expanduser(path)):
      if row.kind == 'instruction_following':
        bad = _if_registry.unknown_ids(row.fields['instruction_id_list'],
                                       row.fields['kwargs'])
        if bad:
          raise nemo_gym.RowError(
              f'{row.where}: instructions that cannot be checked here: {bad}')
      rec = record(row)
      if rec['id'] not in seen:
        seen.add(rec['id'])
        out.append(rec)
  return tuple(out)


def _generate(name: str, *, split: str, n: int, seed: int,
              files: str = '', eval_files: str = '',
              eval_fraction: float = 0.1, levels=None,
              split_by: str = 'prompt', **options) -> list[dict]:
  """Up to n records of a split (all of it when n is larger), in an order
  drawn with seed: the rows of domain `name` (each kind its domain)."""
  del levels, split_by        # the rows have no levels; split by prompt
  if set(options) - ({'workplace_db'} if name == WORKPLACE_NAME else set()):
    raise ValueError(f'{name}: unknown data options {sorted(options)}')
  if split not in ('train', 'eval'):
    raise ValueError(f"{name}: split must be 'train' or 'eval', got {split!r}")
  if split == 'eval' and eval_files:
    recs = list(_read(eval_files))
  else:
    recs = [r for r in _read(files) if eval_files or
            _base.split_of(r['id'], eval_fraction) == split]
  other = sorted({r['domain'] for r in recs} - {name})
  n_other = sum(r['domain'] != name for r in recs)
  recs = [r for r in recs if r['domain'] == name]
  if not recs:
    raise ValueError(
        f'{name}: no {split} rows in {eval_files or files} '
        f'(eval_fraction={eval_fraction})' + (
            f'; its {n_other} rows are for domain {", ".join(other)}'
            if other else ''))
  random.Random(seed).shuffle(recs)
  extra = {}
  if name == WORKPLACE_NAME:         # the tables, found and read now
    extra['workplace_db'] = _workplace.find_db(options.get('workplace_db', ''))
    _workplace.load(extra['workplace_db'])
  return [dict(r, **extra) for r in recs[:n]]


generate = functools.partial(_generate, NAME)
generate_python = functools.partial(_generate, PYTHON_NAME)
generate_workplace = functools.partial(_generate, WORKPLACE_NAME)


def _sandbox() -> Sandbox:
  global _SANDBOX
  with _LOCK:
    if _SANDBOX is None:
      _SANDBOX = Sandbox(nemo_gym.TEST_LIMITS)
    return _SANDBOX


def verify(records, responses, *, sandbox=None) -> list[_base.Score]:
  out: list[_base.Score | None] = [None] * len(records)
  n_code = sum(r['kind'] == 'code' for r in records)
  box = (sandbox or _sandbox()) if n_code else None

  def finish(i, reward, details, extra=None):
    if extra:          # instruction following: one verdict an instruction
      ok = extra['follow_instruction_list']
      details = dict(details, checks=list(zip(
          records[i]['instruction_id_list'], ok)))
    out[i] = _base.Score(reward, reward == 1.0, details)

  nemo_gym.reward_all([(r['kind'], r) for r in records], responses,
                      sandbox=box, workers=min(n_code, box.workers if box
                                               else 1), finish=finish)
  return out  # type: ignore[return-value]


_PY_LOCK = threading.Lock()
_PY_SANDBOX: list[Sandbox] = []


def _python_sandbox() -> Sandbox:
  with _PY_LOCK:
    if not _PY_SANDBOX:
      _PY_SANDBOX.append(Sandbox(envs.PYTHON_LIMITS))
    return _PY_SANDBOX[0]


_CALL_BLOCK = re.compile(re.escape(envs.TOOL_START) + '.*?' +
                         re.escape(envs.TOOL_END), re.S)


class PythonMathEnv:
  """A stateful-Python math row (NeMo-Gym's ns_tools) as an episode.

  Each `stateful_python_code_exec` call runs in the episode's
  `envs.PythonSession` (in the sandbox) and its output is the observation;
  the first message without a call ends the episode. Its reward is the
  row's math verdict (`nemo_gym.math_reward`, as NeMo-Gym's math server
  gives it) on the episode's assistant text (every message, calls and
  thoughts removed): as that server reads a rollout's `message` items.
  An episode cut by the turn or token budget earns 0 (NeMo-Gym's agent
  would still verify what was written).
  """

  def __init__(self, sandbox: Sandbox):
    self.sandbox = sandbox
    self.session = envs.PythonSession(sandbox)
    self.record: dict | None = None
    self.texts: list[str] = []

  def reset(self, record: dict) -> list[dict]:
    self.record, self.texts = record, []
    self.session = envs.PythonSession(self.sandbox)   # a fresh session
    self.toolbox = envs.Toolbox([envs.Tool(
        envs.PYTHON_TOOL, (('code', str),), self.session.run,
        'Python code, run in a stateful session')])
    return list(record['messages'])

  def step(self, assistant: str) -> envs.Step:
    if self.record is None:
      raise RuntimeError('PythonMathEnv.step before reset')
    text = _base.strip_think(assistant)
    try:
      calls = envs.parse_tool_calls(text)
    except envs.ToolCallError as e:
      return envs.Step((envs.tool_message(f'error: {e}'),))
    self.texts.append(_CALL_BLOCK.sub('', text))
    if not calls:
      reward, details = nemo_gym.math_reward(self.record['expected_answer'],
                                             ''.join(self.texts))
      return envs.Step(reward=reward, done=True, info=dict(
          details, passed=reward == 1.0, calls=self.session.calls,
          timeouts=self.session.timeouts))
    return envs.Step(self.toolbox.answer(calls))


def make_python_env(record: dict, sandbox=None) -> PythonMathEnv:
  """The episode's environment. Its calls run in a sandbox of their own
  (`envs.PYTHON_LIMITS`: NeMo-Skills' 10 s a call), not the episodes'
  shared tool sandbox (5 s)."""
  del record, sandbox
  return PythonMathEnv(_python_sandbox())


def _plain(obj):
  """A tool's output with pandas' missing values (NaN) as JSON nulls."""
  if isinstance(obj, dict):
    return {str(k): _plain(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_plain(v) for v in obj]
  if isinstance(obj, float) and obj != obj:
    return None
  return obj


class WorkplaceEnv:
  """A workplace-assistant row (WorkBench) as an episode.

  Each call (`<tool_call>{"name", "arguments"}</tool_call>`, at most
  `envs.MAX_CALLS_PER_TURN` a message) runs on the episode's own copy of
  the tables; its output (JSON) or the reference's error text is the
  observation. The first message without a call ends the episode; its
  reward is the reference's verdict on the calls made (`_workplace`): the
  tables they leave against the ground truth's. The tools are deterministic
  functions over the tables (no model code runs), as `envs` tools are.
  """

  def __init__(self):
    self.record: dict | None = None
    self.calls = self.failed = 0

  def reset(self, record: dict) -> list[dict]:
    self.record, self.calls, self.failed = record, 0, 0
    self.tables = _workplace.load(record['workplace_db'])
    self.workplace = _workplace.Workplace(self.tables)
    return list(record['messages'])

  def _run(self, call: envs.ToolCall) -> str:
    self.calls += 1
    try:
      out = self.workplace.run(call.name, call.arguments)
    except Exception as e:  # pylint: disable=broad-except
      self.failed += 1
      return f"Error executing tool '{call.name}': {e}"   # as the reference
    return envs.cap(json.dumps(_plain(out), default=str),
                    envs.MAX_OUTPUT_CHARS)

  def step(self, assistant: str) -> envs.Step:
    if self.record is None:
      raise RuntimeError('WorkplaceEnv.step before reset')
    try:
      calls = envs.parse_tool_calls(_base.strip_think(assistant))
    except envs.ToolCallError as e:
      return envs.Step((envs.tool_message(f'error: {e}'),))
    if not calls:      # the tables this episode's calls left, judged
      reward, details = _workplace.judge(
          self.workplace, self.record['ground_truth'], self.tables,
          calls=self.calls, failed_calls=self.failed)
      return envs.Step(reward=reward, done=True,
                       info=dict(details, passed=reward == 1.0))
    return envs.Step(envs.answer_calls(calls, self._run))


def make_workplace_env(record: dict, sandbox=None) -> WorkplaceEnv:
  del record, sandbox
  return WorkplaceEnv()


DOMAIN = _base.Domain(
    name=NAME, generate=generate, verify=verify,
    required_fields=('kind',), needs_sandbox=True, from_files=True,
    description='NeMo-Gym RL rows (math, code, instruction following, '
                'structured output) from '
                'data.files')


PYTHON_DOMAIN = _base.Domain(
    name=PYTHON_NAME, generate=generate_python,
    verify=_base.episode_only(PYTHON_NAME), env=make_python_env,
    required_fields=('kind', 'expected_answer'), needs_sandbox=True,
    from_files=True,
    episode_limits=dict(max_turns=4, max_new_tokens=128,
                        max_observation_tokens=128, max_tokens=1024),
    description='NeMo-Gym math rows with a stateful Python session '
                '(ns_tools: stateful_python_code_exec) from data.files, '
                'played as episodes')


WORKPLACE_DOMAIN = _base.Domain(
    name=WORKPLACE_NAME, generate=generate_workplace,
    verify=_base.episode_only(WORKPLACE_NAME), env=make_workplace_env,
    required_fields=('kind', 'ground_truth', 'workplace_db'),
    needs_sandbox=False, from_files=True,
    # NeMo-Gym's agent gives a task 6 tool-calling steps.
    episode_limits=dict(max_turns=7, max_new_tokens=128,
                        max_observation_tokens=256, max_tokens=2048),
    description='NeMo-Gym workplace-assistant rows (WorkBench: email, '
                'calendar, analytics, project management, CRM tools) from '
                'data.files, played as episodes against the tables of '
                'workplace_db')
