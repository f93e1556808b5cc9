"""The JSONL record format shared by every domain: validation, loading, saving.

A record is one JSON object per line:

  id        str, required, unique within a file
  domain    str, required, a registered domain name
  messages  list of {"role": "system" | "user" | "assistant", "content": str}
            (or `prompt`: str, shorthand for one user message)
  response  str, optional: the reference response (SFT target)
  ...       what the domain's verifier needs (its `required_fields`), e.g.
            `answer` (math, multi_domain, long_context), `tests` +
            `entry_point` (code, swe), `constraints` (instruction_following),
            `chosen` + `rejected` (preference pairs)

Anything else is kept as it is (e.g. `level`, `source`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable

from cascade_jax.domains import _base

# A prompt's turns; `tool` (a function's output) comes from a conversation
# that already called one (NeMo-Gym tool-use rows).
ROLES = ('system', 'user', 'assistant', 'tool')


class RecordError(ValueError):
  """A malformed record; the message names the file, line and field."""


@dataclasses.dataclass
class LoadReport:
  """What a load read, kept and skipped (line number, reason)."""
  path: str
  read: int = 0
  kept: int = 0
  skipped: list[tuple[int, str]] = dataclasses.field(default_factory=list)

  def __str__(self):
    s = f'{self.path}: kept {self.kept} of {self.read} records'
    if self.skipped:
      s += f', skipped {len(self.skipped)} (first: line {self.skipped[0][0]}: '
      s += f'{self.skipped[0][1]})'
    return s


def _field_error(field: str, msg: str) -> RecordError:
  return RecordError(f'field {field!r}: {msg}')


def validate(raw: object, *, domain: str | None = None) -> _base.Record:
  """Checks one record and returns it normalised (`prompt` -> `messages`).

  Raises RecordError naming the field at fault.
  """
  if not isinstance(raw, dict):
    raise RecordError(f'a record must be a JSON object, got '
                      f'{type(raw).__name__}')
  rec = dict(raw)
  for field in ('id', 'domain'):
    if field not in rec:
      raise _field_error(field, 'is missing')
    if not isinstance(rec[field], str) or not rec[field]:
      raise _field_error(field, 'must be a non-empty string')
  if domain is not None and rec['domain'] != domain:
    raise _field_error('domain', f'is {rec["domain"]!r}, expected {domain!r}')
  try:
    dom = _base.get(rec['domain'])
  except ValueError as e:
    raise _field_error('domain', str(e)) from None
  if 'messages' not in rec:
    if 'prompt' not in rec:
      raise _field_error('messages', 'is missing (and there is no prompt)')
    if not isinstance(rec['prompt'], str) or not rec['prompt'].strip():
      raise _field_error('prompt', 'must be a non-empty string')
    rec['messages'] = _base.user(rec.pop('prompt'))
  msgs = rec['messages']
  if not isinstance(msgs, list) or not msgs:
    raise _field_error('messages', 'must be a non-empty list')
  for i, m in enumerate(msgs):
    if not isinstance(m, dict) or set(m) - {'role', 'content'} or (
        m.get('role') not in ROLES) or not isinstance(m.get('content'), str):
      raise _field_error(f'messages[{i}]',
                         f'must be {{"role": one of {ROLES}, "content": str}}')
  if msgs[-1]['role'] not in ('user', 'tool'):
    raise _field_error('messages', "must end with a user (or tool) message")
  if 'response' in rec and not isinstance(rec['response'], str):
    raise _field_error('response', 'must be a string')
  for field in dom.required_fields:
    if field not in rec:
      raise _field_error(field, f'is missing (domain {dom.name!r} needs '
                         f'{list(dom.required_fields)})')
  return rec


def load_jsonl(path: str, *, domain: str | None = None,
               on_error: str = 'raise') -> tuple[list[_base.Record], LoadReport]:
  """Loads and validates a JSONL file of records.

  Args:
    path: the file.
    domain: if set, every record must belong to it.
    on_error: 'raise' (default): the first bad row raises RecordError naming
      file, line and field; 'skip': bad rows are skipped and counted in the
      report, with their reasons.
  """
  if on_error not in ('raise', 'skip'):
    raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
  if not os.path.exists(path):
    raise FileNotFoundError(f'records file {path} does not exist')
  report = LoadReport(path)
  out, ids = [], set()
  with open(path, encoding='utf-8') as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      report.read += 1
      try:
        try:
          raw = json.loads(line)
        except json.JSONDecodeError as e:
          raise RecordError(f'invalid JSON: {e.msg} at column {e.colno}') from None
        rec = validate(raw, domain=domain)
        if rec['id'] in ids:
          raise _field_error('id', f'{rec["id"]!r} appears twice')
      except RecordError as e:
        if on_error == 'raise':
          raise RecordError(f'{path}:{lineno}: {e}') from None
        report.skipped.append((lineno, str(e)))
        continue
      ids.add(rec['id'])
      out.append(rec)
  report.kept = len(out)
  return out, report


def save_jsonl(records: Iterable[_base.Record], path: str) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    for rec in records:
      f.write(json.dumps(rec, ensure_ascii=False) + '\n')


def prompt_of(record: _base.Record) -> str:
  """The last user message: what the verifier's task is stated in."""
  return record['messages'][-1]['content']

