"""NeMo-Gym rows: read and checked (errors name file, line, field), verified as the reference verifiers do."""

import json
import os

import pytest

from cascade_jax.domains import nemo_gym
import _nemo_gym_helpers  # pylint: disable=g-import-not-at-top

_ROOT = _nemo_gym_helpers.ROOT
_DATA = _nemo_gym_helpers.DATA
ROLLOUTS = os.path.join(_DATA, 'rollouts.jsonl')
IF_ROWS = os.path.join(_DATA, 'instruction_following.jsonl')
TOOL_USE = os.path.join(_DATA, 'tool_use.jsonl')

# The fixture's rows in order (tests/data/nemo_gym/rollouts.jsonl): math with
# equivalent forms (0.75 for 3/4, an interval, a set in another order, a
# radical), a wrong product, a right but unboxed answer (0: NeMo-Gym's math
# server wants a \boxed{} answer), a wrong fraction; code: right, right in
# the last of two blocks, wrong on the third test, a time limit, a runtime
# error, no fenced block, a float within 1e-6; math again, its gold answer
# in $ $.
WANT = [1, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 1, 1]


_verify = _nemo_gym_helpers.verify
_assert_refused = _nemo_gym_helpers.assert_refused


def test_verify_writes_every_row_back_in_order_with_its_reward(tmp_path):
  out = tmp_path / 'verified.jsonl'
  res = _verify(ROLLOUTS, out)
  assert res.returncode == 0, res.stderr[-3000:]
  got = [json.loads(line) for line in open(out)]
  rows = [json.loads(line) for line in open(ROLLOUTS)]
  assert [g['reward'] for g in got] == WANT
  for g, r in zip(got, rows):       # everything else as it was read
    assert {k: v for k, v in g.items()
            if k not in ('reward', 'verifier_details')} == r
  assert got[4]['verifier_details'] == dict(error='no \\boxed{} answer')
  code = [g['verifier_details'] for g in got[7:14]]
  assert code[2] == dict(first_failure=2, tests=3,
                         error="wrong answer at line 0: '0' != '2'")
  assert code[3]['first_failure'] == 0 and 'time limit' in code[3]['error']
  assert 'ValueError: boom' in code[4]['error']
  assert code[5]['error'] == 'no fenced code block in the response'
  # The table: each kind's rows and mean reward.
  assert 'code                         7     0.429' in res.stdout, res.stdout
  assert 'math                         8     0.625' in res.stdout, res.stdout


def _bad_file(tmp_path, rows):
  path = tmp_path / 'bad.jsonl'
  path.write_text(''.join((r if isinstance(r, str) else json.dumps(r)) + '\n'
                          for r in rows))
  return str(path)


def _math(**over):
  row = {'responses_create_params': {'input': [
      {'role': 'user', 'content': 'What is 2 + 2?'}]}, 'expected_answer': '4'}
  row.update(over)
  return row


@pytest.mark.parametrize('row, says', [
    ('{"responses_create_params": ', 'not JSON'),
    ('[1, 2]', 'a row is a JSON object'),
    ({'expected_answer': '4'},
     "missing field 'responses_create_params.input'"),
    (_math(responses_create_params={'input': []}),
     'responses_create_params.input is empty'),
    (_math(responses_create_params={'input': [{'role': 'user', 'content': [
        {'type': 'input_image', 'image_url': 'x'}]}]}),
     "responses_create_params.input[0].content[0] is a 'input_image' part"),
    (_math(responses_create_params={'input': [{'role': 'tool',
                                                'content': 'x'}]}),
     "responses_create_params.input[0].role is 'tool'"),
    (_math(responses_create_params={'input': 'hi', 'tools': [{'name': 'f'}]}),
     'responses_create_params.tools names 1 tools'),
    (_math(expected_answer=None), 'no verifier fields'),
    (_math(expected_answer=['4']), "field 'expected_answer' must be a string"),
    (_math(instruction_id_list=['punctuation:no_comma']),
     'fields of several kinds'),
    ({'responses_create_params': {'input': 'x'}, 'verifier_metadata': {
        'unit_tests': {'inputs': ['1'], 'outputs': []}}},
     'unit_tests has 1 inputs and 0 outputs'),
    ({'responses_create_params': {'input': 'x'}, 'verifier_metadata': {
        'unit_tests': {'inputs': [1], 'outputs': ['1']}}},
     'unit_tests.inputs[0] must be a string'),
    ({'responses_create_params': {'input': 'x'}, 'verifier_metadata': {
        'instruction_id_list': ['a:b', 'c:d'], 'kwargs': [{}]}},
     "'verifier_metadata.kwargs' must be a list of 2 objects"),
    ({'responses_create_params': {'input': 'x'}, 'instruction_id_list':
      ['a:b'], 'grading_mode': 'partial'},
     "'grading_mode' is 'partial'"),
])
def test_a_malformed_row_names_its_file_line_and_field(tmp_path, row, says):
  path = _bad_file(tmp_path, [_math(), row])
  with pytest.raises(nemo_gym.RowError) as e:
    nemo_gym.read_rows(path)
  assert str(e.value).startswith(f'{path}:2: '), e.value
  assert says in str(e.value), e.value


