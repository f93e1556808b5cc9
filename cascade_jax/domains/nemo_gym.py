"""NeMo-Gym rows (the format of Nemotron-Cascade 2's public RL set): read, checked, verified.

A row is one JSON object a line:

  responses_create_params.input   the prompt messages ({role, content}; a
                                  content is a string or a list of
                                  {type: input_text | output_text, text})
  agent_ref                       optional: the agent that served it
  the verifier's fields, by kind:
    math                   expected_answer (top level or verifier_metadata)
    code                   verifier_metadata.unit_tests = {inputs, outputs}:
                           stdin and the expected stdout of each test
    instruction_following  instruction_id_list, kwargs, grading_mode
                           (verifier_metadata, or top level in older rows)
    structured_output      schema_str (a JSON schema), schema_type (json,
                           the default; yaml; toml; xml; csv); v4 rows
                           answer with a call: response_mode tool_call,
                           tool_name, tool_payload_key, and the tools
    mcqa                   options (a list of {letter: text}) and
                           expected_answer (the gold letter), top level;
                           grading_mode, template_metadata.output_regex
    tool_call              expected_action (the next action: a function
                           call, a batch of them, or a message), with
                           responses_create_params.tools; the input holds
                           the conversation so far, function calls and
                           their outputs included (`_tool_call`)
    stateful_python        expected_answer, and responses_create_params.
                           tools holding only stateful_python_code_exec
                           (NeMo-Gym's ns_tools rows: math with a Python
                           session; for RL, domain nemo_gym_python)
    workplace              ground_truth (the calls that do the task) and
                           the tools; environment_name workplace_assistant
                           (WorkBench: `_workplace`, the tables it acts on
                           given with --workplace_db)

A rollout row adds `response`, in the Responses API's output format:
`output[]` items of type `message` whose `content[]` items of type
`output_text` hold the text; other items (`reasoning`, tool calls) are not
the answer, except in tool-use rows, where `function_call` items are the
action.

Verification follows the reference implementations:
- math: as NeMo-Gym's math_with_judge server without its judge: 0 unless
  the response has a complete, non-empty last \\boxed{}; then math-verify,
  the gold answer (outer $ $ or \\( \\) removed) boxed and read as LaTeX,
  the response read as LaTeX or a plain expression (the configuration
  NeMo-Gym's and verl's math rewards use).
- code (`_stdio_tests`): the last fenced block of the response, run in
  the sandbox once per test with the test's stdin; its stdout is compared as LiveCodeBench does
  (whole output stripped, then line by line, each line stripped; a line
  that differs passes if its tokens are numbers that agree, floats within
  1e-6 absolute or relative, integers exactly); the first failing test is
  reported (wrong answer, time limit, runtime error).
- instruction following: the IFEval and IFBench checkers (the if-verifiable
  package's registries) and the IF-RLVR training instructions (written here
  from their published definitions, `_if_rlvr`; `_if_registry` says which
  run on a fallback for nltk data that is not installed, and which cannot
  run), strict mode, one verdict an instruction (`follow_instruction_list`,
  as NeMo-Gym writes it); the reward is the share met with grading_mode
  'fraction', else 1 only when all are met. Rows with ids outside those
  registries, or kwargs their checker refuses, are refused, named, before
  any work.
- structured output (NeMo-Gym's structured_outputs server, the recipe's
  multi-domain RL's 15%): the response text (after any think block) parsed
  as its schema_type, validated with openapi-schema-validator against the
  schema made strict as the reference makes it (every object's properties
  all required, no others); 1 when it validates. XML (read by xmltodict, as
  the reference reads it) and CSV (a header row, then one object a row)
  hold strings only: each value is first turned into its schema's type
  where it reads as one (`_coerce_xml`, `_coerce_csv`). v4 tool-call rows
  (`response_mode: tool_call`): exactly one call, of `tool_name`, its
  arguments (under `tool_payload_key` when set) validated the same way
  (missing_tool_call, multiple_tool_calls, wrong_tool_name,
  tool_arguments_parse_error, missing_tool_payload_key).
- stateful Python (ns_tools): as math, on the rollout's message text (its
  calls and their outputs are not the answer), as that server delegates to
  the math server.
- conversational tool use (NeMo-Gym's single-step tool-use server, the
  agentic tool-use RL set): the response's calls (else its text, a
  message) against the expected action, arguments compared as that server
  compares them (word overlap for strings, a tolerance for numbers, calls
  matched as a multiset); `_tool_call`.
- workplace assistant (`_workplace`): the response's `function_call`
  items run on fresh copies of the tables, the ground truth's on others; 1
  when the tables they leave are equal (strings without case, as the
  reference compares them).
- multiple choice (NeMo-Gym's mcqa server, the knowledge-MCQA RL set): the
  letter read from the response as that server reads it in the row's
  grading mode (`_mcqa`: the last boxed letter by default, `Answer:` lines,
  option texts, the row's own regex first); 1 when it is the gold letter.

Any malformed row is an error naming the file, the line and the field.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

from cascade_jax import envs
from cascade_jax.domains import _base
from cascade_jax.domains import _if_registry
from cascade_jax.domains import _mcqa
from cascade_jax.domains._stdio_tests import code_reward
from cascade_jax.domains._stdio_tests import last_fenced_block  # noqa: F401
from cascade_jax.domains._stdio_tests import outputs_match  # noqa: F401
from cascade_jax.domains._stdio_tests import TEST_LIMITS
from cascade_jax.domains import _tool_call
from cascade_jax.domains import _workplace
from cascade_jax.domains._structured import SCHEMA_TYPES
from cascade_jax.domains._structured import structured_reward
from cascade_jax.sandbox import Sandbox

KINDS = ('math', 'code', 'instruction_following', 'structured_output', 'mcqa',
         'tool_call', 'stateful_python', 'workplace')
GRADING_MODES = ('binary', 'fraction')


class RowError(ValueError):
  """A row that does not fit the format: names the file, line and field."""


@dataclasses.dataclass(frozen=True)
class Row:
  kind: str
  messages: list[dict]       # {role, content} with string contents
  fields: dict               # the verifier's fields
  raw: dict                  # the row as read
  where: str                 # 'FILE:LINE'


# ------------------------------------------------------------------ reading


def read_rows(path: str) -> list[Row]:
  """Every row of a JSONL file, checked; the first bad one raises RowError."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path}: no such file')
  rows = []
  with open(path, encoding='utf-8') as f:
    for i, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f'{path}:{i}'
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise RowError(f'{where}: not JSON ({e.msg} at column {e.colno})'
                       ) from None
      rows.append(parse_row(obj, where))
  if not rows:
    raise RowError(f'{path}: no rows')
  return rows


