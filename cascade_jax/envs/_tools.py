"""Tool calls: parsing the model's `<tool_call>{json}</tool_call>` blocks, checking and running them.

A call is `{"name": ..., "arguments": {...}}` inside the chat template's
tool-call tags. Nothing the model writes is trusted: a block that is not
JSON, names no known tool, lacks an argument, passes an unknown one or one
of the wrong type, or makes the tool fail, becomes an error observation the
model can read (`ToolCallError`'s message), never an exception in the
trainer. Tools here are deterministic host functions over plain data;
anything that executes model-written code goes through the sandbox
(`envs.Workspace.run_tests`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

TOOL_START, TOOL_END = '<tool_call>', '</tool_call>'
_CALL = re.compile(re.escape(TOOL_START) + r'(.*?)' + re.escape(TOOL_END),
                   re.S)
# The most characters of one call's JSON that are parsed, and of one
# observation that is returned (the rest cut, with a marker).
MAX_CALL_CHARS = 4096
MAX_OUTPUT_CHARS = 1200
# Most calls one message runs (the rest answered with an error).
MAX_CALLS_PER_TURN = 4


class ToolCallError(ValueError):
  """A call the model got wrong; its message is the observation."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
  name: str
  arguments: dict[str, Any]


def parse_tool_calls(text: str) -> list[ToolCall]:
  """Every well-formed call in `text`, in order; raises ToolCallError on the first bad one."""
  if text.count(TOOL_START) != text.count(TOOL_END):
    raise ToolCallError(f'unbalanced {TOOL_START} / {TOOL_END} tags')
  calls = []
  for body in _CALL.findall(text):
    if len(body) > MAX_CALL_CHARS:
      raise ToolCallError(f'tool call longer than {MAX_CALL_CHARS} characters')
    try:
      obj = json.loads(body, parse_constant=_non_finite,
                       parse_float=_finite_float)
    except ToolCallError:
      raise
    except RecursionError:
      raise ToolCallError('tool call nested too deeply') from None
    except ValueError as e:
      raise ToolCallError(f'tool call is not valid JSON ({e.msg} at '
                          f'character {e.pos})') from None
    if not isinstance(obj, dict) or not isinstance(obj.get('name'), str):
      raise ToolCallError('a tool call is a JSON object with a "name" string '
                          'and an "arguments" object')
    args = obj.get('arguments', {})
    if not isinstance(args, dict):
      raise ToolCallError(f'tool {obj["name"]!r}: "arguments" must be a JSON '
                          'object')
    extra = sorted(set(obj) - {'name', 'arguments'})
    if extra:
      raise ToolCallError(f'unknown keys in the tool call: {extra}')
    calls.append(ToolCall(obj['name'], args))
  return calls


def _finite_float(text: str) -> float:
  value = float(text)
  if not math.isfinite(value):   # 1e999: past float's range, not a number
    _non_finite(text)
  return value


def _non_finite(name: str):
  raise ToolCallError(f'tool call has a non-finite number ({name}); JSON '
                      'numbers are finite')


@dataclasses.dataclass(frozen=True)
class Tool:
  """A tool: its arguments (name, type) in order, and the function (returns text).

  The function raises ToolCallError for a call it cannot serve (a missing
  file, a unit it does not know): that message is the observation.
  """
  name: str
  params: tuple[tuple[str, type | tuple[type, ...]], ...]
  fn: Callable[..., str]
  doc: str = ''

  def signature(self) -> str:
    return f"{self.name}({', '.join(p for p, _ in self.params)})"


def _type_ok(value, want) -> bool:
  want = want if isinstance(want, tuple) else (want,)
  if isinstance(value, bool) and bool not in want:
    return False           # JSON true is not a number here
  return isinstance(value, want)


def _type_name(want) -> str:
  want = set(want if isinstance(want, tuple) else (want,))
  if {int, float} <= want:
    want = (want - {int, float}) | {'number'}
  names = {str: 'string', int: 'integer', float: 'number', bool: 'boolean',
           list: 'array', dict: 'object', 'number': 'number'}
  return ' or '.join(sorted(names.get(t, getattr(t, '__name__', str(t)))
                            for t in want))


class Toolbox:
  """Tools by name; `run(call)` checks the arguments and returns the observation text."""

  def __init__(self, tools: Sequence[Tool], *,
               max_output_chars: int = MAX_OUTPUT_CHARS):
    self.tools = {t.name: t for t in tools}
    self.max_output_chars = max_output_chars

  def describe(self) -> str:
    return 'Tools: ' + ', '.join(t.signature() for t in self.tools.values())

  def check(self, call: ToolCall) -> Tool:
    tool = self.tools.get(call.name)
    if tool is None:
      raise ToolCallError(f'unknown tool {call.name!r}; tools: '
                          f'{", ".join(self.tools)}')
    want = dict(tool.params)
    missing = [p for p in want if p not in call.arguments]
    extra = sorted(set(call.arguments) - set(want))
    if missing or extra:
      raise ToolCallError(
          f'{tool.signature()}: ' + '; '.join(
              ([f'missing {missing}'] if missing else []) +
              ([f'unknown {extra}'] if extra else [])))
    for p, t in tool.params:
      if not _type_ok(call.arguments[p], t):
        raise ToolCallError(f'{tool.name}: argument {p!r} must be: '
                            f'{_type_name(t)}, got '
                            f'{type(call.arguments[p]).__name__}')
    return tool

  def answer(self, calls: Sequence[ToolCall],
             max_calls: int = MAX_CALLS_PER_TURN) -> tuple[dict, ...]:
    """One message's calls answered by this toolbox (`answer_calls`)."""
    return answer_calls(calls, self.run, max_calls)

  def run(self, call: ToolCall) -> str:
    """The tool's output, or `error: ...` for a bad call (never raises).

    Arguments that pass the types can still break a tool (an overflow, a
    result too long to print): that is the model's error too, reported.
    """
    try:
      tool = self.check(call)
      out = str(tool.fn(**{p: call.arguments[p] for p, _ in tool.params}))
    except ToolCallError as e:
      return cap(f'error: {e}', self.max_output_chars)
    except Exception as e:  # noqa: BLE001 - the model's arguments broke it
      return cap(f'error: {call.name} failed: {type(e).__name__}: {e}',
                 self.max_output_chars)
    return cap(out, self.max_output_chars)


def answer_calls(calls: Sequence[ToolCall], run: Callable[[ToolCall], str],
                 max_calls: int = MAX_CALLS_PER_TURN) -> tuple[dict, ...]:
  """One message's calls answered: each `run(call)`'s output as a tool
  message, at most `max_calls` of them, then an error message for the
  rest."""
  out = [tool_message(run(c)) for c in calls[:max_calls]]
  if len(calls) > max_calls:
    out.append(tool_message(f'error: at most {max_calls} tool calls a '
                            'message; the rest were not run'))
  return tuple(out)


def cap(text: str, limit: int) -> str:
  """`text` cut to `limit` characters, with a marker saying how much was cut."""
  if len(text) <= limit:
    return text
  return text[:limit] + f'\n[... {len(text) - limit} more characters cut]'


def tool_message(text: str) -> dict[str, str]:
  return {'role': 'tool', 'content': text}


def format_call(name: str, **arguments) -> str:
  """A call as the model should write it (demonstrations, tests)."""
  return f'{TOOL_START}{json.dumps(dict(name=name, arguments=arguments))}{TOOL_END}'