def test_a_bad_row_stops_verify_before_anything_is_written(tmp_path):
  row = _math(response={'output': [{'type': 'message', 'content': 'x'}]})
  path = _bad_file(tmp_path, [row])
  out = tmp_path / 'out.jsonl'
  res = _verify(path, out)
  assert res.returncode != 0
  assert f'{path}:1: field response.output[0].content must be a list' in (
      res.stderr), res.stderr[-2000:]
  assert not out.exists()
  res = _verify(_bad_file(tmp_path, [_math()]), out)     # no response at all
  assert "missing field 'response.output'" in res.stderr
  assert not out.exists()


def test_instruction_following_rows_in_both_layouts():
  rows = nemo_gym.read_rows(IF_ROWS)
  assert [r.kind for r in rows] == ['instruction_following'] * 4
  assert rows[0].fields == dict(
      instruction_id_list=['length_constraints:number_words',
                           'punctuation:no_comma'],
      kwargs=[{'num_words': 50, 'relation': 'less than'}, {}],
      grading_mode='fraction', prompt=rows[0].raw['verifier_metadata'][
          'prompt'])
  # The older layout: the fields at the top level; binary by default.
  assert rows[1].fields['grading_mode'] == 'binary'
  assert rows[1].messages == [{'role': 'user',
                               'content': 'Reply in lowercase only.'}]
  # No prompt field: the last user message.
  assert rows[3].fields['prompt'] == rows[3].messages[-1]['content']


def test_instruction_following_is_verified_per_instruction(tmp_path):
  out = tmp_path / 'verified.jsonl'
  res = _verify(IF_ROWS, out)
  assert res.returncode == 0, res.stderr[-3000:]
  got = [json.loads(line) for line in open(out)]
  # 1: under 50 words but with a comma, graded by fraction; 2: lowercase
  # once the thought is removed; 3: not lowercase; 4: two sentences ending
  # with "tea." (IFEval's number_sentences, on the untrained-Punkt fallback
  # where nltk's punkt data is not installed).
  assert [g['reward'] for g in got] == [0.5, 1.0, 0.0, 1.0]
  assert got[0]['follow_instruction_list'] == [True, False]
  assert got[0]['follow_all_instructions'] is False
  assert got[1]['follow_instruction_list'] == [True]
  assert 'instruction_following        4     0.625' in res.stdout, res.stdout


def test_instruction_ids_that_cannot_be_checked_are_refused_by_name(
    tmp_path):
  row = json.loads(open(IF_ROWS).readline())
  row['verifier_metadata']['instruction_id_list'][1] = (
      'detectable_format:rephrase')   # commented out of every registry
  path = _bad_file(tmp_path, [json.loads(open(IF_ROWS).readline()), row])
  out = tmp_path / 'out.jsonl'
  res = _verify(path, out)
  assert res.returncode != 0 and not out.exists()
  assert (f"{path}:2 (and 0 more rows): instructions that cannot be checked "
          "here: {'detectable_format:rephrase': 'not in the IFEval, IFBench "
          "or IF-RLVR registry'}") in res.stderr, res.stderr[-2000:]


