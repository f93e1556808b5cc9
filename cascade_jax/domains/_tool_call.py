"""NeMo-Gym's conversational tool-use rows: a multi-turn history with tools, verified on the next action.

The public agentic tool-use RL set (Nemotron-RL-Agentic-Conversational-
Tool-Use-Pivot; NeMo-Gym's `single_step_tool_use_with_argument_comparison`
server) cuts expert trajectories into steps. A row is the conversation so
far and the action the expert took next:

  responses_create_params.input   messages ({role, content}), `reasoning`
                                  items (not shown to the model here),
                                  `function_call` items (name, arguments: a
                                  JSON string, call_id) and
                                  `function_call_output` items (call_id,
                                  output)
  responses_create_params.tools   the functions ({type: function, name,
                                  description, parameters})
  expected_action                 {type: function_call, name, arguments},
                                  {type: function_call_batch, calls: [...]}
                                  or {type: message, content}

Written from the server's documentation and tests, then checked against
its own comparator on generated actions (and corrected where they differed:
docs/results/checks/verifier_agreement_2026-12-05):

- The response's action: its function calls, if any (all of them, in
  order: one call or a batch), else its first assistant text (a message),
  else nothing.
- An expected message is matched by any message (its content is not
  compared) and by no tool call.
- An expected call matches an actual one with the same name whose
  arguments agree: objects with the same keys, lists of the same length,
  element by element; floats within `float_tolerance` (absolute), other
  numbers exactly, an int never matching a float (the reference's
  `isinstance` test, under which a bool passes as an int); strings
  of at least two words on both sides by word overlap (lower-cased,
  whitespace-split multisets: |common words| / (expected words + actual
  words) at least `word_similarity`: 0.1 in the shipped config), other
  strings exactly; values of different types never.
- Calls are matched as an unordered multiset by a maximum bipartite
  matching (the fuzzy string test is not transitive, so greedy pairing can
  strand a call). With `count_calls` off (the shipped default) the reward is
  1 when every expected call is matched, whatever else was called; on, a
  response with fewer calls needs `allow_subset`, with more
  `allow_superset` (else 0), and the reward is `mode`'s: 'binary' (1 when
  the calls that could pair all do: min(expected, actual) matched),
  'fraction' (matched / min(expected, actual)) or 'f1' (2 matched /
  (expected + actual): the only mode that charges for a wrong count).

The model here writes calls as `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>` (the environments' format); a rollout row's
`function_call` items are read as the same calls. The tools are shown in
the system prompt (`tools_text`), one JSON object a line, as chat
templates with tools do.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from typing import Any

from cascade_jax import envs
from cascade_jax.domains import _base

TOOL_START, TOOL_END = envs.TOOL_START, envs.TOOL_END

MODES = ('binary', 'fraction', 'f1')
_CALL = re.compile(re.escape(TOOL_START) + r'(.*?)' + re.escape(TOOL_END),
                   re.S)

# Categories (why a step earned what it did), as the server reports them.
EXPECTED_CALL = 'expected_tool_call'
EXPECTED_BATCH = 'expected_tool_call_batch'
EXPECTED_MESSAGE = 'expected_chat_message_found'
NO_EXPECTED_MESSAGE = 'no_expected_chat_message'
NO_EXPECTED_CALL = 'no_expected_tool_call'
NO_ACTION = 'no_action'
UNEXPECTED_TOOL = 'unexpected_tool'
DECODE_ERROR = 'arguments_decode_error'
VALUE_DIFFERENT = 'argument_value_different'
TYPE_DIFFERENT = 'argument_value_type_different'
KEYS_DIFFERENT = 'argument_object_keys_different'
LENGTH_DIFFERENT = 'argument_list_length_different'
COUNT_DIFFERENT = 'function_call_batch_length_different'


class ToolRowError(ValueError):
  """A malformed tool row field (the caller adds the file and line)."""


@dataclasses.dataclass(frozen=True)
class Comparator:
  """The server's `tool_call_comparator_config`, with its shipped values."""
  word_similarity: float = 0.1
  float_tolerance: float = 1e-6
  count_calls: bool = False          # parallel_tool_call_rewarding
  allow_subset: bool = False
  allow_superset: bool = False
  mode: str = 'binary'               # binary_strict / fractional / f1

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f'tool-call comparator: mode {self.mode!r}; one of '
                       f'{MODES}')


# ------------------------------------------------------------------ rows

def _arguments(raw: Any, field: str) -> dict:
  """A call's arguments: a JSON object, or its text ('' is no arguments)."""
  if isinstance(raw, str):
    if not raw.strip():
      return {}
    try:
      raw = json.loads(raw)
    except json.JSONDecodeError as e:
      raise ToolRowError(f'field {field} is not JSON ({e.msg} at column '
                         f'{e.colno})') from None
  if not isinstance(raw, dict):
    raise ToolRowError(f'field {field} must be a JSON object')
  return raw


