"""Domains: generators, verifiers, the record format and the loader."""

import json
import re

import numpy as np
import pytest

from cascade_jax import domains
from cascade_jax.domains import _base
from cascade_jax.domains import instruction_following as ifd
from cascade_jax.domains import swe

ALL = domains.names()
FAST = [d for d in ALL if not domains.get(d).needs_sandbox]
# Multi-turn domains are environments: a single reply is not scored (their
# demonstrations and flaws are checked in tests/test_envs.py).
SINGLE_TURN = [d for d in ALL if domains.get(d).env is None]


def test_registry_has_one_domain_per_recipe_stage():
  assert set(ALL) == {'instruction_following', 'multi_domain', 'math', 'code',
                      'long_context', 'swe', 'swe_agent', 'tool_use',
                      'preference'}
  assert set(domains.names(from_files=True)) == set(ALL) | {
      'nemo_gym', 'nemo_gym_python', 'nemo_gym_workplace'}
  with pytest.raises(ValueError, match="unknown domain 'chess'"):
    domains.get('chess')


@pytest.mark.parametrize('name', ALL)
def test_generator_is_seeded_sized_and_split_disjoint(name):
  n = 40 if name in FAST else 12
  a = domains.generate(name, split='train', n=n, seed=3)
  b = domains.generate(name, split='train', n=n, seed=3)
  c = domains.generate(name, split='train', n=n, seed=4)
  ev = domains.generate(name, split='eval', n=n, seed=3)
  assert a == b and a != c and len(a) == n
  assert len({r['id'] for r in a}) == n
  if domains.get(name).env is None:
    problem = domains.prompt_of
  else:
    # An environment's problem is its hidden state as well as its prompt (the
    # same question about another day's weather, another repository).
    problem = lambda r: json.dumps(
        {k: v for k, v in r.items() if k not in ('id', 'turns', 'flawed')},
        sort_keys=True)
  train_problems = {problem(r) for r in a + c}
  if name != 'preference':  # pairs, not prompts, are the unit there
    assert not train_problems & {problem(r) for r in ev}
  for r in a + ev:
    domains.validate(r)  # generated records follow the documented format


@pytest.mark.parametrize('name', SINGLE_TURN)
def test_reference_responses_pass_and_wrong_ones_fail(name):
  n = 30 if name in FAST else 10
  recs = domains.generate(name, split='eval', n=n, seed=1)
  good = domains.score(recs, [r['response'] for r in recs])
  assert all(s.passed and s.reward == 1.0 for s in good)
  empty = domains.score(recs, [''] * n)
  assert not any(s.passed for s in empty)
  # Another record's answer is (almost always) wrong.
  shifted = domains.score(recs, [r['response'] for r in recs[1:] + recs[:1]])
  assert sum(s.passed for s in shifted) <= n // 3


FLAWED = ['instruction_following', 'multi_domain', 'math', 'long_context',
          'code', 'swe']


@pytest.mark.parametrize('name', FLAWED)
def test_flawed_responses_fail_and_leave_the_problems_unchanged(name):
  n = 60 if name in FAST else 16
  clean = domains.generate(name, split='train', n=n, seed=2)
  mixed = domains.generate(name, split='train', n=n, seed=2,
                           response_quality=0.5)
  # The same problems, only some reference responses differ.
  strip = lambda r: {k: v for k, v in r.items() if k not in
                     ('response', 'flawed')}
  assert [strip(r) for r in clean] == [strip(r) for r in mixed]
  flawed = [r for r in mixed if r.get('flawed')]
  assert n // 5 <= len(flawed) <= 4 * n // 5
  for r in mixed:
    domains.validate(r)
  scores = domains.score(flawed, [r['response'] for r in flawed])
  # Code's usual bug can be invisible to a few inputs; the rest always fail.
  assert sum(s.passed for s in scores) <= (len(flawed) // 4
                                           if name == 'code' else 0)
  ok = [r for r in mixed if not r.get('flawed')]
  assert all(s.passed for s in domains.score(ok, [r['response'] for r in ok]))