def test_rows_that_need_uninstalled_checker_data_are_set_aside(
    tmp_path, monkeypatch):
  # IFBench's ratio:stop_words needs nltk's stopwords: where they are not
  # installed its rows are written back unverified, with the reason, and
  # the others verified; verify prints the command that installs the data.
  from cascade_jax.domains import _if_registry  # pylint: disable=g-import-not-at-top
  _if_registry.registry()
  if 'ratio:stop_words' not in _if_registry.UNAVAILABLE:   # installed here
    monkeypatch.setitem(_if_registry.UNAVAILABLE, 'ratio:stop_words',
                        'needs nltk stopwords (not installed)')
  first = json.loads(open(IF_ROWS).readline())
  row = json.loads(open(IF_ROWS).readline())
  row['verifier_metadata']['instruction_id_list'][0] = 'ratio:stop_words'
  path = _bad_file(tmp_path, [first, row, first])
  rows = nemo_gym.read_rows(str(path))
  out = nemo_gym.verify_rows(rows)
  assert [r['reward'] is None for r in out] == [False, True, False]
  assert out[1]['verifier_details'] == {
      'skipped': 'ratio:stop_words: needs nltk stopwords (not installed)'}
  assert out[0]['reward'] == out[2]['reward'] is not None
  assert nemo_gym.missing_data(rows) == ['stopwords']
  monkeypatch.undo()
  if 'ratio:stop_words' in _if_registry.UNAVAILABLE:   # verify's own words
    res = _verify(path, tmp_path / 'out.jsonl')
    assert res.returncode == 0, res.stderr[-2000:]
    assert 'python -m nltk.downloader stopwords' in res.stdout, res.stdout
    written = [json.loads(l) for l in open(tmp_path / 'out.jsonl')]
    assert [r['reward'] is None for r in written] == [False, True, False]


def test_response_text_reads_output_text_and_skips_reasoning():
  row = nemo_gym.parse_row(_math(response={'output': [
      {'type': 'reasoning', 'summary': [{'type': 'summary_text',
                                         'text': '\\boxed{5}'}]},
      {'type': 'message', 'content': [
          {'type': 'output_text', 'text': 'It is '},
          {'type': 'refusal', 'refusal': 'no'},
          {'type': 'output_text', 'text': '\\boxed{4}'}]}]}), 'x:1')
  assert nemo_gym.response_text(row) == 'It is \\boxed{4}'
  (got,) = nemo_gym.verify_rows([row])
  assert got['reward'] == 1.0


@pytest.mark.parametrize('want, got, ok', [
    ('6\n', '6', True),                        # trailing whitespace
    ('1 2\n3\n', '  1 2  \n3', True),          # each line stripped
    ('1 2\n3\n', '1 2 3', False),              # line count
    ('1.666667', '1.6666666666666667', True),  # floats within 1e-6
    ('1.67', '1.6666666666666667', False),
    ('100000000000000000', '100000000000000001', False),  # integers exactly
    ('YES', 'yes', False),
    ('1e-3', '0.001', True),
])
def test_outputs_match_as_livecodebench(want, got, ok):
  assert nemo_gym.outputs_match(want, got)[0] is ok


def test_last_fenced_block():
  assert nemo_gym.last_fenced_block('```python\na\n```\nx\n```\nb\n```') == 'b'
  assert nemo_gym.last_fenced_block('no code') == ''


# ------------------------------------------------ rows as an RL domain