def _call(obj: Any, field: str) -> dict:
  if not isinstance(obj, dict) or not isinstance(obj.get('name'), str) or \
      not obj['name']:
    raise ToolRowError(f'field {field} must be a call with a "name" string')
  return dict(name=obj['name'],
              arguments=_arguments(obj.get('arguments', ''),
                                   f'{field}.arguments'))


def expected_action(obj: Any) -> dict:
  """The row's `expected_action`, checked: {'type': 'message'} or
  {'type': 'calls', 'batch': bool, 'calls': [{name, arguments}]}."""
  field = 'expected_action'
  kind = obj.get('type') if isinstance(obj, dict) else None
  if kind == 'message':
    return dict(type='message')
  if kind == 'function_call':
    return dict(type='calls', batch=False, calls=[_call(obj, field)])
  if kind == 'function_call_batch':
    calls = obj.get('calls')
    if not isinstance(calls, list) or not calls:
      raise ToolRowError(f'field {field}.calls must be a non-empty list')
    return dict(type='calls', batch=True,
                calls=[_call(c, f'{field}.calls[{j}]')
                       for j, c in enumerate(calls)])
  raise ToolRowError(f'field {field}.type is {kind!r}; one of message, '
                     'function_call, function_call_batch')


def tools_text(tools: Any) -> str:
  """The tools as the system prompt shows them."""
  if not isinstance(tools, list):
    raise ToolRowError('field responses_create_params.tools must be a list')
  lines = []
  for j, t in enumerate(tools):
    if not isinstance(t, dict) or t.get('type', 'function') != 'function' \
        or not isinstance(t.get('name'), str):
      raise ToolRowError(f'field responses_create_params.tools[{j}] must be '
                         'a function tool with a "name" string')
    lines.append(json.dumps({k: t[k] for k in ('name', 'description',
                                               'parameters') if k in t},
                            ensure_ascii=False, sort_keys=True))
  return ('# Tools\n\nYou may call one or more functions. They are, one a '
          'line:\n<tools>\n' + '\n'.join(lines) + '\n</tools>\n\nTo call one, '
          f'write {TOOL_START}{{"name": <function name>, "arguments": <a JSON '
          f'object>}}{TOOL_END}.')


def call_text(name: str, arguments: Any) -> str:
  """A call as the model writes it; arguments that are not a JSON object's
  text stay as they were (and fail to parse, as they should: an empty
  string too, as the reference's json.loads fails on it)."""
  if isinstance(arguments, str):
    try:
      parsed = json.loads(arguments)
    except json.JSONDecodeError:
      parsed = None
    body = (json.dumps(dict(name=name, arguments=parsed), ensure_ascii=False)
            if parsed is not None else
            f'{{"name": {json.dumps(name)}, "arguments": {arguments}}}')
  else:
    body = json.dumps(dict(name=name, arguments=arguments), ensure_ascii=False)
  return TOOL_START + body + TOOL_END


def history_item(item: dict, field: str, text) -> dict | None:
  """One non-message input item as a chat turn: a function call as the
  assistant's call text, its output as a `tool` turn; reasoning: None."""
  kind = item.get('type')
  if kind == 'reasoning':
    return None
  if kind == 'function_call':
    c = item.get('name')
    if not isinstance(c, str) or not c:
      raise ToolRowError(f'field {field}.name must be a string')
    args = item.get('arguments', '')
    if not isinstance(args, (str, dict)):
      raise ToolRowError(f'field {field}.arguments must be a string')
    return dict(role='assistant', content=call_text(c, args))
  if kind == 'function_call_output':
    out = item.get('output')
    return dict(role='tool', content=out if isinstance(out, str)
                else text(out, f'{field}.output'))
  raise ToolRowError(f'field {field}.type is {kind!r}; one of message, '
                     'reasoning, function_call, function_call_output')


# -------------------------------------------------------------- actions

def action_from_text(text: str) -> dict:
  """The action of a reply the model wrote: its calls (each block parsed
  on its own; a bad one is a call that matches nothing, with its error),
  else a message if it says anything, else none."""
  body = _base.strip_think(text)
  blocks = _CALL.findall(body)
  if blocks:
    calls = []
    for b in blocks:
      try:
        (c,) = envs.parse_tool_calls(TOOL_START + b + TOOL_END)
        calls.append(dict(name=c.name, arguments=c.arguments))
      except envs.ToolCallError as e:
        calls.append(dict(name=None, arguments=None, error=str(e)))
    return dict(type='calls', calls=calls)
  if TOOL_START in body:
    return dict(type='calls', calls=[dict(name=None, arguments=None,
                                          error='unclosed tool call')])
  return dict(type='message') if body.strip() else dict(type='none')


def _words(s: str) -> list[str]:
  return s.lower().split()