def test_response_quality_is_checked():
  with pytest.raises(ValueError, match='response_quality must be in'):
    domains.generate('long_context', split='train', n=4, response_quality=2)
  make = lambda rng, level: ('k', dict(messages=[], response='r'))
  with pytest.raises(ValueError, match='toy: this domain has no flawed'):
    _base.sample(make, domain='toy', split='train', n=1, seed=0, levels=(1,),
                 response_quality=0.5)


@pytest.mark.parametrize('name', FAST)
def test_levels_are_honoured(name):
  recs = domains.generate(name, split='train', n=30, seed=0, levels=(2,))
  assert {r['level'] for r in recs} == {2}


def test_split_by_prompt_shares_problems_but_not_prompts():
  kw = dict(seed=0, levels=(1,), split_by='prompt')
  tr = domains.generate('math', split='train', n=300, **kw)
  ev = domains.generate('math', split='eval', n=50, **kw)
  assert not {domains.prompt_of(r) for r in tr} & {domains.prompt_of(r)
                                                   for r in ev}
  assert {r['answer'] for r in tr} & {r['answer'] for r in ev}
  with pytest.raises(ValueError, match='split_by'):
    domains.generate('math', split='eval', n=1, split_by='answer')


@pytest.mark.parametrize('level', [1, 2, 3, 4, 5])
def test_math_references_are_right_and_levels_1_to_3_count(level):
  recs = domains.generate('math', split='train', n=200, seed=3,
                          levels=(level,), split_by='prompt')
  scores = domains.get('math').verify(recs, [r['response'] for r in recs])
  assert all(s.passed for s in scores)
  for r in recs:
    think = re.search(r'<think>(.*)</think>', r['response'])
    assert (think is not None) == (level <= 3), r
    if level <= 3:
      # The count: consecutive numbers, one step each, ending on the
      # answer (its numerator for a fraction).
      steps = [int(x) for x in think.group(1).split(':')[1].split(',')]
      assert all(abs(b - a) == 1 for a, b in zip(steps, steps[1:]))
      assert len(steps) <= 4
      boxed = _base.last_boxed(r['response'])
      assert str(steps[-1]) == boxed.split('/')[0]
  with pytest.raises(ValueError, match='no level 6'):
    domains.generate('math', split='train', n=1, seed=0, levels=(6,))


def test_exhausted_problem_space_is_a_clear_error():
  with pytest.raises(ValueError, match='found only .* distinct'):
    domains.generate('math', split='eval', n=500, seed=0, levels=(2,))


@pytest.mark.parametrize('gold, pred, ok', [
    ('1/2', '0.5', True), ('1/2', r'\frac{1}{2}', True), ('3/4', '0.75', True),
    ('12', '12', True), ('12', '12.0', True), ('12', '13', False),
    ('3/4', '4/3', False), ('-3', '-3', True),
])
def test_math_accepts_equivalent_forms(gold, pred, ok):
  rec = dict(id='m', domain='math', messages=[], answer=gold)
  (s,) = domains.get('math').verify([rec], [f'<think>try</think> \\boxed{{{pred}}}'])
  assert s.passed is ok


@pytest.mark.parametrize('response, answer', [
    ('<think>a</think> x <think>b</think> y', 'x  y'),
    ('x <think>a', 'x'),                        # unclosed: nothing after
    ('<think>a <think> b</think> c', 'c'),      # a block ends at its first close
    ('x </think> y', 'x </think> y'),
    ('no thought', 'no thought'),
])
def test_strip_think(response, answer):
  assert _base.strip_think(response) == answer


def test_strip_think_is_linear_in_a_flood_of_unclosed_tags():
  # The lazy regex it replaced took 0.63 s on 28 kB here and grew as the
  # square: 120 kB of tags took 17 s. One pass takes milliseconds; the
  # alarm fails the test well before a quadratic scan would end.
  import signal  # pylint: disable=g-import-not-at-top
  def timeout(*_):
    raise TimeoutError('strip_think took over 3 s on 120 kB')
  old = signal.signal(signal.SIGALRM, timeout)
  signal.alarm(3)
  try:
    assert _base.strip_think('answer <think>' + '<think>' * 17_000) == 'answer'
    assert _base.strip_think('<think>' * 17_000 + '</think>ok') == 'ok'
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_math_needs_a_boxed_answer():
  rec = dict(id='m', domain='math', messages=[], answer='4')
  (s,) = domains.get('math').verify([rec], ['the answer is 4'])
  assert not s.passed and s.details['reason']