def test_rows_as_a_domain_split_by_prompt_and_verify_as_verify_does():
  import dataclasses  # pylint: disable=g-import-not-at-top
  from cascade_jax import domains  # pylint: disable=g-import-not-at-top
  from cascade_jax.sandbox import Sandbox  # pylint: disable=g-import-not-at-top
  files = f'{ROLLOUTS},{IF_ROWS}'
  train = domains.generate('nemo_gym', split='train', n=100, seed=0,
                           files=files, eval_fraction=0.3)
  ev = domains.generate('nemo_gym', split='eval', n=100, seed=0, files=files,
                        eval_fraction=0.3)
  # Every prompt once (two of the IF file's rollouts share theirs), train
  # and eval disjoint, the same each run.
  rows = nemo_gym.read_rows(ROLLOUTS) + nemo_gym.read_rows(IF_ROWS)
  prompts = {json.dumps(r.messages, sort_keys=True) for r in rows}
  assert len(train) + len(ev) == len(prompts)
  assert ev and train and not {r['id'] for r in train} & {r['id'] for r in ev}
  assert train == domains.generate('nemo_gym', split='train', n=100, seed=0,
                                   files=files, eval_fraction=0.3)
  assert len(domains.generate('nemo_gym', split='train', n=3, seed=0,
                              files=files, eval_fraction=0.3)) == 3
  for r in train + ev:
    domains.validate(r)
  # The rollouts' own responses, scored by the domain: verify's verdicts.
  recs = [domains.nemo_gym_rl.record(r) for r in nemo_gym.read_rows(ROLLOUTS)]
  texts = [nemo_gym.response_text(r) for r in nemo_gym.read_rows(ROLLOUTS)]
  box = Sandbox(dataclasses.replace(nemo_gym.TEST_LIMITS, wall_seconds=1.0,
                                    cpu_seconds=1))
  scores = domains.get('nemo_gym').verify(recs, texts, sandbox=box)
  assert [s.reward for s in scores] == WANT
  assert [s.passed for s in scores] == [bool(w) for w in WANT]


def test_rows_as_a_domain_refuse_bad_options(tmp_path):
  from cascade_jax import domains  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match='data.files names no file'):
    domains.generate('nemo_gym', split='train', n=4, seed=0)
  bad = tmp_path / 'if.jsonl'
  row = json.loads(open(IF_ROWS).readline())
  row['instruction_id_list'] = ['count:lowercase_counting']
  row.pop('verifier_metadata', None)
  row['kwargs'] = [{}]
  bad.write_text(json.dumps(row) + '\n')
  # An IF-RLVR id whose kwargs lack its bound: refused before training.
  with pytest.raises(nemo_gym.RowError,
                     match=r"count:lowercase_counting.*lack \['N'\]"):
    domains.generate('nemo_gym', split='train', n=4, seed=0, files=str(bad))
  assert 'nemo_gym' not in domains.names()     # not a generated domain


@pytest.mark.slow
def test_an_rl_stage_trains_on_nemo_gym_rows(tmp_path):
  # A quick SFT, then GRPO on the fixture's math and code prompts (the
  # quick config but for the data), evaluated on the instruction-following
  # rows (eval_files): steps run, rewards come from the rows' verifiers.
  from cascade_jax import rl  # pylint: disable=g-import-not-at-top
  from cascade_jax import sft  # pylint: disable=g-import-not-at-top
  from configs import rl as rl_config  # pylint: disable=g-import-not-at-top
  from configs import sft as sft_config  # pylint: disable=g-import-not-at-top
  s = sft_config.get_config('quick')
  s.steps, s.eval_n = 4, 0
  sft.run(s, str(tmp_path / 'sft'))
  c = rl_config.get_config('quick')
  c.init_from = str(tmp_path / 'sft')
  c.data.domain, c.data.eval_files = 'nemo_gym', IF_ROWS
  c.data.files = f'{ROLLOUTS},{TOOL_USE}'   # tool-use rows read as records too
  c.rl.dynamic_filtering, c.steps, c.eval_n = False, 2, 4
  scores = rl.run(c, str(tmp_path / 'rl'))
  # 3 prompts (two of the 4 rows share one), each instruction a check.
  assert set(scores) == {'nemo_gym'} and scores['nemo_gym'].n == 3
  assert set(dict(scores['nemo_gym'].by_check)) == {
      'length_constraints:number_words', 'punctuation:no_comma',
      'change_case:english_lowercase', 'length_constraints:number_sentences',
      'startend:end_checker'}
  rows = [json.loads(l) for l in open(tmp_path / 'rl' / 'rl_metrics.jsonl')]
  steps = [r for r in rows if 'reward_mean' in r]
  assert [r['step'] for r in steps] == [1, 2]
  c.data.domain, c.data.eval_files = 'math', ''
  with pytest.raises(ValueError, match="read by the NeMo-Gym domains"):
    rl.run(c, str(tmp_path / 'rl2'))


