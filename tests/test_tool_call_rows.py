"""NeMo-Gym's conversational tool-use rows (the agentic tool-use RL set): read, shown, verified on the next action."""

import json
import os

import pytest

from cascade_jax.domains import nemo_gym
import _nemo_gym_helpers  # pylint: disable=g-import-not-at-top

_DATA = _nemo_gym_helpers.DATA
_verify = _nemo_gym_helpers.verify
_assert_refused = _nemo_gym_helpers.assert_refused

TOOL_USE = os.path.join(_DATA, 'tool_use.jsonl')


def test_tool_use_rows_are_verified_on_their_next_action():
  rows = nemo_gym.read_rows(TOOL_USE)
  assert {r.kind for r in rows} == {'tool_call'}
  got = nemo_gym.verify_rows(rows)
  # Each row's `note` says what its response does (tests/data/nemo_gym/
  # tool_use.jsonl): 1 the expected call; 2 a message instead; 3 the
  # right tool, another value; 4 another tool; 5 arguments not JSON;
  # 6 a surplus call (free with call counting off, the server's default);
  # 7 a number as a string; 8 a message where one is expected; 9 a call
  # instead; 10 a summary in other words (word overlap 3/17 >= 0.1);
  # 11 a batch in the other order; 12 a batch call missing; 13 a refusal.
  assert [g['reward'] for g in got] == [1, 0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 0, 0]
  assert [g['verifier_details']['category'] for g in got] == [
      'expected_tool_call', 'no_expected_tool_call',
      'argument_value_different', 'unexpected_tool', 'arguments_decode_error',
      'expected_tool_call', 'argument_value_type_different',
      'expected_chat_message_found', 'no_expected_chat_message',
      'expected_tool_call', 'expected_tool_call_batch',
      'argument_value_different', 'no_expected_tool_call']
  assert [g['id'] for g in got] == list(range(1, 14))       # order kept


def test_verify_reports_tool_use_rows_by_category(tmp_path):
  out = tmp_path / 'verified.jsonl'
  res = _verify(TOOL_USE, out)
  assert res.returncode == 0, res.stderr[-3000:]
  assert [json.loads(line)['reward'] for line in open(out)] == [
      1, 0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 0, 0]
  assert 'tool_call by category: expected_tool_call 3, ' in res.stdout, \
      res.stdout


def test_tool_use_history_becomes_the_chat_turns_the_model_sees():
  row = nemo_gym.read_rows(TOOL_USE)[0]
  roles = [m['role'] for m in row.messages]
  # system (+ the tools), user, the assistant's call (reasoning dropped),
  # the call's output as a tool turn, the assistant's message, user.
  assert roles == ['system', 'user', 'assistant', 'tool', 'assistant', 'user']
  system = row.messages[0]['content']
  assert system.startswith('You are the help desk') and '<tools>' in system
  assert '"name": "renew_loan"' in system
  assert row.messages[2]['content'] == (
      '<tool_call>{"name": "find_patron", "arguments": {"card_number": '
      '"C-2231"}}</tool_call>')
  assert row.messages[3]['content'] == '{"name": "Ada", "loans": ["L-7", "L-9"]}'
  # The expected call as the model writes it earns 1, as a rollout row's
  # function_call item does; the domain scores what verify scores.
  from cascade_jax import domains  # pylint: disable=g-import-not-at-top
  rows = nemo_gym.read_rows(TOOL_USE)
  recs = [domains.nemo_gym_rl.record(r) for r in rows]
  for r in recs:
    domains.validate(r)
  dom = domains.get('nemo_gym')
  scores = dom.verify(recs, [nemo_gym.response_text(r) for r in rows])
  assert [s.reward for s in scores] == [
      g['reward'] for g in nemo_gym.verify_rows(rows)]
  written = ('<think>renew it</think><tool_call>{"name": "renew_loan", '
             '"arguments": {"weeks": 2, "loan_id": "L-7"}}</tool_call>')
  assert [s.reward for s in dom.verify(recs[:1], [written])] == [1.0]
  assert [s.reward for s in dom.verify(recs[:1], ['<think>x</think>'])] == [0.0]


