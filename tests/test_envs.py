"""Multi-turn environments: scripted models, bad and hostile tool calls, the sandbox around them."""

import collections
import dataclasses
import json
import sys

import pytest

from cascade_jax import data
from cascade_jax import domains
from cascade_jax import envs
from cascade_jax.domains import swe_agent
from cascade_jax.domains import tool_use
from cascade_jax.sandbox import Sandbox

call = envs.format_call


@pytest.fixture(scope='module')
def sb():
  box = Sandbox(envs.TOOL_LIMITS)
  yield box
  box.close()


@pytest.fixture(scope='module')
def tasks():
  return {lv: domains.generate('swe_agent', split='eval', n=3, seed=0,
                               levels=(lv,)) for lv in (1, 2, 3)}


def _play(sb, rec, replies, max_turns=8):
  return envs.run_scripted(swe_agent.make_env(rec, sb), rec, replies,
                           max_turns=max_turns)


def _fix(rec):
  """(old line, fixed line) of the record's bug, from its demonstration."""
  for m in rec['turns']:
    if m['role'] == 'assistant' and '"replace"' in m['content']:
      args = json.loads(m['content'][len('<tool_call>'):-len('</tool_call>')])
      return args['arguments']['old'], args['arguments']['new']
  raise AssertionError('no replace in the demonstration')


@pytest.mark.parametrize('level', [1, 2, 3])
def test_a_scripted_model_solves_an_agentic_swe_task_turn_by_turn(sb, tasks,
                                                                 level):
  for rec in tasks[level]:
    replies = [m['content'] for m in rec['turns'] if m['role'] == 'assistant']
    assert len(replies) == level + 1          # the shortest path per level
    convo, step = _play(sb, rec, replies)
    assert step.done and step.reward == 1.0, convo[-3:]
    # The sandbox's observations are the demonstration's (SFT learns them).
    assert convo[len(rec['messages']):] == rec['turns']


def test_the_visible_tests_report_the_failure_then_the_fix(sb, tasks):
  rec = tasks[3][0]
  old, new = _fix(rec)
  convo, step = _play(sb, rec, [call('run_tests'),
                                call('replace', path=swe_agent.MODULE, old=old,
                                     new=new),
                                call('run_tests')])
  assert not step.done
  first, last = convo[-5]['content'], convo[-1]['content']
  assert 'FAILED: ' in first and '(got ' in first, first
  assert last.startswith('2 passed, 0 failed'), last


def test_a_wrong_fix_or_no_fix_earns_0(sb, tasks):
  rec = tasks[1][0]
  old, _ = _fix(rec)
  wrong = call('replace', path=swe_agent.MODULE, old=old,
               new='return None')
  _, step = _play(sb, rec, [wrong, call('submit')])
  assert step.done and step.reward == 0.0
  _, step = _play(sb, rec, [call('submit')])
  assert step.done and step.reward == 0.0


def test_garbage_gets_error_observations_and_ends_at_the_turn_limit(sb, tasks):
  rec = tasks[2][0]
  garbage = ['hello', '<tool_call>{"name": "read_file", "arguments": '
             '{"path": "pkg/ops.py"}', '<tool_call>not json</tool_call>',
             '<tool_call>[1, 2]</tool_call>',
             call('rm_rf', path='/'), call('read_file'),
             call('read_file', path='pkg/ops.py', mode='w'),
             call('read_file', path=7), call('replace', path='pkg/ops.py',
                                             old='', new='x'),
             call('submit', now=True)]
  convo, step = _play(sb, rec, garbage, max_turns=len(garbage))
  assert not step.done and step.reward == 0.0
  obs = [m['content'] for m in convo if m['role'] == 'tool']
  assert len(obs) == len(garbage)
  assert all(o.startswith('error: ') for o in obs), obs
  for want in ('no tool call', 'unbalanced', 'not valid JSON', 'JSON object',
               "unknown tool 'rm_rf'", "missing ['path']", "unknown ['mode']",
               'must be: string', 'must occur exactly once',
               "unknown ['now']"):
    assert any(want in o for o in obs), (want, obs)


@pytest.mark.parametrize('path', ['../../etc/passwd', '/etc/passwd',
                                  'pkg/../../x', '~/x', 'pkg//ops.py', ''])