@pytest.mark.parametrize('c, text, ok', [
    (dict(type='word_count', relation='exactly', n=3), 'one two three', True),
    (dict(type='word_count', relation='at_most', n=2), 'one two three', False),
    (dict(type='word_count', relation='at_least', n=3), "it's a b", True),
    (dict(type='lowercase'), 'all small', True),
    (dict(type='lowercase'), 'Not small', False),
    (dict(type='uppercase'), 'BIG ONE', True),
    (dict(type='include', word='sun'), 'the Sun is up', True),
    (dict(type='exclude', word='sun'), 'sunny day', True),
    (dict(type='start_with', word='yes'), 'Yes, it is', True),
    (dict(type='end_with', word='now'), 'do it now.', True),
    (dict(type='bullets', n=2), '- a\n- b', True),
    (dict(type='bullets', n=2), '- a\n* b', False),
    (dict(type='json_keys', keys=['a']), '{"a": 1, "b": 2}', True),
    (dict(type='json_keys', keys=['a']), '[1]', False),
])
def test_instruction_constraints_by_hand(c, text, ok):
  assert ifd.check(c, text) is ok


def test_instruction_reward_is_fraction_met():
  rec = dict(id='i', domain='instruction_following', messages=[],
             constraints=[dict(type='lowercase'),
                          dict(type='word_count', relation='exactly', n=2)])
  (s,) = domains.get('instruction_following').verify([rec], ['three words here'])
  assert s.reward == 0.5 and not s.passed


def test_instruction_scores_break_down_by_constraint_kind():
  rec = lambda i, cs: dict(id=i, domain='instruction_following', messages=[],
                           constraints=cs, topic='cats')
  low = dict(type='lowercase')
  two = dict(type='word_count', relation='exactly', n=2)
  recs = [rec('a', [low, two]), rec('b', [low]), rec('c', [two])]
  scores = domains.evaluate(recs, ['soft paws', 'Soft paws', 'soft paws here'])
  s = scores['instruction_following']
  assert dict(s.by_check) == {'lowercase': 0.5, 'word_count:exactly': 0.5,
                              'topic': 1.0}
  assert s.pass_rate == 1 / 3
  # The RL stage's 'passed' reward: all constraints met, else 0.
  from cascade_jax.rl import _collect  # pylint: disable=g-import-not-at-top
  texts = ['soft paws', 'Soft paws', 'soft paws here']
  np.testing.assert_allclose(_collect.verifier_rewards(recs, texts),
                             [1.0, 0.5, 0.5], rtol=1e-6)
  np.testing.assert_array_equal(
      _collect.verifier_rewards(recs, texts, passed=True), [1.0, 0.0, 0.0])


def test_multi_domain_formats():
  v = domains.get('multi_domain').verify
  mcq = dict(id='q', domain='multi_domain', messages=[], kind='mcq', answer='C')
  tool = dict(id='t', domain='multi_domain', messages=[], kind='tool_call',
              answer=dict(name='add', arguments=dict(a=3, b=4)))
  st = dict(id='s', domain='multi_domain', messages=[], kind='structured',
            answer=dict(name='Ada', age=31))
  scores = v([mcq, mcq, mcq, tool, tool, st, st, st], [
      r'\boxed{C}', 'Answer: C', r'\boxed{B}',
      '<tool_call>{"name": "add", "arguments": {"b": 4, "a": 3.0}}</tool_call>',
      '<tool_call>{"name": "add", "arguments": {"a": 4, "b": 3}}</tool_call>',
      '{"name": "ada", "age": 31}', '{"name": "Ada", "age": 30}', 'Ada, 31'])
  assert [s.passed for s in scores] == [True, True, False, True, False, True,
                                        False, False]
  assert scores[6].reward == 0.5