def _get(obj: Any, dotted: str, where: str, kind: type | tuple = object):
  cur = obj
  for part in dotted.split('.'):
    if not isinstance(cur, dict) or part not in cur:
      raise RowError(f'{where}: missing field {dotted!r}')
    cur = cur[part]
  if not isinstance(cur, kind):
    raise RowError(f'{where}: field {dotted!r} must be '
                   f'{getattr(kind, "__name__", kind)}, got '
                   f'{type(cur).__name__}')
  return cur


def _text(content, where: str, field: str) -> str:
  if isinstance(content, str):
    return content
  if not isinstance(content, list):
    raise RowError(f'{where}: field {field!r} must be a string or a list of '
                   f'text parts, got {type(content).__name__}')
  parts = []
  for j, part in enumerate(content):
    kind = part.get('type') if isinstance(part, dict) else None
    if kind not in ('input_text', 'output_text', 'text'):
      raise RowError(f'{where}: field {field}[{j}] is a {kind!r} part; only '
                     'text parts are read')
    parts.append(_get(part, 'text', where, str))
  return ''.join(parts)


def _messages(obj: dict, where: str) -> list[dict]:
  items = _get(obj, 'responses_create_params.input', where, (list, str))
  if isinstance(items, str):            # the API's shorthand: one user turn
    return [{'role': 'user', 'content': items}]
  out = []
  for j, m in enumerate(items):
    field = f'responses_create_params.input[{j}]'
    if not isinstance(m, dict):
      raise RowError(f'{where}: field {field!r} must be an object')
    if m.get('type', 'message') != 'message':   # calls, outputs, reasoning
      try:
        turn = _tool_call.history_item(
            m, field, lambda c, f: _text(c, where, f))
      except _tool_call.ToolRowError as e:
        raise RowError(f'{where}: {e}') from None
    else:
      role = _get(m, 'role', where, str)
      if role not in ('system', 'developer', 'user', 'assistant'):
        raise RowError(f'{where}: field {field}.role is {role!r}; one of '
                       'system, developer, user, assistant')
      turn = {'role': 'system' if role == 'developer' else role,
              'content': _text(m.get('content'), where, f'{field}.content')}
    if turn is None:
      continue
    if out and turn['role'] == out[-1]['role'] == 'assistant':
      out[-1] = dict(out[-1], content=out[-1]['content'] + turn['content'])
    else:                # a message and its calls are one assistant turn
      out.append(turn)
  if not out:
    raise RowError(f'{where}: field responses_create_params.input is empty')
  return out