def test_paths_outside_the_repository_are_refused(sb, tasks, path):
  rec = tasks[1][0]
  convo, _ = _play(sb, rec, [call('read_file', path=path),
                             call('apply_patch', patch=f'+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n')])
  for m in convo[-3::2]:
    assert m['content'].startswith('error: '), m


def test_edits_are_bounded_and_nothing_survives_the_episode(sb, tasks):
  rec = tasks[1][0]
  old, _ = _fix(rec)
  huge = call('replace', path=swe_agent.MODULE, old=old, new='x' * 20000)
  convo, _ = _play(sb, rec, [huge])
  assert 'longer than 4096 characters' in convo[-1]['content']
  grow = call('replace', path=swe_agent.MODULE, old=old,
              new=old + '  # ' + 'x' * 3000)
  env = swe_agent.make_env(rec, sb)
  convo, _ = envs.run_scripted(env, rec, [grow] * 3 + [
      call('read_file', path=swe_agent.MODULE)])
  assert 'would exceed 8192 characters' in convo[-3]['content']
  assert 'more characters cut' in convo[-1]['content']   # output capped
  assert env.ws.files[swe_agent.MODULE].count('x' * 3000) == 2   # undone
  # An edit in one episode is gone in the next one on the same record.
  edit = call('replace', path=swe_agent.MODULE, old=old, new='return 0')
  _play(sb, rec, [edit])
  convo, _ = _play(sb, rec, [call('read_file', path=swe_agent.MODULE)])
  assert convo[-1]['content'] == rec['files'][swe_agent.MODULE]
  assert rec['files'][swe_agent.MODULE].count(old) == 1


def _hostile(rec, body):
  old, _ = _fix(rec)
  return call('replace', path=swe_agent.MODULE, old=old,
              new=body.replace('\n', '\n    '))


def test_code_that_hangs_or_floods_is_cut_by_the_sandbox(sb, tasks):
  rec = tasks[1][0]
  # Under the tool limits (4 s of CPU, 5 s of wall clock) a busy loop on a
  # loaded host (CI runs two workers on two cores) may meet either limit
  # first; both stop it.  Which limit fires is checked below with a wall
  # clock that cannot come first.
  for body, want in (('while True: pass', 'error: the tests were stopped: '),
                     ("print('x' * 10**6)\nreturn 0", 'more characters cut'),
                     ('import os\nwhile True: os.fork()', ''),
                     ('import time\ntime.sleep(60)', 'wall-clock limit'),
                     ("x = bytearray(2 << 30)", 'MemoryError')):
    convo, _ = _play(sb, rec, [_hostile(rec, body), call('run_tests')])
    out = convo[-1]['content']
    assert len(out) < 1000, out[:200]
    assert want in out, out[:300]
  # Submitted, the hidden tests meet the same limits: no reward (one body
  # of the five: the others stop the same way, as run_tests shows).
  _, step = _play(sb, rec, [_hostile(rec, 'while True: pass'), call('submit')])
  assert step.done and step.reward == 0.0
  slow_clock = Sandbox(dataclasses.replace(envs.TOOL_LIMITS, cpu_seconds=1,
                                            wall_seconds=60.0))
  try:
    convo, _ = _play(slow_clock, rec, [_hostile(rec, 'while True: pass'),
                                       call('run_tests')])
  finally:
    slow_clock.close()
  assert convo[-1]['content'] == (
      'error: the tests were stopped: CPU time limit (1 s)')


def test_code_cannot_reach_the_network_or_the_trainers_files(sb, tasks, tmp_path):
  rec = tasks[1][0]
  secret = tmp_path / 'secret.txt'
  secret.write_text('keep')
  body = ('import socket, os\n'
          'try:\n'
          "    socket.create_connection(('1.1.1.1', 53), timeout=1)\n"
          "    print('NETWORK OPEN')\n"
          'except OSError as e:\n'
          "    print('network refused')\n"
          'try:\n'
          f"    open({str(secret)!r}, 'w').write('gone')\n"
          "    print('WROTE')\n"
          'except OSError:\n'
          "    print('write refused')\n"
          'return 0')
  convo, _ = _play(sb, rec, [_hostile(rec, body), call('run_tests')])
  out = convo[-1]['content']
  assert 'NETWORK OPEN' not in out and 'WROTE' not in out, out
  assert secret.read_text() == 'keep'