class _FlakySandbox:
  """run_script fails to start the first `fails` times, then runs the
  program's answer (prints stdin doubled)."""
  workers = 1

  def __init__(self, fails):
    self.fails, self.calls = fails, 0

  def run_script(self, program, stdin=''):
    from cascade_jax.sandbox import SANDBOX_ERROR, ScriptResult  # pylint: disable=g-import-not-at-top
    self.calls += 1
    if self.calls <= self.fails:
      return ScriptResult(None, SANDBOX_ERROR, stderr='clone failed')
    return ScriptResult(0, 'ok', stdout=str(2 * int(stdin)) + '\n')


def test_a_sandbox_that_fails_to_start_is_not_the_programs_verdict():
  reply = '```python\nprint(2 * int(input()))\n```'
  box = _FlakySandbox(fails=1)          # once: retried, then the verdict
  assert nemo_gym.code_reward(['2', '5'], ['4', '10'], reply, box) == (
      1.0, dict(tests=2))
  assert box.calls == 3
  box = _FlakySandbox(fails=2)          # twice: said so, not a wrong answer
  reward, details = nemo_gym.code_reward(['2'], ['4'], reply, box)
  assert reward == 0.0 and details['status'] == 'sandbox_error'
  assert 'clone failed' in details['error'] and 'first_failure' in details


STRUCTURED = os.path.join(_DATA, 'structured_output.jsonl')


def test_structured_output_rows_are_validated_against_the_strict_schema():
  rows = nemo_gym.read_rows(STRUCTURED)
  assert {r.kind for r in rows} == {'structured_output'}
  got = nemo_gym.verify_rows(rows)
  # 1 fits; 2 has a property the strict schema forbids; 3 lacks one it
  # requires; 4 fits after its think block; 5 is fenced (the reference
  # parses the whole text); 6 is YAML that fits; 7's extra key sits in an
  # anyOf branch (left as written); 8 breaks a minimum.
  assert [g['reward'] for g in got] == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
  why = [g['verifier_details'].get('error_type') for g in got]
  assert why == [None, 'validation_error', 'validation_error', None,
                 'parse_error', None, None, 'validation_error']


@pytest.mark.parametrize('change, says', [
    (dict(schema_type='html'), "field 'schema_type' is 'html'"),
    (dict(schema_str='{"type": '), "field 'schema_str' is not JSON"),
    (dict(schema_str='[1, 2]'), "field 'schema_str' must hold a JSON object"),
    (dict(response_mode='audio'), "field 'response_mode' is 'audio'"),
    (dict(response_mode='tool_call', tool_name='extract'),
     "field 'tool_name' is 'extract'; it must name one of "
     'responses_create_params.tools ([])'),
])
def test_structured_output_rows_that_cannot_be_read_are_named(tmp_path, change,
                                                              says):
  row = dict(json.loads(open(STRUCTURED).readline()), **change)
  _assert_refused(tmp_path, row, says)


def test_xml_and_csv_rows_are_coerced_to_their_schemas_types_then_validated():
  rows = nemo_gym.read_rows(os.path.join(_DATA, 'structured_xml_csv.jsonl'))
  assert [r.fields['schema_type'] for r in rows] == ['xml'] * 6 + ['csv'] * 3
  got = nemo_gym.verify_rows(rows)
  # XML: 1 fits (age and active coerced); 2 one repeated element is still
  # a list, '0' a boolean; 3 'old' is no integer; 4 an element the strict
  # schema forbids; 5 does not parse; 6 an empty name is '', TRUE a
  # boolean. CSV: 7 fits (an empty area is null where null is allowed);
  # 8 '2.1M' is no integer; 9 lacks a required column.
  assert [g['reward'] for g in got] == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0,
                                        0.0, 0.0]
  why = [g['verifier_details'].get('error_type') for g in got]
  assert why == [None, None, 'validation_error', 'validation_error',
                 'parse_error', None, None, 'validation_error',
                 'validation_error']
  # Entities are not expanded (an XML bomb is a parse error, not memory).
  bomb = ('<!DOCTYPE p [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;">]>'
          '<person><name>&b;</name></person>')
  reward, details = nemo_gym.structured_reward(rows[0].fields, bomb)
  assert reward == 0.0 and details['error_type'] == 'parse_error'
  # A list of types tries each in order; values that read as none stay
  # strings for the validator to refuse.
  from cascade_jax.domains import _structured  # pylint: disable=g-import-not-at-top
  assert _structured._scalar('', ['integer', 'null']) is None  # pylint: disable=protected-access
  assert _structured._scalar('7', ['integer', 'string']) == 7  # pylint: disable=protected-access
  assert _structured._scalar('x', ['integer', 'string']) == 'x'  # pylint: disable=protected-access
  assert _structured._scalar('yes', 'boolean') == 'yes'  # pylint: disable=protected-access