def _verifier_field(obj: dict, name: str):
  meta = obj.get('verifier_metadata')
  if isinstance(meta, dict) and name in meta:
    return meta[name], f'verifier_metadata.{name}'
  if name in obj:
    return obj[name], name
  return None, None


def parse_row(obj: Any, where: str) -> Row:
  """One row, checked, its kind decided by its fields."""
  if not isinstance(obj, dict):
    raise RowError(f'{where}: a row is a JSON object, got '
                   f'{type(obj).__name__}')
  messages = _messages(obj, where)
  tools = obj['responses_create_params'].get('tools') or []
  if 'expected_action' in obj:  # conversational tool use: the next action
    return _tool_row(obj, messages, tools, where)
  if _workplace.is_row(obj):    # WorkBench: the calls that do the task
    try:
      fields = dict(ground_truth=_workplace.calls_field(
          obj.get('ground_truth'), 'ground_truth'))
      text = _tool_call.tools_text(tools) if tools else ''
    except (ValueError, _tool_call.ToolRowError) as e:
      raise RowError(f'{where}: {e}') from None
    return Row('workplace', _with_system(messages, text) if text else
               messages, fields, obj, where)
  answer, answer_at = _verifier_field(obj, 'expected_answer')
  if tools and answer is not None and all(
      isinstance(t, dict) and t.get('name') == envs.PYTHON_TOOL
      for t in tools):           # math with a stateful Python session
    try:
      text = _tool_call.tools_text(tools)
    except _tool_call.ToolRowError as e:
      raise RowError(f'{where}: {e}') from None
    return Row('stateful_python', _with_system(messages, text),
               dict(expected_answer=_math_answer(answer, answer_at, where)),
               obj, where)
  if tools and _verifier_field(obj, 'response_mode')[0] != 'tool_call':
    raise RowError(f'{where}: field responses_create_params.tools names '
                   f'{len(tools)} tools, but the row has no expected_action, '
                   'is no tool-call structured row and no math row whose '
                   f'only tool is {envs.PYTHON_TOOL} (only those carry tools '
                   'here)')
  if 'options' in obj:        # multiple choice: its gold is a letter
    return Row('mcqa', messages, _mcqa_fields(obj, where), obj, where)
  ids, ids_at = _verifier_field(obj, 'instruction_id_list')
  schema, schema_at = _verifier_field(obj, 'schema_str')
  meta = obj.get('verifier_metadata')
  tests = meta.get('unit_tests') if isinstance(meta, dict) else None
  found = [k for k, v in (('instruction_following', ids), ('math', answer),
                          ('code', tests), ('structured_output', schema))
           if v is not None]
  if len(found) != 1:
    raise RowError(
        f'{where}: ' + ('no verifier fields (instruction_id_list, '
                        'expected_answer, verifier_metadata.unit_tests or '
                        f'schema_str); keys: {sorted(obj)}' if not found else
                        f'fields of several kinds: {found}'))
  kind = found[0]
  if kind == 'structured_output':
    fields = _structured_fields(obj, schema, schema_at, where)
    prompt = fields.pop('tools_prompt', None)
    if prompt:                 # the tools, shown as tool-use rows show them
      messages = _with_system(messages, prompt)
  elif kind == 'math':
    fields = dict(expected_answer=_math_answer(answer, answer_at, where))
  elif kind == 'code':
    inputs = _get(tests, 'inputs', where, list)
    outputs = _get(tests, 'outputs', where, list)
    if len(inputs) != len(outputs) or not inputs:
      raise RowError(f'{where}: field verifier_metadata.unit_tests has '
                     f'{len(inputs)} inputs and {len(outputs)} outputs')
    for name, vals in (('inputs', inputs), ('outputs', outputs)):
      bad = [j for j, v in enumerate(vals) if not isinstance(v, str)]
      if bad:
        raise RowError(f'{where}: field verifier_metadata.unit_tests.{name}'
                       f'[{bad[0]}] must be a string')
    fields = dict(inputs=inputs, outputs=outputs)
  else:
    if not (isinstance(ids, list) and ids and
            all(isinstance(i, str) for i in ids)):
      raise RowError(f'{where}: field {ids_at!r} must be a non-empty list of '
                     'strings')
    kwargs, kwargs_at = _verifier_field(obj, 'kwargs')
    kwargs = [{}] * len(ids) if kwargs is None else kwargs
    if not isinstance(kwargs, list) or len(kwargs) != len(ids) or not all(
        k is None or isinstance(k, dict) for k in kwargs):
      raise RowError(f'{where}: field {kwargs_at!r} must be a list of '
                     f'{len(ids)} objects (or nulls), one an instruction')
    mode, mode_at = _verifier_field(obj, 'grading_mode')
    if mode is not None and mode not in GRADING_MODES:
      raise RowError(f'{where}: field {mode_at!r} is {mode!r}; one of '
                     f'{GRADING_MODES}')
    prompt, _ = _verifier_field(obj, 'prompt')
    if prompt is None:
      prompt = next((m['content'] for m in reversed(messages)
                     if m['role'] == 'user'), '')
    fields = dict(instruction_id_list=ids,
                  kwargs=[k or {} for k in kwargs],
                  grading_mode=mode or 'binary', prompt=str(prompt))
  return Row(kind, messages, fields, obj, where)