@pytest.mark.parametrize('level', [1, 2, 3])
def test_tool_use_runs_the_calls_and_verifies_the_answer(level):
  for rec in domains.generate('tool_use', split='eval', n=4, seed=0,
                              levels=(level,)):
    replies = [m['content'] for m in rec['turns'] if m['role'] == 'assistant']
    convo, step = envs.run_scripted(tool_use.make_env(rec), rec, replies)
    assert step.done and step.reward == 1.0, convo
    assert len(replies) == (3 if level == 3 else 2)
    # A wrong final answer, and an answer without a box, earn 0.
    _, step = envs.run_scripted(tool_use.make_env(rec), rec,
                                replies[:-1] + ['\\boxed{-999}'])
    assert step.done and step.reward == 0.0
    _, step = envs.run_scripted(tool_use.make_env(rec), rec,
                                replies[:-1] + [rec['answer']])
    assert step.reward == 0.0


def test_tool_use_errors_are_observations():
  rec = domains.generate('tool_use', split='eval', n=1, seed=0,
                         levels=(1,))[0]
  bad = [call('get_weather', city='Atlantis'), call('add', a='1', b=2),
         call('add', a=True, b=2), call('convert', amount=1, unit_from='km',
                                        unit_to='parsec'),
         '<tool_call>{"name": "add"</tool_call>']
  convo, step = envs.run_scripted(tool_use.make_env(rec), rec, bad)
  assert not step.done
  obs = [m['content'] for m in convo if m['role'] == 'tool']
  assert all(o.startswith('error: ') for o in obs) and len(obs) == 5, obs
  assert 'cities:' in obs[0] and 'must be: number' in obs[1]
  assert 'must be: number' in obs[2] and 'km->mi' in obs[3]


@pytest.mark.parametrize('reply, says', [
    (call('multiply', a=1e308, b=10.0), 'multiply failed: OverflowError'),
    (call('convert', amount=1e308, unit_from='c', unit_to='f'),
     'convert failed'),
    ('<tool_call>{"name": "add", "arguments": {"a": NaN, "b": 1}}</tool_call>',
     'non-finite number (NaN)'),
    ('<tool_call>{"name": "add", "arguments": {"a": -Infinity, "b": 1}}'
     '</tool_call>', 'non-finite number (-Infinity)'),
    # Past float's range: parsed as infinity unless checked.
    ('<tool_call>{"name": "add", "arguments": {"a": 1e999, "b": 1}}'
     '</tool_call>', 'non-finite number (1e999)'),
    ('<tool_call>{"name": "add", "arguments": {"a": -2.5E+400, "b": 1}}'
     '</tool_call>', 'non-finite number (-2.5E+400)'),
    ('<tool_call>' + '[' * 2000 + ']' * 2000 + '</tool_call>',
     'nested too deeply'),
    (call('get_weather', city='x' * 3000), 'more characters cut'),
])
def test_arguments_that_break_a_tool_are_its_error_observation(reply, says):
  rec = domains.generate('tool_use', split='eval', n=1, seed=0)[0]
  env = tool_use.make_env(rec)
  env.reset(rec)
  step = env.step(reply)
  (obs,) = [m['content'] for m in step.messages]
  assert not step.done and obs.startswith('error: ') and says in obs, obs
  assert len(obs) <= envs.MAX_OUTPUT_CHARS + 64


def test_multi_turn_domains_refuse_single_reply_scoring():
  rec = domains.generate('tool_use', split='eval', n=1, seed=0)[0]
  with pytest.raises(ValueError, match='multi-turn domain'):
    domains.score([rec], ['\\boxed{1}'])


def test_a_single_turn_domain_as_an_environment_scores_like_its_verifier():
  recs = domains.generate('multi_domain', split='eval', n=6, seed=0)
  for r in recs:
    env = envs.SingleTurn(domains.get('multi_domain').verify)
    assert env.reset(r) == r['messages']
    step = env.step(r['response'])
    want = domains.score([r], [r['response']])[0]
    assert step.done and step.reward == want.reward == 1.0