def test_structured_rows_as_a_domain_score_as_verify_does():
  from cascade_jax import domains  # pylint: disable=g-import-not-at-top
  rows = nemo_gym.read_rows(STRUCTURED)
  recs = [domains.nemo_gym_rl.record(r) for r in rows]
  for r in recs:
    domains.validate(r)
  scores = domains.get('nemo_gym').verify(
      recs, [nemo_gym.response_text(r) for r in rows])
  assert [s.reward for s in scores] == [
      g['reward'] for g in nemo_gym.verify_rows(rows)]
  # As training prompts: one record a prompt (the fixture has two).
  assert len(domains.generate('nemo_gym', split='train', n=100, seed=0,
                              files=STRUCTURED, eval_fraction=0.0)) == len(
                                  {json.dumps(r.messages) for r in rows}) == 2


MCQA = os.path.join(_DATA, 'mcqa.jsonl')
_TEN = [{c: f'option {c} text'} for c in 'ABCDEFGHIJ']
_FOUR = _TEN[:4]


# (response, options, grading mode, output_regex, the letter read): the
# reference server's documented and tested readings.
MCQA_CASES = [
    ('The answer is C.', _FOUR, 'strict_single_letter_boxed', None, None),
    ('Final: \\boxed{ [C] }', _FOUR, 'strict_single_letter_boxed', None, 'C'),
    ('\\boxed{B}', _FOUR, 'strict_single_letter_boxed', None, 'B'),
    ('\\boxed{c}', _FOUR, 'strict_single_letter_boxed', None, None),
    ('\\boxed{B', _FOUR, 'strict_single_letter_boxed', None, None),
    ('\\boxed{G}', _FOUR, 'strict_single_letter_boxed', None, None),
    ('\\boxed{\\text{E}}', _TEN, 'strict_single_letter_boxed', None, 'E'),
    ('\\boxed{\\text{I: NGS can detect both coding and non-coding regions.}}',
     _TEN, 'strict_single_letter_boxed', None, 'I'),
    ('\\[ \\boxed{E: \\text{A polygenic risk score can help.}} \\]', _TEN,
     'strict_single_letter_boxed', None, 'E'),
    ('\\boxed{A polygenic risk score can provide a probability.}', _TEN,
     'strict_single_letter_boxed', None, None),
    ('Candidate is \\boxed{C}, but the answer is \\boxed{E}', _TEN,
     'strict_single_letter_boxed', None, 'E'),
    ('Thinking: \\boxed{\\text{some idea}}. Final answer: \\boxed{E}', _TEN,
     'strict_single_letter_boxed', None, 'E'),
    ('Final: \\boxed{ option c text }', _FOUR, 'lenient_boxed', None, 'C'),
    ('\\boxed{\\text{E}}', _TEN, 'lenient_boxed', None, 'E'),
    ('\\boxed{option A text or option B text}', _FOUR, 'lenient_boxed', None,
     None),
    ('Answer: c', _FOUR, 'lenient_answer_colon', None, 'C'),
    ('Answer: option c text', _FOUR, 'lenient_answer_colon', None, 'C'),
    ('**Answer: C**', _FOUR, 'lenient_answer_colon', None, None),
    ('I think the answer is B.\n\nAnswer: B', _FOUR,
     'strict_single_letter_boxed', None, None),
    ('The answer is B.\n\nAnswer: B', _FOUR, 'lenient_answer_colon_md', None,
     'B'),
    ('Reasoning here.\n\n**Answer: C**', _FOUR, 'lenient_answer_colon_md',
     None, 'C'),
    ('__Answer__: A', _FOUR, 'lenient_answer_colon_md', None, 'A'),
    ('Answer: B because C is not valid', _FOUR, 'lenient_answer_colon_md',
     None, 'B'),
    ('Answer: B/B', _FOUR, 'lenient_answer_colon_md', None, 'B'),
    ('Answer: $D$', _FOUR, 'lenient_answer_colon_md', None, 'D'),
    ('Answer: (D)', _FOUR, 'lenient_answer_colon_md', None, 'D'),
    ('\\boxed{\\text{Answer: G}}', _TEN, 'lenient_answer_colon_md', None, 'G'),
    ('Answer: unknown', _FOUR, 'lenient_answer_colon_md', None, None),
    ('Answer: G', _FOUR, 'lenient_answer_colon_md', None, None),
    ('Answer: A/B/C', _FOUR, 'lenient_answer_colon_md', None, None),
    ('Answer: B/I', _TEN, 'lenient_answer_colon_md', None, None),
    ('**Answer: D/H**', _TEN, 'lenient_answer_colon_md', None, None),
    ('Answer: A or B', _FOUR, 'lenient_answer_colon_md', None, None),
    ('Answer: A and B', _FOUR, 'lenient_answer_colon_md', None, None),
    ('Answer: A, B', _FOUR, 'lenient_answer_colon_md', None, None),
    ('Answer: A\nAnswer: B', _FOUR, 'lenient_answer_colon_md', None, 'B'),
    ('Answer: B\nAnswer: A/B/C', _FOUR, 'lenient_answer_colon_md', None, 'B'),
    ('Answer: B\nAnswer: unknown', _FOUR, 'lenient_answer_colon_md', None,
     'B'),
    ('I think it might be B but not sure', _FOUR, 'lenient_answer_colon_md',
     None, None),
    ('Option Selected: B', _FOUR, 'strict_single_letter_boxed',
     'Option Selected:\\s*([A-Za-z])', 'B'),
    ('ANSWER IS b', _FOUR, 'strict_single_letter_boxed',
     'ANSWER IS\\s*([A-Za-z])', 'B'),
    ('Antwort: B', _FOUR, 'strict_single_letter_boxed',
     ['Answer\\s*:\\s*([A-Za-z])', 'Antwort\\s*:\\s*([A-Za-z])'], 'B'),
    ('الإجابة: ب', _FOUR, 'strict_single_letter_boxed',
     ['الإجابة:\\s*([أ-د])'], 'B'),
    ('Answer: A\nlater... Answer: B', _FOUR, 'strict_single_letter_boxed',
     'Answer:\\s*([A-Za-z])', 'B'),
    ('\\boxed{B}', _FOUR, 'strict_single_letter_boxed', '([', 'B'),
    ('Selected: B', [], 'strict_single_letter_boxed',
     'Selected:\\s*([A-Za-z])', 'B'),
    ('   ', _FOUR, 'lenient_answer_colon_md', None, None),
]