def _math_answer(answer, answer_at: str, where: str) -> str:
  if not isinstance(answer, (str, int, float)) or isinstance(answer, bool):
    raise RowError(f'{where}: field {answer_at!r} must be a string or a '
                   f'number, got {type(answer).__name__}')
  return str(answer)


def _with_system(messages: list[dict], text: str) -> list[dict]:
  """The messages with `text` at the end of the system prompt (or as one)."""
  if messages[0]['role'] == 'system':
    return [dict(messages[0], content=messages[0]['content'] + '\n\n' + text)
            ] + messages[1:]
  return [{'role': 'system', 'content': text}] + messages


def _tool_row(obj: dict, messages: list[dict], tools, where: str) -> Row:
  try:
    expected = _tool_call.expected_action(obj['expected_action'])
    text = _tool_call.tools_text(tools) if tools else ''
  except _tool_call.ToolRowError as e:
    raise RowError(f'{where}: {e}') from None
  if expected['type'] == 'calls' and not tools:
    raise RowError(f'{where}: field expected_action is a call, but '
                   'responses_create_params.tools names no tools')
  if text:
    messages = _with_system(messages, text)
  if messages[-1]['role'] == 'assistant':
    raise RowError(f'{where}: field responses_create_params.input ends with '
                   "the assistant's turn; the expected action is the next one")
  return Row('tool_call', messages, dict(expected_action=expected), obj, where)