def test_tool_call_arguments_compare_as_the_reference_server():
  from cascade_jax.domains import _tool_call as t  # pylint: disable=g-import-not-at-top
  c = t.Comparator()
  assert t.compare_values(None, 'None', c) == t.TYPE_DIFFERENT
  assert t.compare_values(1.0, 1.0 + 1e-9, c) is None
  assert t.compare_values(1.0, 2.0, c) == t.VALUE_DIFFERENT
  assert t.compare_values(True, 1, c) == t.TYPE_DIFFERENT
  # The reference's isinstance(actual, type(expected)): an int is not a
  # float either way; a bool passes as an int and compares by value.
  assert t.compare_values(2, 2.0, c) == t.TYPE_DIFFERENT
  assert t.compare_values(2.0, 2, c) == t.TYPE_DIFFERENT
  assert t.compare_values(1, True, c) is None
  assert t.compare_values(0, True, c) == t.VALUE_DIFFERENT
  assert t.compare_values(1.0, 1.0 + 2e-6, c) == t.VALUE_DIFFERENT
  assert t.compare_values('one', 'two', c) == t.VALUE_DIFFERENT
  assert t.compare_values('One', 'one', c) == t.VALUE_DIFFERENT  # one word
  assert t.compare_values('one two three', 'four five six', c) == \
      t.VALUE_DIFFERENT
  assert t.compare_values('One two', 'one TWO', c) is None   # lower-cased
  obj = dict(first='one', second=2, third=True, fourth=[1, 'e2'],
             fifth=dict(inner1='v', inner2=False))
  assert t.compare_values(obj, dict(obj), c) is None
  assert t.compare_values(obj, dict(obj, fourth=[1, 'e3']), c) == \
      t.VALUE_DIFFERENT
  assert t.compare_values(obj, dict(obj, fourth=[1]), c) == t.LENGTH_DIFFERENT
  assert t.compare_values(obj, dict(obj, fifth=dict(inner='v', inner2=False)),
                          c) == t.KEYS_DIFFERENT
  # Word overlap: |common| / (expected + actual words); identical is 0.5.
  loose = t.Comparator(word_similarity=0.3)
  assert t.compare_values('aa bb cc dd', 'aa bb', loose) is None    # 2/6
  assert t.compare_values('aa bb cc dd', 'aa ee ff gg', loose) == \
      t.VALUE_DIFFERENT                                             # 1/8
  assert t.compare_values('aa bb', 'aa bb', t.Comparator(
      word_similarity=0.6)) == t.VALUE_DIFFERENT


def test_tool_calls_match_as_a_multiset_with_the_servers_counting_modes():
  from cascade_jax.domains import _tool_call as t  # pylint: disable=g-import-not-at-top
  call = lambda q, name='search': dict(name=name, arguments=dict(query=q))
  want = lambda *cs: dict(type='calls', batch=len(cs) > 1, calls=list(cs))
  got = lambda *cs: dict(type='calls', calls=list(cs))
  r = lambda e, a, **kw: t.compare(e, a, t.Comparator(**kw))[:2]
  # The fuzzy relation is not transitive: greedy pairing would strand the
  # second expected call; the maximum matching finds both.
  assert r(want(call('aa bb cc dd'), call('aa bb')),
           got(call('aa bb'), call('cc dd')), word_similarity=0.3) == (
               1.0, t.EXPECTED_BATCH)
  assert t.max_matching([[0, 1], [0]]) == {0: 1, 1: 0}
  assert t.max_matching([[], []]) == {} and t.max_matching([[0], [0]]) == {0: 0}
  # Counting off (the default): surplus calls are free, missing ones not.
  assert r(want(call('a')), got(call('j'), call('a'), call('k'))) == (
      1.0, t.EXPECTED_CALL)
  assert r(want(call('a'), call('b')), got(call('a'), call('j'))) == (
      0.0, t.VALUE_DIFFERENT)
  assert r(want(call('a'), call('b', 'lookup')),
           got(call('a'), call('b', 'other'))) == (0.0, t.UNEXPECTED_TOOL)
  # Counting on: the count must match unless a gate admits it; then the
  # mode decides.
  on = dict(count_calls=True)
  assert r(want(call('a')), got(call('a'), call('j')), **on) == (
      0.0, t.COUNT_DIFFERENT)
  assert r(want(call('a'), call('b')), got(call('a')), allow_subset=True,
           **on) == (1.0, t.EXPECTED_BATCH)               # binary: a free pass
  assert r(want(call('a'), call('b'), call('c')),
           got(call('a'), call('b'), call('x')), mode='fraction', **on)[0] == \
      pytest.approx(2 / 3)
  assert r(want(call('a'), call('b')), got(call('a')), allow_subset=True,
           mode='f1', **on) == (pytest.approx(2 / 3), t.COUNT_DIFFERENT)
  spam = got(call('a'), call('b'), *[call(f'j{i}') for i in range(20)])
  assert r(want(call('a'), call('b')), spam, allow_superset=True, mode='f1',
           **on)[0] == pytest.approx(1 / 6)
  # Messages: any message matches an expected one; a call never does.
  msg, none = dict(type='message'), dict(type='none')
  assert r(msg, msg) == (1.0, t.EXPECTED_MESSAGE)
  assert r(msg, got(call('a'))) == (0.0, t.NO_EXPECTED_MESSAGE)
  assert r(want(call('a')), msg) == (0.0, t.NO_EXPECTED_CALL)
  assert r(want(call('a')), none) == (0.0, t.NO_EXPECTED_CALL)
  with pytest.raises(ValueError, match="mode 'strict'"):
    t.Comparator(mode='strict')


