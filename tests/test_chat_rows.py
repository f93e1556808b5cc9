"""SFT rows in the public SFT set's chat-messages schema: JSONL and Parquet, through the packed SFT pipeline."""

import json
import os

import pytest

from cascade_jax import data

_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data',
                     'sft_chat')
ROWS = os.path.join(_DATA, 'rows.jsonl')


def _parquet(tmp_path, rows):
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  # As Hugging Face's conversion writes the set: messages as JSON text.
  table = pa.table({'id': [r['id'] for r in rows],
                    'messages': [r['messages'] if isinstance(r['messages'], str)
                                 else json.dumps(r['messages']) for r in rows]})
  path = tmp_path / 'rows.parquet'
  pq.write_table(table, path)
  return str(path)


def test_chat_rows_become_sft_records():
  recs, skipped = data.load_chat_rows(ROWS)
  assert not skipped and [r['id'] for r in recs] == [
      'math-0', 'chat-1', 'tool-2', 'math-3']
  # Reasoning before the content, as the model writes it; the prompt is
  # everything before the first assistant turn (the system turn included).
  assert recs[0]['response'] == ('<think>7 + 5: 7, 8, 9, 10, 11, 12.</think>'
                                 'The sum is \\boxed{12}.')
  assert [m['role'] for m in recs[0]['messages']] == ['system', 'user']
  assert recs[0]['domain'] == 'math_notool'          # other fields kept
  # A tool call in the format the environments parse, then the tool's turn.
  assert recs[2]['turns'] == [
      {'role': 'assistant', 'content': '<think>I should look it up.</think>'
       '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}'
       '</tool_call>'},
      {'role': 'tool', 'content': '{"temp_c": 4}'},
      {'role': 'assistant', 'content': 'It is 4 C in Oslo.'}]
  assert recs[3]['response'] == '\\boxed{6}'        # messages as JSON text


def test_parquet_rows_equal_jsonl_rows(tmp_path):
  want, _ = data.load_chat_rows(ROWS)
  rows = [json.loads(line) for line in open(ROWS)]
  got, _ = data.load_chat_rows(_parquet(tmp_path, rows))
  strip = lambda r: {k: r[k] for k in ('id', 'messages', 'response', 'turns')
                     if k in r}
  assert [strip(r) for r in got] == [strip(r) for r in want]


@pytest.mark.parametrize('row, says', [
    ('{"messages": [', 'not JSON'),
    ({'messages': []}, "field 'messages' must be a non-empty list"),
    ({'messages': '[{"role": "user"'}, "'messages' is a string but not JSON"),
    ({'messages': [{'role': 'human', 'content': 'x'}]},
     "field messages[0].role is 'human'"),
    ({'messages': [{'role': 'user', 'content': 'x'}]}, 'no assistant turn'),
    ({'messages': [{'role': 'assistant', 'content': 'x'}]},
     'must follow a user (or tool) turn'),
    ({'messages': [{'role': 'user', 'content': 'x'},
                   {'role': 'assistant', 'content': 'y'},
                   {'role': 'user', 'content': 'z'}]},
     'must end with an assistant turn'),
    ({'messages': [{'role': 'user', 'content': 'x'},
                   {'role': 'assistant', 'content': ''}]},
     'messages[1]: an assistant turn with no content'),
    ({'messages': [{'role': 'user', 'content': 'x'}, {
        'role': 'assistant', 'tool_calls': [{'function': {
            'name': 'f', 'arguments': '{bad'}}]}]},
     'messages[1].tool_calls[0].arguments is not JSON'),
    ({'messages': [{'role': 'user', 'content': 3},
                   {'role': 'assistant', 'content': 'y'}]},
     'messages[0].content must be a string'),
    ({'id': 'math-0', 'messages': [{'role': 'user', 'content': 'x'},
                                   {'role': 'assistant', 'content': 'y'}]},
     "'math-0' appears twice"),
])
def test_a_malformed_chat_row_names_file_row_and_field(tmp_path, row, says):
  path = tmp_path / 'bad.jsonl'
  path.write_text(open(ROWS).read() +
                  (row if isinstance(row, str) else json.dumps(row)) + '\n')
  with pytest.raises(data.ChatRowError) as e:
    data.load_chat_rows(str(path))
  assert str(e.value).startswith(f'{path}:5: ') and says in str(e.value), (
      e.value)
  recs, skipped = data.load_chat_rows(str(path), on_error='skip')
  assert len(recs) == 4 and len(skipped) == 1 and says in skipped[0][1]


def test_a_chat_source_mixes_with_a_generated_one_in_the_packed_stream(
    tmp_path):
  rows = [json.loads(line) for line in open(ROWS)]
  tok = data.train_tokenizer(['What is 7 + 5? The sum is 12. Oslo weather '
                              'tool call think'] * 50, 300)
  ds, reports = data.build_dataset(
      tok, {'chat': dict(weight=1.0, chat=_parquet(tmp_path, rows)),
            'math': dict(weight=1.0, n=20, levels=(1,))},
      seq_len=256, batch_size=4, seed=0)
  by = {r.name: r for r in reports}
  assert by['chat'].examples == 4 and by['math'].examples == 20
  batch = next(iter(ds))
  assert batch['inputs'].shape == (4, 256) and batch['mask'].sum() > 0
  with pytest.raises(ValueError, match='one of jsonl= .* and chat='):
    data.build_dataset(tok, {'x': dict(chat=ROWS, jsonl=ROWS)}, seq_len=64,
                       batch_size=2, seed=0)
  with pytest.raises(ValueError, match=r"chat rows are read from \('.jsonl'"):
    data.build_dataset(tok, {'x': dict(chat='/data/rows.csv')}, seq_len=64,
                       batch_size=2, seed=0)


def test_sft_config_names_chat_files_with_weights():
  from cascade_jax.sft import _trainer  # pylint: disable=g-import-not-at-top
  from configs import sft as sft_config  # pylint: disable=g-import-not-at-top
  c = sft_config.get_config('quick')
  c.data.chat_files = f'{ROWS}=2.5, /x/more.parquet'
  got = _trainer.sources(c)
  assert got['rows'] == dict(weight=2.5, chat=ROWS)
  assert got['more'] == dict(weight=1.0, chat='/x/more.parquet')
  assert 'math' in got                      # mixed with the generated ones
  c.data.generated_sources = False
  assert set(_trainer.sources(c)) == {'rows', 'more'}
  c.data.chat_files = f'{ROWS}=heavy'
  with pytest.raises(ValueError, match="'.*rows.jsonl=heavy' is not PATH=WEIGHT"):
    _trainer.sources(c)
  c.data.chat_files = ''
  with pytest.raises(ValueError, match='no SFT data'):
    _trainer.sources(c)


@pytest.mark.slow
def test_sft_trains_on_a_chat_file_alone(tmp_path, capsys):
  from cascade_jax import sft  # pylint: disable=g-import-not-at-top
  from configs import sft as sft_config  # pylint: disable=g-import-not-at-top
  rows = [json.loads(line) for line in open(ROWS)]
  c = sft_config.get_config('quick')
  c.mesh = type(c.mesh)({})
  c.steps, c.eval_n, c.data.batch_size = 2, 0, 2
  c.data.chat_files = _parquet(tmp_path, rows) + '=1'
  c.data.generated_sources = False
  sft.run(c, str(tmp_path / 'run'))
  out = capsys.readouterr().out
  assert '[sft] source rows: 4 examples' in out, out[-2000:]
  assert '[sft] source math' not in out
  assert os.path.isdir(tmp_path / 'run' / 'checkpoints' / '2')