def _mcqa_fields(obj: dict, where: str) -> dict:
  options = obj['options']
  if not (isinstance(options, list) and options and all(
      isinstance(e, dict) and e and all(
          isinstance(k, str) and len(k) == 1 and k.isalpha() and
          (v is None or isinstance(v, str)) for k, v in e.items())
      for e in options)):
    raise RowError(f'{where}: field \'options\' must be a non-empty list of '
                   'objects mapping one letter to its option text, e.g. '
                   '[{"A": "..."}, {"B": "..."}]')
  allowed = _mcqa.letters(options)
  gold = obj.get('expected_answer')
  if not isinstance(gold, str) or gold.strip().upper() not in allowed:
    raise RowError(f'{where}: field \'expected_answer\' must be one of the '
                   f'options\' letters {sorted(allowed)}, got {gold!r}')
  mode = obj.get('grading_mode') or _mcqa.GRADING_MODES[0]
  if mode not in _mcqa.GRADING_MODES:
    raise RowError(f'{where}: field \'grading_mode\' is {mode!r}; one of '
                   f'{_mcqa.GRADING_MODES}')
  meta = obj.get('template_metadata') or {}
  regex = meta.get('output_regex') if isinstance(meta, dict) else None
  if regex is not None and not (isinstance(regex, str) or (
      isinstance(regex, list) and all(isinstance(r, str) for r in regex))):
    raise RowError(f'{where}: field \'template_metadata.output_regex\' must '
                   'be a pattern or a list of patterns')
  return dict(options=options, expected_answer=gold.strip().upper(),
              grading_mode=mode, output_regex=regex)


def _structured_fields(obj: dict, schema, schema_at: str, where: str) -> dict:
  stype, stype_at = _verifier_field(obj, 'schema_type')
  stype = 'json' if stype is None else stype
  if not isinstance(stype, str) or stype.lower() not in SCHEMA_TYPES:
    raise RowError(f'{where}: field {stype_at!r} is {stype!r}; one of '
                   f'{SCHEMA_TYPES}')
  mode, mode_at = _verifier_field(obj, 'response_mode')
  if mode not in (None, 'text', 'tool_call'):
    raise RowError(f'{where}: field {mode_at!r} is {mode!r}; one of text, '
                   'tool_call')
  tool = {}
  if mode == 'tool_call':     # v4: the answer is one call's arguments
    name, key = obj.get('tool_name'), obj.get('tool_payload_key')
    tools = obj['responses_create_params'].get('tools') or []
    names = [t.get('name') for t in tools if isinstance(t, dict)]
    if not isinstance(name, str) or name not in names:
      raise RowError(f"{where}: field 'tool_name' is {name!r}; it must name "
                     f'one of responses_create_params.tools ({names[:8]})')
    if key is not None and not isinstance(key, str):
      raise RowError(f"{where}: field 'tool_payload_key' must be a string "
                     'or null')
    try:
      tools_prompt = _tool_call.tools_text(tools)
    except _tool_call.ToolRowError as e:
      raise RowError(f'{where}: {e}') from None
    tool = dict(response_mode='tool_call', tool_name=name,
                tool_payload_key=key, tools_prompt=tools_prompt)
  if not isinstance(schema, str):
    raise RowError(f'{where}: field {schema_at!r} must be a string (a JSON '
                   f'schema), got {type(schema).__name__}')
  try:
    parsed = json.loads(schema)
  except json.JSONDecodeError as e:
    raise RowError(f'{where}: field {schema_at!r} is not JSON ({e.msg} at '
                   f'column {e.colno})') from None
  if not isinstance(parsed, dict):
    raise RowError(f'{where}: field {schema_at!r} must hold a JSON object')
  return dict(schema_str=schema, schema_type=stype.lower(), **tool)


def response_text(row: Row) -> str:
  """The answer text of a rollout row's `response` (Responses API output)."""
  output = _get(row.raw, 'response.output', row.where, list)
  if row.kind == 'workplace':                # the calls are the answer
    return json.dumps(_workplace.response_calls(output))
  texts = []
  for j, item in enumerate(output):
    if ((row.kind == 'tool_call' or row.fields.get('response_mode') ==
         'tool_call') and isinstance(item, dict)
        and item.get('type') == 'function_call'):   # the action, as written
      name = _get(item, 'name', row.where, str)
      texts.append(_tool_call.call_text(name, item.get('arguments', '')))
      continue
    if not isinstance(item, dict) or item.get('type') != 'message':
      continue                        # reasoning, tool calls: not the answer
    content = item.get('content')
    if not isinstance(content, list):
      raise RowError(f'{row.where}: field response.output[{j}].content must '
                     'be a list')
    texts += [_get(c, 'text', row.where, str) for c in content
              if isinstance(c, dict) and c.get('type') == 'output_text']
  return ''.join(texts)


