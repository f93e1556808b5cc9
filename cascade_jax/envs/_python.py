"""A stateful Python session in the sandbox: NeMo-Gym's `stateful_python_code_exec` tool.

NeMo-Skills' tool (NeMo-Gym's ns_tools server, the public RL set's
math-with-Python rows) runs each call's code in one IPython kernel per
episode: variables persist across calls; a call answers with its stdout
then its stderr, one trailing newline removed; a cell whose last statement
is an expression shows that value's repr (unless it is None or the cell
ends with `;`); a call has 10 s.

Here no process outlives a call (each run is a fresh sandboxed process,
`Sandbox.run_script`), so the session's state is rebuilt by replay: a call
runs, in one program, the episode's earlier calls with their output
discarded, then its own code with its output kept. Deterministic code
reaches the state a kernel would hold (files it wrote are written again).
Where this differs from a kernel, by construction:
- a call that timed out, or killed its process, is not replayed (a kernel
  keeps what ran before the interrupt; here the state is as if the call
  never ran);
- code whose effect changes between runs (the clock, unseeded randomness)
  gets a state of the replay's run, not of the first;
- the time limit covers the replay as well as the new code;
- an error shows as Python's last traceback line (`NameError: name 'x' is
  not defined`), not IPython's coloured traceback.
"""

from __future__ import annotations

import json

from cascade_jax.envs._tools import cap
from cascade_jax.envs._tools import MAX_OUTPUT_CHARS
from cascade_jax.sandbox import Limits
from cascade_jax.sandbox import SANDBOX_ERROR

PYTHON_TOOL = 'stateful_python_code_exec'
# NeMo-Skills' default `exec_timeout_s` (10 s a call).
PYTHON_LIMITS = Limits(wall_seconds=10.0, cpu_seconds=10,
                       memory_bytes=1 << 30, processes=16,
                       output_bytes=1 << 20, tmpfs_bytes=32 << 20)
# The episode's calls replayed at most (the longest a session grows).
MAX_CELLS = 32

# Runs in the sandbox: CELLS[:-1] replayed silently, CELLS[-1] shown.
_HARNESS = r'''
import ast, contextlib, io, json, sys, traceback
CELLS = json.loads(%s)
NS = {'__name__': '__main__', '__builtins__': __builtins__}


def _error(e):
  line = traceback.format_exception_only(type(e), e)[-1].rstrip()
  print(line, file=sys.stderr)


def run(src, show):
  try:
    tree = ast.parse(src, '<cell>', 'exec')
  except SyntaxError as e:
    if show:
      _error(e)
    return
  last = None
  if (show and tree.body and isinstance(tree.body[-1], ast.Expr)
      and not src.rstrip().endswith(';')):
    last = ast.Expression(tree.body.pop().value)
  try:
    exec(compile(tree, '<cell>', 'exec'), NS)
    if last is not None:
      value = eval(compile(last, '<cell>', 'eval'), NS)
      if value is not None:
        print(repr(value))
  except BaseException as e:  # SystemExit and KeyboardInterrupt too
    if show:
      _error(e)


for cell in CELLS[:-1]:
  sink = io.StringIO()
  with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
    run(cell, False)
run(CELLS[-1], True)
'''


def session_program(cells: list[str]) -> str:
  """The program one call runs: `cells[:-1]` replayed, `cells[-1]` shown."""
  if not cells:
    raise ValueError('session_program: no cells')
  return _HARNESS % repr(json.dumps(cells))


class PythonSession:
  """One episode's Python session: `run(code)` is the tool's answer.

  Every call runs in `sandbox` (the model's code is never run here); the
  answer is stdout then stderr, one trailing newline removed, cut to
  `max_output_chars`.
  """

  def __init__(self, sandbox, *, max_output_chars: int = MAX_OUTPUT_CHARS,
               max_cells: int = MAX_CELLS):
    self.sandbox = sandbox
    self.cells: list[str] = []       # the calls the state is made of
    self.max_output_chars = max_output_chars
    self.max_cells = max_cells
    self.calls = 0
    self.timeouts = 0

  def run(self, code: str) -> str:
    if len(self.cells) >= self.max_cells:
      return (f'error: the session holds {self.max_cells} calls already; '
              'answer with what you have')
    self.calls += 1
    res = self.sandbox.run_script(session_program(self.cells + [code]))
    if res.status == 'timeout':
      self.timeouts += 1
      return (f'error: the code ran past the time limit '
              f'({self.sandbox.limits.wall_seconds:g} s) and was stopped; '
              'the session is as it was before this call')
    if res.status == SANDBOX_ERROR:
      return f'error: the sandbox failed to run the code ({res.stderr[:200]})'
    if res.status != 'ok':   # the process died (a Python error is output)
      out = (res.stdout + res.stderr).rstrip('\n')
      return cap(f'error: the interpreter exited with code {res.returncode}; '
                 'the session is as it was before this call'
                 + (f'\n{out}' if out else ''), self.max_output_chars)
    self.cells.append(code)
    out = res.stdout + res.stderr
    if out.endswith('\n'):
      out = out[:-1]
    return cap(out, self.max_output_chars)