def test_a_reply_is_read_as_calls_a_message_or_nothing():
  from cascade_jax.domains import _tool_call as t  # pylint: disable=g-import-not-at-top
  a = t.action_from_text('Sure. <tool_call>{"name": "f", "arguments": {"x": '
                         '1}}</tool_call><tool_call>{bad}</tool_call>')
  assert a['calls'][0] == dict(name='f', arguments=dict(x=1))
  assert a['calls'][1]['name'] is None and 'not valid JSON' in a['calls'][1][
      'error']
  assert t.action_from_text('<think>hmm</think> ') == dict(type='none')
  assert t.action_from_text('<think>x</think>Hello') == dict(type='message')
  assert t.action_from_text('<tool_call>{"name": "f"')['calls'][0]['error'] \
      == 'unclosed tool call'
  # A non-finite number is no argument value (1e999 parses as infinity).
  bad = t.action_from_text('<tool_call>{"name": "f", "arguments": {"x": '
                           '1e999}}</tool_call>')
  assert 'non-finite' in bad['calls'][0]['error']


_TOOL_ROW = None


def _tool_row():
  global _TOOL_ROW
  if _TOOL_ROW is None:
    _TOOL_ROW = json.loads(open(TOOL_USE).readline())
  return json.loads(json.dumps(_TOOL_ROW))


@pytest.mark.parametrize('edit, says', [
    (lambda r: r.update(expected_action=dict(type='call')),
     "field expected_action.type is 'call'; one of message, function_call"),
    (lambda r: r['expected_action'].update(arguments='{"loan_id": L-7}'),
     'field expected_action.arguments is not JSON'),
    (lambda r: r['expected_action'].update(arguments='[1]'),
     'field expected_action.arguments must be a JSON object'),
    (lambda r: r.update(expected_action=dict(type='function_call_batch',
                                             calls=[])),
     'field expected_action.calls must be a non-empty list'),
    (lambda r: r['responses_create_params'].update(tools=[]),
     'field expected_action is a call, but responses_create_params.tools '
     'names no tools'),
    (lambda r: r['responses_create_params'].update(tools=[dict(type='x')]),
     'field responses_create_params.tools[0] must be a function tool'),
    (lambda r: r['responses_create_params']['input'].append(
        dict(type='message', role='assistant', content='done')),
     "field responses_create_params.input ends with the assistant's turn"),
    (lambda r: r['responses_create_params']['input'].append(
        dict(type='web_search_call')),
     "field responses_create_params.input[7].type is 'web_search_call'"),
    (lambda r: r.pop('expected_action'),
     'field responses_create_params.tools names 4 tools, but the row has no '
     'expected_action'),
])
def test_tool_use_rows_that_cannot_be_read_are_named(tmp_path, edit, says):
  row = _tool_row()
  edit(row)
  _assert_refused(tmp_path, row, says)