# --------------------------------------------------------------- verifying


def _strip_math_delimiters(answer: str) -> str:
  """A gold answer without its outer \\( \\) or $ $ (math-verify reads a
  boxed gold with them as nothing)."""
  s = answer.strip()
  if s.startswith('\\(') and s.endswith('\\)'):
    s = s[2:-2].strip()
  if len(s) > 1 and s.startswith('$') and s.endswith('$'):
    s = s[1:-1].strip()
  return s


def math_reward(expected_answer: str, response: str) -> tuple[float, dict]:
  """NeMo-Gym's math_with_judge without its judge: 0 unless the response
  (thoughts removed) has a complete, non-empty last \\boxed{}; then
  math-verify's verdict, the gold (its outer $ $ or \\( \\) removed) boxed
  and read as LaTeX, the response read as LaTeX or a plain expression.
  (Before that server required the box, an unboxed final answer could
  pass: `experiments.verify` follows the server as it is now.)"""
  # Imported here: math_verify loads sympy (seconds) and only math needs it.
  from math_verify.metric import math_metric  # pylint: disable=g-import-not-at-top
  from math_verify.parser import ExprExtractionConfig  # pylint: disable=g-import-not-at-top
  from math_verify.parser import LatexExtractionConfig  # pylint: disable=g-import-not-at-top
  metric = math_metric(
      gold_extraction_target=(LatexExtractionConfig(),),
      pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))
  gold = _strip_math_delimiters(expected_answer)
  if not gold.startswith('\\boxed{'):
    gold = '\\boxed{' + gold + '}'
  response = _base.strip_think(response)
  if not (_mcqa.last_box(response) or '').strip():
    return 0.0, dict(error='no \\boxed{} answer')
  try:
    score, extracted = metric([gold], [response])
  except Exception as e:  # pylint: disable=broad-except
    return 0.0, dict(error=f'{type(e).__name__}: {e}'[:300])
  return float(score), dict(extracted=[str(x) for x in (extracted or ())])


def if_reward(fields: dict, response: str) -> tuple[float, dict, dict]:
  """(reward, details, NeMo-Gym's per-instruction fields) of an
  instruction-following row."""
  ids = fields['instruction_id_list']
  ok = _if_registry.follows(ids, fields['kwargs'], fields['prompt'],
                            _base.strip_think(response))
  reward = (sum(ok) / len(ok) if fields['grading_mode'] == 'fraction'
            else float(all(ok)))
  details = dict(grading_mode=fields['grading_mode'])
  differs = {i: _if_registry.DIFFERS[i] for i in ids
             if i in _if_registry.DIFFERS}
  if differs:
    details['differs_from_reference'] = differs
  return reward, details, dict(follow_instruction_list=ok,
                               follow_all_instructions=all(ok))


def reward_all(items: Sequence[tuple[str, dict]], texts: Sequence[str], *,
               sandbox: Sandbox | None, workers: int, finish,
               workplace_db: str = '') -> None:
  """Each (kind, verifier fields) item's reward for its text, reported as
  `finish(i, reward, details, extra)` when decided: code on a pool of
  `workers` threads through `sandbox`, math and instruction following on
  this thread (math-verify's time limit is SIGALRM's, the main thread's)."""
  code = [i for i, (kind, _) in enumerate(items) if kind == 'code']
  with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
    futures = {pool.submit(code_reward, items[i][1]['inputs'],
                           items[i][1]['outputs'], texts[i], sandbox): i
               for i in code}
    for i, ((kind, fields), text) in enumerate(zip(items, texts, strict=True)):
      if kind in ('math', 'stateful_python'):   # the episode's messages
        finish(i, *math_reward(fields['expected_answer'], text))
      elif kind == 'instruction_following':
        finish(i, *if_reward(fields, text))
      elif kind == 'structured_output':
        finish(i, *structured_reward(fields, text))
      elif kind == 'mcqa':
        finish(i, *_mcqa.reward(fields, text))
      elif kind == 'tool_call':
        finish(i, *_tool_call.reward(fields, text))
      elif kind == 'workplace':   # the text: the calls, as JSON
        finish(i, *_workplace.verdict(json.loads(text), fields, workplace_db))
      elif kind != 'code':
        raise ValueError(f'nemo_gym: item {i} has kind {kind!r}; known: '
                         f'{KINDS}')
    for f in concurrent.futures.as_completed(futures):
      finish(futures[f], *f.result())