@pytest.mark.parametrize('text, options, mode, regex, letter', MCQA_CASES)
def test_mcqa_reads_the_letter_as_the_reference_server(text, options, mode,
                                                       regex, letter):
  from cascade_jax.domains import _mcqa  # pylint: disable=g-import-not-at-top
  assert _mcqa.read_letter(text, options, grading_mode=mode,
                           output_regex=regex) == letter


def test_mcqa_rows_are_verified_and_train_as_a_domain():
  from cascade_jax import domains  # pylint: disable=g-import-not-at-top
  rows = nemo_gym.read_rows(MCQA)
  assert {r.kind for r in rows} == {'mcqa'}
  got = nemo_gym.verify_rows(rows)
  assert [g['reward'] for g in got] == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0,
                                        0.0]
  assert [g['verifier_details']['extracted_answer'] for g in got] == [
      'B', 'E', None, 'B', 'C', None, 'B', None]
  recs = [domains.nemo_gym_rl.record(r) for r in rows]
  for r in recs:
    domains.validate(r)
  scores = domains.get('nemo_gym').verify(
      recs, [nemo_gym.response_text(r) for r in rows])
  assert [s.reward for s in scores] == [g['reward'] for g in got]


@pytest.mark.parametrize('change, says', [
    (dict(options=[]), "field 'options' must be a non-empty list"),
    (dict(options=[{'AB': 'x'}]), "field 'options' must be a non-empty list"),
    (dict(expected_answer='Z'), "field 'expected_answer' must be one of the "
     "options' letters ['A', 'B', 'C', 'D'], got 'Z'"),
    (dict(grading_mode='lenient'), "field 'grading_mode' is 'lenient'"),
    (dict(template_metadata={'output_regex': 3}),
     "field 'template_metadata.output_regex' must be a pattern"),
])
def test_mcqa_rows_that_cannot_be_read_are_named(tmp_path, change, says):
  row = dict(json.loads(open(MCQA).readline()), **change)
  _assert_refused(tmp_path, row, says)