def compare_values(want: Any, got: Any, c: Comparator) -> str | None:
  """None when an actual argument value agrees with the expected one, else
  the category of the first difference. Types as the reference tests them
  (`isinstance(got, type(want))`): an int is not a float (54.0 does not
  match 54, nor 2 match 2.0), while a bool passes where an int is expected
  and is then compared by value (True matches 1)."""
  if not isinstance(got, type(want)):
    return TYPE_DIFFERENT
  if isinstance(want, float):
    return (None if abs(got - want) < c.float_tolerance else
            VALUE_DIFFERENT)
  if isinstance(want, dict):
    if set(want) != set(got):
      return KEYS_DIFFERENT
    for k in want:
      why = compare_values(want[k], got[k], c)
      if why:
        return why
    return None
  if isinstance(want, list):
    if len(want) != len(got):
      return LENGTH_DIFFERENT
    for a, b in zip(want, got):
      why = compare_values(a, b, c)
      if why:
        return why
    return None
  if isinstance(want, str):
    w, g = _words(want), _words(got)
    if len(w) >= 2 and len(g) >= 2:
      common = sum((collections.Counter(w) & collections.Counter(g)).values())
      return (None if common / (len(w) + len(g)) >= c.word_similarity
              else VALUE_DIFFERENT)
  return None if want == got else VALUE_DIFFERENT


def compare_call(want: dict, got: dict, c: Comparator) -> str | None:
  """None when the actual call matches the expected one, else why not."""
  if got.get('error'):
    return DECODE_ERROR
  if got['name'] != want['name']:
    return UNEXPECTED_TOOL
  return compare_values(want['arguments'], got['arguments'], c)


def max_matching(edges: list[list[int]]) -> dict[int, int]:
  """A maximum bipartite matching {left: right} of left i to any right in
  edges[i] (augmenting paths, Kuhn's algorithm)."""
  right_of: dict[int, int] = {}       # right -> left

  def augment(i: int, seen: set[int]) -> bool:
    for j in edges[i]:
      if j in seen:
        continue
      seen.add(j)
      if j not in right_of or augment(right_of[j], seen):
        right_of[j] = i
        return True
    return False

  for i in range(len(edges)):
    augment(i, set())
  return {i: j for j, i in right_of.items()}


_RANK = (VALUE_DIFFERENT, TYPE_DIFFERENT, KEYS_DIFFERENT, LENGTH_DIFFERENT,
         DECODE_ERROR, UNEXPECTED_TOOL)


def _why_unmatched(want: dict, got: list[dict], c: Comparator) -> str:
  """The nearest miss of an expected call among the actual ones."""
  whys = [compare_call(want, g, c) for g in got]
  return min((w for w in whys if w), key=_RANK.index, default=UNEXPECTED_TOOL)


def compare(expected: dict, actual: dict, c: Comparator = Comparator()
            ) -> tuple[float, str, dict]:
  """(reward, category, details) of an actual action against the expected."""
  if expected['type'] == 'message':
    if actual['type'] == 'message':
      return 1.0, EXPECTED_MESSAGE, {}
    return 0.0, (NO_EXPECTED_MESSAGE if actual['type'] == 'calls'
                 else NO_ACTION), {}
  if actual['type'] != 'calls':
    return 0.0, NO_EXPECTED_CALL, {}
  want, got = expected['calls'], actual['calls']
  matching = max_matching([[j for j, g in enumerate(got)
                            if compare_call(w, g, c) is None] for w in want])
  n, details = len(matching), dict(matched=len(matching), expected=len(want),
                                   actual=len(got))
  ok = EXPECTED_BATCH if expected.get('batch') else EXPECTED_CALL
  unmatched = [w for i, w in enumerate(want) if i not in matching]
  miss = _why_unmatched(unmatched[0], got, c) if unmatched else None
  if not c.count_calls:
    return (1.0, ok, details) if not unmatched else (0.0, miss, details)
  if (len(got) < len(want) and not c.allow_subset) or (
      len(got) > len(want) and not c.allow_superset):
    return 0.0, COUNT_DIFFERENT, details
  # An admitted shape is judged on the calls it could match: with
  # allow_subset, fewer calls all matched earn full credit under 'binary'
  # and 'fraction' (the server's "free pass"); 'f1' charges for the count.
  k = min(len(want), len(got))
  reward = {'binary': float(n == k), 'fraction': n / k,
            'f1': 2 * n / (len(want) + len(got))}[c.mode]
  if reward == 1.0:
    return 1.0, ok, details
  return reward, (COUNT_DIFFERENT if len(got) != len(want) else miss), details


def reward(fields: dict, text: str) -> tuple[float, dict]:
  """A reply's reward against a row's expected action (nemo_gym kind
  'tool_call'), with the category and the calls matched."""
  c = Comparator(**fields.get('comparator', {}))
  actual = action_from_text(text)
  r, category, details = compare(fields['expected_action'], actual, c)
  errors = [g['error'] for g in actual.get('calls', []) if g.get('error')]
  return r, dict(category=category, action=actual['type'], **details,
                 **(dict(call_errors=errors) if errors else {}))