def verify_rows(rows: Sequence[Row], *, sandbox: Sandbox | None = None,
                workers: int = 1, progress=None,
                workplace_db: str = '') -> list[dict]:
  """Each rollout row as read, with `reward` and the verifier's details
  (`verifier_details`), in order. Rows of a kind not verifiable here are
  refused before any work, named. A row whose instructions need checker
  data that is not installed (`unverifiable`) is not verified: it comes
  back with `reward` None and `verifier_details.skipped`, the reason."""
  skipped = unverifiable(rows)
  refused = [(r, bad) for i, r in enumerate(rows)
             if r.kind == 'instruction_following' and i not in skipped
             and (bad := _if_registry.unknown_ids(
                 r.fields['instruction_id_list'], r.fields['kwargs']))]
  if refused:
    ids = {i: why for _, bad in refused for i, why in bad.items()}
    raise RowError(
        f'{refused[0][0].where} (and {len(refused) - 1} more rows): '
        f'instructions that cannot be checked here: '
        f'{dict(sorted(ids.items())[:12])}{" ..." if len(ids) > 12 else ""}')
  out: list[dict | None] = [None] * len(rows)
  for i, why in skipped.items():
    out[i] = dict(rows[i].raw, reward=None,
                  verifier_details=dict(skipped=why))
  todo = [i for i in range(len(rows)) if i not in skipped]
  done = len(skipped)

  def finish(j, reward, details, extra=None):
    nonlocal done
    i = todo[j]
    out[i] = dict(rows[i].raw, reward=reward, **(extra or {}),
                  verifier_details=details)
    done += 1
    if progress:
      progress(done, len(rows))

  _verify([rows[i] for i in todo], finish, sandbox=sandbox, workers=workers,
          workplace_db=workplace_db)
  return out


def unverifiable(rows: Sequence[Row]) -> dict[int, str]:
  """{row index: why} for the instruction-following rows whose checkers
  need data that is not installed here (`_if_registry.NLTK_DATA`)."""
  _if_registry.registry()           # fills UNAVAILABLE
  out = {}
  for i, r in enumerate(rows):
    if r.kind != 'instruction_following':
      continue
    need = [iid for iid in r.fields['instruction_id_list']
            if iid in _if_registry.UNAVAILABLE]
    if need:
      out[i] = '; '.join(f'{iid}: {_if_registry.UNAVAILABLE[iid]}'
                         for iid in need)
  return out


def missing_data(rows: Sequence[Row]) -> list[str]:
  """The nltk data sets the rows' unverifiable instructions need."""
  _if_registry.registry()
  return sorted({_if_registry.NLTK_DATA[iid] for r in rows
                 if r.kind == 'instruction_following'
                 for iid in r.fields['instruction_id_list']
                 if iid in _if_registry.UNAVAILABLE
                 and iid in _if_registry.NLTK_DATA})


def _verify(rows: Sequence[Row], finish, *, sandbox, workers, workplace_db):
  """Rewards the rows, `finish(j, reward, details, extra)` for row j."""
  if not rows:
    return
  texts = [response_text(r) for r in rows]      # every row checked first
  if any(r.kind == 'workplace' for r in rows):   # its tables, before work
    workplace_db = _workplace.find_db(workplace_db)
    _workplace.load(workplace_db)
  sandbox = sandbox or (Sandbox(TEST_LIMITS, workers=workers)
                        if any(r.kind == 'code' for r in rows) else None)
  reward_all([(r.kind, r.fields) for r in rows], texts, sandbox=sandbox,
             workers=workers, finish=finish, workplace_db=workplace_db)