STRUCTURED_TOOL = os.path.join(_DATA, 'structured_tool_call.jsonl')


def test_tool_call_structured_rows_validate_the_one_calls_payload():
  # NeMo-Gym's v4 structured rows answer with a function call: exactly one,
  # of tool_name, its arguments (under tool_payload_key when wrapped)
  # validated against the strict schema. Each row's `note` says what its
  # response does: 1 direct, right; 2 wrapped among numbered distractor
  # tools, right; 3 a distractor; 4 the payload unwrapped; 5 a string
  # year; 6 a property the strict schema forbids; 7 arguments not JSON;
  # 8 two calls; 9 the JSON as text, no call.
  rows = nemo_gym.read_rows(STRUCTURED_TOOL)
  assert {r.kind for r in rows} == {'structured_output'}
  got = nemo_gym.verify_rows(rows)
  assert [g['reward'] for g in got] == [1, 1, 0, 0, 0, 0, 0, 0, 0]
  assert [g['verifier_details'].get('error_type') for g in got] == [
      None, None, 'wrong_tool_name', 'missing_tool_payload_key',
      'validation_error', 'validation_error', 'tool_arguments_parse_error',
      'multiple_tool_calls', 'missing_tool_call']
  # The tools are in the prompt the model sees; as a domain the rows score
  # what verify scores, and the model's own call format earns the reward.
  assert '"name": "extraction_tool_2"' in rows[1].messages[0]['content']
  from cascade_jax import domains  # pylint: disable=g-import-not-at-top
  recs = [domains.nemo_gym_rl.record(r) for r in rows]
  dom = domains.get('nemo_gym')
  assert [s.reward for s in dom.verify(
      recs, [nemo_gym.response_text(r) for r in rows])] == [
          g['reward'] for g in got]
  good = json.loads(rows[0].raw['response']['output'][0]['arguments'])
  written = ('<think>fill it</think><tool_call>' + json.dumps(dict(
      name='extraction_tool_2', arguments=dict(extraction=good)))
             + '</tool_call>')
  assert [s.reward for s in dom.verify(recs[1:2], [written])] == [1.0]


def test_stateful_python_rollouts_are_verified_as_the_math_server_does(
    tmp_path):
  # NeMo-Gym's ns_tools rows (math with a stateful_python_code_exec tool):
  # the rollout's message items, not its calls or their outputs, against
  # expected_answer (tests/data/nemo_gym/stateful_python_rollouts.jsonl: a
  # call then the boxed answer; the answer only in a tool's output; a wrong
  # boxed answer after two calls; thoughts and a boxed answer, gold in $ $).
  rows = os.path.join(_DATA, 'stateful_python_rollouts.jsonl')
  out = tmp_path / 'verified.jsonl'
  res = _verify(rows, out)
  assert res.returncode == 0, res.stderr[-3000:]
  assert [json.loads(line)['reward'] for line in open(out)] == [1, 0, 0, 1]
  assert 'stateful_python              4     0.500' in res.stdout, res.stdout
  # Another tool beside the session's is refused, the known one named.
  row = json.loads(open(rows).readline())
  row['responses_create_params']['tools'].append(
      {'type': 'function', 'name': 'shell'})
  _assert_refused(tmp_path, row, 'field responses_create_params.tools names 2 '
                  'tools, but the row has no '
                  'expected_action, is no tool-call structured row and no '
                  'math row whose only tool is stateful_python_code_exec')
  row['responses_create_params']['tools'] = [
      {'type': 'web_search', 'name': 'stateful_python_code_exec'}]
  _assert_refused(tmp_path, row, 'field responses_create_params.tools[0] '
                  'must be a function tool')
