"""SFT rows in the public SFT set's chat-messages schema: JSONL and Parquet, through the packed SFT pipeline."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cascade_jax import data
from cascade_jax import domains

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
  with pytest.raises(ValueError, match='one of jsonl= .*chat= .*array_record='):
    data.build_dataset(tok, {'x': dict(chat=ROWS, jsonl=ROWS)}, seq_len=64,
                       batch_size=2, seed=0)
  with pytest.raises(ValueError, match=r"chat rows are read from \('.jsonl'"):
    data.build_dataset(tok, {'x': dict(chat='/data/rows.csv')}, seq_len=64,
                       batch_size=2, seed=0)


def test_sft_config_names_chat_files_with_weights():
  from cascade_jax.sft import _trainer  # pylint: disable=g-import-not-at-top
  from configs import sft as sft_config  # pylint: disable=g-import-not-at-top
  c = sft_config.get_config('quick')
  c.data.chat_files = f'{ROWS}=2.5, /x/more.parquet, /x/big.array_record=3'
  got = _trainer.sources(c)
  assert got['rows'] == dict(weight=2.5, chat=ROWS)
  assert got['more'] == dict(weight=1.0, chat='/x/more.parquet')
  assert got['big'] == dict(weight=3.0, array_record='/x/big.array_record')
  c.data.chat_files = f'{ROWS}=2.5, /x/more.parquet'
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
  # The same rows converted with that run's tokenizer, trained on alone.
  tok_path = str(tmp_path / 'run' / 'tokenizer.model')
  conv = str(tmp_path / 'rows.array_record')
  data.convert_chat_rows(data.load_tokenizer(tok_path),
                         [_parquet(tmp_path, rows)], conv,
                         seq_len=c.data.seq_len)
  c.data.chat_files, c.tokenizer.path = conv + '=1', tok_path
  sft.run(c, str(tmp_path / 'run2'))
  out = capsys.readouterr().out
  assert '[sft] source rows: 4 examples' in out, out[-2000:]
  assert os.path.isdir(tmp_path / 'run2' / 'checkpoints' / '2')


# ------------------------------------------------- converted to ArrayRecord


def _chat_file(tmp_path) -> str:
  """The fixture's rows, 30 generated math records as chat rows, one too
  long for seq_len 256 and one malformed."""
  rows = [json.loads(line) for line in open(ROWS)]
  for r in domains.generate('math', split='train', n=30, seed=0, levels=(1,)):
    rows.append(dict(id=r['id'], messages=r['messages'] + [
        {'role': 'assistant', 'content': r['response']}]))
  rows.append(dict(id='long', messages=[
      {'role': 'user', 'content': 'Count.'},
      {'role': 'assistant', 'content': ' '.join(['one two three'] * 200)}]))
  path = tmp_path / 'mix.jsonl'
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows)
                  + '{"messages": "not a list"}\n')
  return str(path)


def _tok():
  return data.train_tokenizer(['What is 7 + 5? The sum is 12. Oslo weather '
                               'tool call think one two three'] * 50, 300)


def test_an_array_record_source_streams_what_its_chat_file_does(tmp_path):
  tok, path = _tok(), _chat_file(tmp_path)
  out = str(tmp_path / 'mix.array_record')
  meta = data.convert_chat_rows(tok, [path], out, seq_len=256,
                                on_error='skip')
  f, = meta['files']
  assert (f['rows'], f['malformed'], f['too_long'], f['empty'],
          f['examples']) == (36, 1, 1, 0, 34)
  assert json.load(open(out + '.json')) == meta
  kw = dict(seq_len=256, batch_size=4, seed=3, too_long='skip')
  chat, r1 = data.build_dataset(tok, {'s': dict(chat=path, on_error='skip')},
                                **kw)
  conv, r2 = data.build_dataset(tok, {'s': dict(array_record=out)}, **kw)
  assert r1 == r2        # examples, tokens and every skip count
  a, b = iter(chat), iter(conv)
  for _ in range(6):     # the same packed batches, well past one epoch
    x, y = next(a), next(b)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)
  # Resumed from its saved iterator state: the batches that came next.
  state = b.get_state()
  want = [next(b) for _ in range(2)]
  c = iter(data.build_dataset(tok, {'s': dict(array_record=out)}, **kw)[0])
  c.set_state(state)
  for w in want:
    np.testing.assert_array_equal(next(c)['inputs'], w['inputs'])


def test_an_array_record_made_for_another_run_is_refused(tmp_path):
  tok, path = _tok(), _chat_file(tmp_path)
  out = str(tmp_path / 'mix.array_record')
  data.convert_chat_rows(tok, [path], out, seq_len=256, on_error='skip')
  build = lambda t, spec, **kw: data.build_dataset(
      t, {'s': spec}, **dict(dict(seq_len=256, batch_size=2, seed=0), **kw))
  other = data.train_tokenizer(['something else entirely'] * 50, 300)
  with pytest.raises(ValueError, match=r'was made with tokenizer .*this run '
                     "has '[0-9a-f]{16}'"):
    build(other, dict(array_record=out))
  with pytest.raises(ValueError, match='was made with loss_on'):
    build(tok, dict(array_record=out), loss_on='all')
  with pytest.raises(ValueError, match=r"up to seq_len 256 .* data.seq_len=128"):
    build(tok, dict(array_record=out), seq_len=128)
  with pytest.raises(ValueError, match=r"\['n'\] do not apply"):
    build(tok, dict(array_record=out, n=5))
  with pytest.raises(ValueError, match='cannot be trained on it'):
    data.source_records('s', dict(array_record=out), seed=0)
  os.remove(out + '.json')
  with pytest.raises(ValueError, match='mix.array_record.json .* missing'):
    build(tok, dict(array_record=out))
  with pytest.raises(ValueError, match="record long is .* tokens, over "
                     "seq_len=256 .*too_long='skip'"):
    data.convert_chat_rows(tok, [path], out, seq_len=256, on_error='skip',
                           too_long='error')


def test_convert_data_launcher(tmp_path):
  tok, path = _tok(), _chat_file(tmp_path)
  tok.save(str(tmp_path / 'tok.model'))
  out = tmp_path / 'mix.array_record'
  res = subprocess.run(
      [sys.executable, '-m', 'experiments.convert_data', f'--chat={path}',
       f'--tokenizer={tmp_path / "tok.model"}', '--seq_len=256',
       '--on_error=skip', f'--out={out}'],
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
      capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-2000:]
  assert 'wrote 34 examples' in res.stdout and 'mix.jsonl' in res.stdout
  meta = json.load(open(str(out) + '.json'))
  assert meta['tokenizer'] == data.tokenizer_fingerprint(tok)
  assert meta['provenance']['commit']
