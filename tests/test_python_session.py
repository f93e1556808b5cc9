"""NeMo-Gym's stateful-Python math rows: the session in the sandbox, the episode's environment, the domain."""

import json
import os

import pytest

from cascade_jax import domains
from cascade_jax import envs
from cascade_jax import rollout
from cascade_jax.domains import nemo_gym_rl
from cascade_jax.sandbox import Limits
from cascade_jax.sandbox import Sandbox
import _nemo_gym_helpers  # pylint: disable=g-import-not-at-top

_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data',
                     'nemo_gym')
PROMPTS = os.path.join(_DATA, 'stateful_python.jsonl')


@pytest.fixture(scope='module')
def sandbox():
  # The session's limits, with a short wall clock for the time-out case.
  box = Sandbox(Limits(wall_seconds=3.0, cpu_seconds=3, memory_bytes=1 << 30,
                       processes=16, output_bytes=1 << 20))
  yield box
  box.close()


def _call(code):
  return envs.format_call(envs.PYTHON_TOOL, code=code)


def test_a_session_keeps_its_state_and_answers_as_the_kernel_does(sandbox):
  s = envs.PythonSession(sandbox)
  # (code, answer): stdout then stderr, one trailing newline removed; the
  # last expression's repr unless None or the cell ends with ';'.
  for code, want in [
      ('x = 21\nx * 2', '42'),
      ('print(x + 1)\nx', '22\n21'),
      ('import sys\nprint("out")\nprint("err", file=sys.stderr)', 'out\nerr'),
      ('x;', ''),
      ('None', ''),
      ('y', "NameError: name 'y' is not defined"),
      ('x = 5\n1 / 0', 'ZeroDivisionError: division by zero'),
      ('x', '5'),                         # the failing cell ran up to its error
      ('def f(a):\n  return a * a\n[f(i) for i in range(4)]', '[0, 1, 4, 9]'),
      ('open("t.txt", "w").write("hi")', '2'),
      ('open("t.txt").read()', "'hi'"),   # written again by the replay
      ('if x:\n  pass\nelse', 'SyntaxError: expected \':\''),
  ]:
    assert s.run(code) == want, code
  # A call past the time limit, or one that kills its interpreter, is not
  # part of the state afterwards; the session goes on.
  assert 'past the time limit' in s.run('x = 7\nwhile True: pass')
  assert s.run('x') == '5' and s.timeouts == 1
  assert 'exited with code 3' in s.run('import os\nx = 9\nos._exit(3)')
  assert s.run('x') == '5'
  assert s.run('print("a" * 5000)').endswith('characters cut]')


def test_the_environment_runs_calls_in_the_session_and_scores_the_answer(
    sandbox):
  rec = nemo_gym_rl.generate_python(split='train', n=8, seed=0,
                                    files=PROMPTS, eval_fraction=0.0)
  rec = next(r for r in rec if r['expected_answer'] == '385')
  env = nemo_gym_rl.PythonMathEnv(sandbox)
  convo, step = envs.run_scripted(env, rec, [
      'Summing squares. ' + _call('s = sum(i * i for i in range(1, 11))'),
      _call('s') + _call('s + 1'),
      'So the sum is \\boxed{385}.'])
  assert [m['content'] for m in convo if m['role'] == 'tool'] == [
      '', '385', '386']
  assert step.done and step.reward == 1.0 and step.info['calls'] == 3
  env.reset(rec)                      # a new episode: a new session
  assert env.step(_call('s')).messages[0]['content'] == (
      "NameError: name 's' is not defined")
  # The reward reads the episode's text, calls removed: a boxed answer only
  # inside a call's code is no answer; a wrong one earns 0.
  _, step = envs.run_scripted(nemo_gym_rl.PythonMathEnv(sandbox), rec, [
      _call('print("\\\\boxed{385}")'), 'It is 385.'])
  assert step.done and step.reward == 0.0
  _, step = envs.run_scripted(nemo_gym_rl.PythonMathEnv(sandbox), rec,
                              ['\\boxed{384}'])
  assert step.done and step.reward == 0.0
  # A bad call is an error observation, never an exception.
  env = nemo_gym_rl.PythonMathEnv(sandbox)
  env.reset(rec)
  for reply, says in [
      (envs.format_call('shell', cmd='ls'), "unknown tool 'shell'"),
      (envs.format_call(envs.PYTHON_TOOL), "missing ['code']"),
      ('<tool_call>{"name": </tool_call>', 'not valid JSON')]:
    step = env.step(reply)
    assert not step.done and says in step.messages[0]['content'], says


def test_the_domains_take_their_own_rows_of_a_file(tmp_path):
  mixed = tmp_path / 'mixed.jsonl'
  math_row = {'responses_create_params': {'input': [
      {'role': 'user', 'content': 'What is 2 + 2?'}]}, 'expected_answer': '4'}
  mixed.write_text(open(PROMPTS).read() + json.dumps(math_row) + '\n')
  py = nemo_gym_rl.generate_python(split='train', n=9, seed=0,
                                   files=str(mixed), eval_fraction=0.0)
  plain = nemo_gym_rl.generate(split='train', n=9, seed=0, files=str(mixed),
                               eval_fraction=0.0)
  assert sorted(r['expected_answer'] for r in py) == ['$\\frac{1}{4}$', '15',
                                                      '385']
  assert {r['kind'] for r in py} == {'stateful_python'}
  assert [r['kind'] for r in plain] == ['math']
  # The tools are in the system prompt, as the chat template shows tools.
  assert envs.PYTHON_TOOL in py[0]['messages'][0]['content']
  with pytest.raises(ValueError, match="its 3 rows are for domain "
                     "nemo_gym_python"):
    nemo_gym_rl.generate(split='train', n=9, seed=0, files=PROMPTS,
                         eval_fraction=0.0)
  dom = domains.get('nemo_gym_python')
  assert dom.env is nemo_gym_rl.make_python_env and dom.from_files
  # Its calls get NeMo-Skills' 10 s, not the episodes' shared 5 s sandbox.
  env = dom.env(py[0], Sandbox(envs.TOOL_LIMITS))
  assert env.session.sandbox.limits == envs.PYTHON_LIMITS


@pytest.mark.slow  # ~11 s, not the default (the main job reads no NeMo-Gym rows): CI runs it
def test_episodes_of_python_rows_run_through_the_sampler():
  # The rollout engine plays the rows as episodes with this domain's
  # environment (a random model: no call is expected, each episode ends).
  recs = nemo_gym_rl.generate_python(split='train', n=3, seed=0,
                                     files=PROMPTS, eval_fraction=0.0)
  eps, made = _nemo_gym_helpers.episodes_through_sampler(
      recs, text_repeats=20, max_tokens=512)
  assert {r['domain'] for r in recs} == {'nemo_gym_python'}
  assert len(made) == 3 and all(
      isinstance(e, nemo_gym_rl.PythonMathEnv) for e in made)
  assert len(eps) == 3 and all(e.end in rollout.ENDS for e in eps)
  assert all(e.reward == 0.0 and 1 <= e.turns <= 2 for e in eps)