def test_sft_encodes_a_demonstration_as_the_episode_tokens():
  recs = domains.generate('tool_use', split='train', n=4, seed=0, levels=(3,))
  tok = data.train_tokenizer(
      [m['content'] for r in recs for m in r['messages'] + r['turns']] * 5,
      200)
  r = recs[0]
  ex = data.encode_conversation(tok, r['messages'], r['turns'])
  ids = list(ex['inputs']) + [ex['targets'][-1]]
  # prompt, reply + im_end, observation (appended), reply, ...
  want = data.encode_prompt(tok, r['messages'])
  learn = [0] * len(want)
  for m in r['turns']:
    piece = (tok.encode(m['content']) + [tok.im_end]
             if m['role'] == 'assistant' else
             data.encode_observation(tok, [m]))
    want += piece
    learn += [int(m['role'] == 'assistant')] * len(piece)
  assert ids == want
  assert list(ex['mask']) == learn[1:]
  with pytest.raises(ValueError, match='ends with an assistant turn'):
    data.encode_conversation(tok, r['messages'], r['turns'][:-1])


@pytest.mark.parametrize('name', ['swe_agent', 'tool_use'])
def test_flawed_demonstrations_fail_in_the_real_environment(sb, name):
  # SFT's imperfect data for the multi-turn domains: a flawed episode (a
  # submit without the fix; a wrong final number) earns 0 when replayed in
  # the sandboxed environment, every other one 1, and the neighbour in
  # swe_agent's module never holds the buggy line (the fix names one place).
  recs = domains.generate(name, split='train', n=24, seed=3, levels=(1, 2, 3),
                          response_quality=0.5)
  flawed = [r for r in recs if r.get('flawed')]
  assert 0 < len(flawed) < len(recs)
  env = domains.get(name).env
  for rec in recs:
    replies = [m['content'] for m in rec['turns'] if m['role'] == 'assistant']
    convo, step = envs.run_scripted(env(rec, sb), rec, replies)
    assert step.done and step.reward == (0.0 if rec.get('flawed') else 1.0), (
        rec['id'], convo[-3:])
    assert convo[len(rec['messages']):] == rec['turns']


def test_swe_agent_demonstrations_run_in_the_sandbox_not_the_trainer(
    monkeypatch):
  # The repositories' code ran in this process with exec,
  # changing sys.modules, sys.path and stdout for every thread. A repository
  # that marks the process it runs in: this one stays unmarked, and the
  # demonstrations (the visible tests' report at level 3 included) are the
  # environment's.
  import builtins  # pylint: disable=g-import-not-at-top
  make = swe_agent._make

  def marked(rng, level):
    key, rec = make(rng, level)
    files = dict(rec['files'])
    files['pkg/__init__.py'] += 'import builtins\nbuiltins.cascade_jax_ran = 1\n'
    return key, dict(rec, files=files)

  monkeypatch.setattr(swe_agent, '_make', marked)
  recs = domains.generate('swe_agent', split='train', n=6, seed=0,
                          levels=(3,), response_quality=0.5)
  assert not hasattr(builtins, 'cascade_jax_ran')
  assert not any(m == 'pkg' or m.startswith('pkg.') for m in sys.modules)
  report = [m['content'] for r in recs for m in r['turns'] if m['role'] == 'tool'
            and 'passed' in m['content']]
  assert len(report) == len(recs), [r['turns'] for r in recs]


def test_a_failed_demonstration_batch_is_named(monkeypatch):
  # A batch program that exits 3 (a time limit of 0.05 s was flaky: an idle
  # machine ran the batch within it). The code domain's verdict cache starts
  # empty, so the batch runs whatever earlier tests judged.
  from cascade_jax.domains import code  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(code, '_VERDICTS', collections.OrderedDict())
  monkeypatch.setattr(swe_agent, '_BATCH', 'raise SystemExit(3)  # {jobs}')
  recs = swe_agent._base.sample(
      swe_agent._make, domain='swe_agent', split='train', n=2, seed=0,
      levels=(1,))
  with pytest.raises(RuntimeError, match=r'2 demonstration runs failed in '
                     r'the sandbox \(.*exit 3\)'):
    swe_agent.demonstrations(recs, Sandbox(swe_agent.DEMO_LIMITS))
