"""SFT rows in the chat-messages schema (the public Nemotron-Cascade-2 SFT set's), from JSONL or Parquet.

A row holds `messages`: a list (or its JSON text, as Parquet conversions
store it) of

  {"role": "system" | "user" | "assistant" | "tool", "content": str,
   "reasoning_content": str (assistant, optional),
   "tool_calls": [{"function": {"name": str, "arguments": obj | JSON str}}
                  or {"name": ..., "arguments": ...}] (assistant, optional)}

and optionally `id` (else FILE:N) and other fields (kept). The messages
before the first assistant turn are the prompt; an assistant turn is
written as the model would produce it: `<think>reasoning</think>` before
the content when there is reasoning, each tool call after it as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the format the
environments parse); `tool` turns are the environment's. One assistant
turn gives a record with a `response`; more give `turns` (a multi-turn
demonstration, loss on the assistant turns). Any malformed row is an error
naming the file, the row and the field, or (on_error='skip') is skipped and
counted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

from cascade_jax.data._tokenizer import TOOL_END
from cascade_jax.data._tokenizer import TOOL_START

ROLES = ('system', 'user', 'assistant', 'tool')
FORMATS = ('.jsonl', '.json', '.parquet')


class ChatRowError(ValueError):
  """A row that does not fit the chat-messages schema."""


def _rows(path: str) -> Iterator[tuple[str, object]]:
  """(where, row) for each row of a JSONL or Parquet file."""
  if os.path.splitext(path)[1].lower() == '.parquet':
    try:
      import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError(f'{path}: reading Parquet needs pyarrow (an '
                        'install requirement of cascade_jax)') from e
    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
      for row in batch.to_pylist():
        n += 1
        yield f'{path}:row {n}', row
    return
  with open(path, encoding='utf-8') as f:
    for i, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        yield f'{path}:{i}', json.loads(line)
      except json.JSONDecodeError as e:
        yield f'{path}:{i}', ChatRowError(f'not JSON ({e.msg} at column '
                                          f'{e.colno})')


def _tool_call(call, field: str) -> str:
  if not isinstance(call, dict):
    raise ChatRowError(f'field {field} must be an object')
  fn = call.get('function', call)
  name, args = (fn.get('name'), fn.get('arguments', {})) if isinstance(
      fn, dict) else (None, None)
  if not isinstance(name, str) or not name:
    raise ChatRowError(f'field {field}: a tool call needs a "name" string')
  if isinstance(args, str):
    try:
      args = json.loads(args) if args.strip() else {}
    except json.JSONDecodeError:
      raise ChatRowError(f'field {field}.arguments is not JSON') from None
  if not isinstance(args, dict):
    raise ChatRowError(f'field {field}.arguments must be an object')
  return TOOL_START + json.dumps({'name': name, 'arguments': args},
                                 ensure_ascii=False) + TOOL_END


def _assistant_text(m: dict, field: str) -> str:
  content = m.get('content') or ''
  reasoning = m.get('reasoning_content') or ''
  for key, val in (('content', content), ('reasoning_content', reasoning)):
    if not isinstance(val, str):
      raise ChatRowError(f'field {field}.{key} must be a string')
  calls = m.get('tool_calls') or []
  if not isinstance(calls, list):
    raise ChatRowError(f'field {field}.tool_calls must be a list')
  text = (f'<think>{reasoning}</think>' if reasoning else '') + content
  text += ''.join(_tool_call(c, f'{field}.tool_calls[{k}]')
                  for k, c in enumerate(calls))
  if not text.strip():
    raise ChatRowError(f'field {field}: an assistant turn with no content, '
                       'reasoning or tool call')
  return text


def to_record(row, default_id: str) -> dict:
  """One row as an SFT record (messages + response, or + turns)."""
  if not isinstance(row, dict):
    raise ChatRowError(f'a row is an object, got {type(row).__name__}')
  messages = row.get('messages')
  if isinstance(messages, str):
    try:
      messages = json.loads(messages)
    except json.JSONDecodeError:
      raise ChatRowError("field 'messages' is a string but not JSON") from None
  if not isinstance(messages, list) or not messages:
    raise ChatRowError("field 'messages' must be a non-empty list")
  prompt, turns = [], []
  for j, m in enumerate(messages):
    field = f'messages[{j}]'
    if not isinstance(m, dict):
      raise ChatRowError(f'field {field} must be an object')
    role = m.get('role')
    if role not in ROLES:
      raise ChatRowError(f'field {field}.role is {role!r}; one of {ROLES}')
    if role == 'assistant':
      turns.append({'role': 'assistant',
                    'content': _assistant_text(m, field)})
      continue
    content = m.get('content')
    if not isinstance(content, str):
      raise ChatRowError(f'field {field}.content must be a string')
    (turns if turns else prompt).append({'role': role, 'content': content})
  if not turns:
    raise ChatRowError("field 'messages' has no assistant turn")
  if not prompt or prompt[-1]['role'] not in ('user', 'tool'):
    raise ChatRowError("field 'messages': the first assistant turn must "
                       'follow a user (or tool) turn')
  if turns[-1]['role'] != 'assistant':
    raise ChatRowError("field 'messages' must end with an assistant turn")
  rid = row.get('id')
  rec = {k: v for k, v in row.items() if k not in ('messages', 'id')}
  rec.update(id=str(rid) if rid not in (None, '') else default_id,
             messages=prompt)
  if len(turns) == 1:
    rec['response'] = turns[0]['content']
  else:
    rec['turns'] = turns
  return rec


def iter_chat_rows(path: str, *, on_error: str = 'raise',
                   skipped: list | None = None) -> Iterator[dict]:
  """The SFT records of a chat-messages file, row by row; rows skipped
  (on_error='skip') are appended to `skipped` as (where, why)."""
  if on_error not in ('raise', 'skip'):
    raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
  if os.path.splitext(path)[1].lower() not in FORMATS:
    raise ValueError(f'{path}: chat rows are read from {FORMATS} files')
  if not os.path.isfile(path):
    raise FileNotFoundError(f'chat rows file {path} does not exist')
  skipped = [] if skipped is None else skipped
  ids = set()
  for n, (where, row) in enumerate(_rows(path), 1):
    try:
      if isinstance(row, ChatRowError):
        raise row
      rec = to_record(row, f'{os.path.basename(path)}:{n}')
      if rec['id'] in ids:
        raise ChatRowError(f"field 'id': {rec['id']!r} appears twice")
    except ChatRowError as e:
      if on_error == 'raise':
        raise ChatRowError(f'{where}: {e}') from None
      skipped.append((where, str(e)))
      continue
    ids.add(rec['id'])
    yield rec


def load_chat_rows(path: str, *, on_error: str = 'raise'
                   ) -> tuple[list[dict], list[tuple[str, str]]]:
  """SFT records from a chat-messages file, and the rows skipped (where,
  why) when on_error='skip'."""
  skipped: list = []
  out = list(iter_chat_rows(path, on_error=on_error, skipped=skipped))
  if not out:
    raise ChatRowError(f'{path}: no usable rows ({len(skipped)} skipped)')
  return out, skipped