def test_multi_domain_kinds_reweight_the_mix():
  recs = domains.generate('multi_domain', split='train', n=200, seed=0,
                          levels=(1, 2), kinds={'structured': 1.0})
  assert {r['kind'] for r in recs} == {'structured'}
  mixed = domains.generate('multi_domain', split='train', n=300, seed=0,
                           levels=(2,), kinds={'tool_call': 1, 'mcq': 1})
  counts = {k: sum(r['kind'] == k for r in mixed) for k in ('tool_call', 'mcq')}
  assert min(counts.values()) > 100, counts
  for bad in ({'essay': 1.0}, {'mcq': 0.0}, {'mcq': -1.0}):
    with pytest.raises(ValueError, match='multi_domain: kinds'):
      domains.generate('multi_domain', split='train', n=1, kinds=bad)


def test_long_context_length_is_configurable():
  short = domains.generate('long_context', split='train', n=5, seed=0,
                           levels=(1,))
  long = domains.generate('long_context', split='train', n=5, seed=0,
                          context_chars=4000)
  avg = lambda rs: sum(len(domains.prompt_of(r)) for r in rs) / len(rs)
  assert avg(short) < 400 < 4000 <= avg(long)


def test_long_context_kinds_and_keys():
  from cascade_jax.domains import long_context as lc
  recs = domains.generate('long_context', split='train', n=60, seed=0,
                          kinds=('has',))
  assert {r['kind'] for r in recs} == {'has'}
  assert {r['answer'] for r in recs} == {'yes', 'no'}
  for r in recs:   # the answer is whether the asked key heads a record
    key = domains.prompt_of(r).split('record for ')[1].split('?')[0]
    assert (f'\n{key}: ' in domains.prompt_of(r)) == (r['answer'] == 'yes')
  words = domains.generate('long_context', split='train', n=5, seed=0,
                           kinds=('lookup',))
  assert all(domains.prompt_of(r).split('value of ')[1][:-1] in lc.KEY_WORDS
             for r in words)
  rand = domains.generate('long_context', split='train', n=5, seed=0,
                          kinds=('lookup',), keys='random')
  assert all(len(domains.prompt_of(r).split('value of ')[1][:-1]) == 3
             for r in rand)
  with pytest.raises(ValueError, match='kinds must be drawn from'):
    domains.generate('long_context', split='train', n=1, kinds=('sum',))


def test_swe_accepts_a_unified_diff_and_rejects_bad_ones():
  rec = domains.generate('swe', split='eval', n=1, seed=0)[0]
  buggy, fixed = rec['buggy_code'].splitlines(), rec['response'].splitlines()
  diff = ('--- a/solution.py\n+++ b/solution.py\n@@ -1,2 +1,2 @@\n'
          f' {buggy[0]}\n-{buggy[1]}\n+{fixed[1]}\n')
  assert swe.apply_unified_diff(rec['buggy_code'], diff) == rec['response']
  stale = diff.replace(f'-{buggy[1]}', '-    return 42')
  with pytest.raises(swe.PatchError, match='does not match'):
    swe.apply_unified_diff(rec['buggy_code'], stale)
  s = domains.score([rec] * 4, [diff, f'```diff\n{diff}```', stale,
                                rec['buggy_code']])
  assert [x.passed for x in s] == [True, True, False, False]


def test_preference_pairs_encode_a_consistent_taste():
  recs = domains.generate('preference', split='train', n=200, seed=0)
  v = domains.get('preference').verify
  chosen = v(recs, [r['chosen'] for r in recs])
  rejected = v(recs, [r['rejected'] for r in recs])
  assert all(c.reward > r.reward for c, r in zip(chosen, rejected))


# ------------------------------------------------------------ the loader


def _write(tmp_path, rows):
  p = tmp_path / 'data.jsonl'
  p.write_text('\n'.join(r if isinstance(r, str) else json.dumps(r)
                         for r in rows) + '\n')
  return str(p)


GOOD = dict(id='a1', domain='math', prompt='What is 2 + 2?', answer='4')


def test_user_jsonl_loads_with_prompt_shorthand(tmp_path):
  recs, report = domains.load_jsonl(_write(tmp_path, [GOOD]))
  assert recs[0]['messages'] == [{'role': 'user', 'content': 'What is 2 + 2?'}]
  assert report.kept == report.read == 1
  (s,) = domains.score(recs, [r'\boxed{4}'])
  assert s.passed


@pytest.mark.parametrize('row, where', [
    ('{"id": "x", "domain": "math", ', 'invalid JSON'),
    (dict(GOOD, id=''), "field 'id'"),
    ({k: v for k, v in GOOD.items() if k != 'domain'}, "field 'domain'"),
    (dict(GOOD, domain='chess'), "field 'domain': unknown domain 'chess'"),
    ({k: v for k, v in GOOD.items() if k != 'answer'}, "field 'answer'"),
    ({k: v for k, v in GOOD.items() if k != 'prompt'}, "field 'messages'"),
    (dict(GOOD, prompt=None, messages=[{'role': 'bot', 'content': 'x'}]),
     r"field 'messages\[0\]'"),
    (dict(GOOD, response=3), "field 'response'"),
    (dict(id='c', domain='code', prompt='p', tests=['assert f() == 1']),
     "field 'entry_point'"),
])
def test_malformed_rows_name_file_line_and_field(tmp_path, row, where):
  path = _write(tmp_path, [GOOD, row])
  with pytest.raises(domains.RecordError, match=f'data.jsonl:2: .*{where}'):
    domains.load_jsonl(path)


def test_skip_mode_counts_every_skipped_row(tmp_path):
  path = _write(tmp_path, [GOOD, '{oops', dict(GOOD, id='a2'),
                           dict(GOOD, id='a1'), dict(GOOD, id='a3',
                                                     domain='chess')])
  recs, report = domains.load_jsonl(path, on_error='skip')
  assert [r['id'] for r in recs] == ['a1', 'a2']
  assert report.read == 5 and report.kept == 2
  assert [line for line, _ in report.skipped] == [2, 4, 5]
  assert 'appears twice' in report.skipped[1][1]
  assert 'skipped 3' in str(report)


def test_save_and_load_round_trip(tmp_path):
  recs = domains.generate('multi_domain', split='train', n=20, seed=0)
  path = str(tmp_path / 'md.jsonl')
  domains.save_jsonl(recs, path)
  again, _ = domains.load_jsonl(path, domain='multi_domain')
  assert again == recs


def test_a_new_domain_is_one_registration(tmp_path, monkeypatch):
  # A registry of its own for this test: other tests iterate the domains.
  monkeypatch.setattr(_base, '_REGISTRY', dict(_base._REGISTRY))

  def verify(records, responses, *, sandbox=None):
    return [domains.Score(float(r['answer'] in s), r['answer'] in s)
            for r, s in zip(records, responses)]
  domains.register(domains.Domain(
      name='echo_test', generate=None, verify=verify,
      required_fields=('answer',)))
  path = _write(tmp_path, [dict(id='e', domain='echo_test', prompt='say hi',
                                answer='hi')])
  recs, _ = domains.load_jsonl(path)
  assert domains.evaluate(recs, ['hi there'])['echo_test'].pass_rate == 1.0


def test_evaluate_reports_per_domain():
  recs = (domains.generate('math', split='eval', n=4, seed=0) +
          domains.generate('long_context', split='eval', n=4, seed=0))
  responses = [r['response'] for r in recs[:6]] + ['no', 'no']
  scores = domains.evaluate(recs, responses)
  assert scores['math'].pass_rate == 1.0
  assert scores['long_context'].pass_rate == 0.5
  assert 'long_context' in domains.format_scores(scores)


def test_identical_programs_run_once_and_verdicts_are_cached():
  from cascade_jax import sandbox as sb
  from cascade_jax.domains import code

  class Counting:
    limits = sb.Limits(wall_seconds=7.0)   # a cache of its own
    def __init__(self):
      self.jobs = 0
    def run_tests_batch(self, jobs):
      self.jobs += len(jobs)
      return [sb.TestResult(passed='+' in j['program'], status='passed')
              for j in jobs]

  recs = domains.generate('code', split='eval', n=2, seed=11)
  box = Counting()
  progs = ['def f(x): return x + 1', 'def f(x): return x - 1'] * 3
  scores = code.run_programs([recs[0]] * 6, progs, box)
  assert box.jobs == 2 and [s.passed for s in scores] == [True, False] * 3
  code.run_programs([recs[0], recs[1]], progs[:2], box)
  assert box.jobs == 3   # only the new (program, tests) pair ran
