"""A repository the model works on: files in memory, edits with limits, tests run in the sandbox.

The files live in the trainer as plain strings, one `Workspace` per episode,
so nothing the model writes outlives its episode or touches the trainer's
disk. Listing, reading, searching (plain substrings: no model-written regular
expressions) and edits are string operations on the host, bounded by
`WorkspaceLimits`. Whatever runs the repository's code (the visible tests,
the hidden tests at submit) runs in the sandbox: a fresh process with its
own uid, no network, a private tmpfs, and time / memory / process / output
limits, into which the files are written and imported.
"""

from __future__ import annotations

import dataclasses
import re
import signal

from cascade_jax.envs._patch import apply_unified_diff
from cascade_jax.envs._patch import PatchError
from cascade_jax.envs._tools import cap
from cascade_jax.envs._tools import ToolCallError
from cascade_jax.sandbox import Limits

# One tool call's sandbox run: tighter than a whole program's verdict.
TOOL_LIMITS = Limits(wall_seconds=5.0, cpu_seconds=4, memory_bytes=512 << 20,
                     processes=16, output_bytes=64 << 10, tmpfs_bytes=8 << 20)


@dataclasses.dataclass(frozen=True)
class WorkspaceLimits:
  max_files: int = 32
  max_file_chars: int = 8192
  max_total_chars: int = 65536
  max_search_matches: int = 20
  max_output_chars: int = 600


_PATH = re.compile(r'[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*')


def check_path(path: str) -> str:
  """A relative path of plain names (no '..', no absolute paths, no oddities)."""
  if (not isinstance(path, str) or not _PATH.fullmatch(path) or
      any(part in ('.', '..') or part.startswith('..')
          for part in path.split('/')) or len(path) > 200):
    raise ToolCallError(f'bad path {path!r}: use a relative path such as '
                        "'pkg/ops.py'")
  return path


# Runs inside the sandbox (our code; the repository's modules are the
# model's): writes the files under the working directory and imports from
# there.
_LOADER = '''\
import os, sys
_FILES = {files!r}
_ROOT = os.path.join(globals().get('_BASE') or os.getcwd(), 'repo')
for _p, _t in _FILES.items():
    _full = os.path.join(_ROOT, _p)
    os.makedirs(os.path.dirname(_full), exist_ok=True)
    with open(_full, 'w') as _f:
        _f.write(_t)
sys.path.insert(0, _ROOT)
'''

# Runs the visible test file line by line: every `assert f(...) == v` is
# reported, a failure with the value the left side produced.
_RUNNER = '''\
import ast
_src = open(os.path.join(_ROOT, {test!r})).read()
_ns = {{'__name__': 'tests'}}
_passed, _report = 0, []
try:
    _tree = ast.parse(_src)
except SyntaxError as _e:
    print(f'ERROR: {test} does not parse: {{_e}}')
    raise SystemExit(1)
for _node in _tree.body:
    _line = ast.get_source_segment(_src, _node)
    _code = compile(ast.Module([_node], []), {test!r}, 'exec')
    if not isinstance(_node, ast.Assert):
        try:
            exec(_code, _ns)
        except Exception as _e:
            print(f'ERROR: {{_line}}: {{type(_e).__name__}}: {{_e}}')
            raise SystemExit(1)
        continue
    try:
        exec(_code, _ns)
        _passed += 1
    except AssertionError:
        _got = ''
        _t = _node.test
        if isinstance(_t, ast.Compare):
            try:
                _got = ' (got ' + repr(eval(compile(ast.Expression(_t.left), 'x', 'eval'), _ns)) + ')'
            except Exception:
                pass
        _report.append(f'FAILED: {{_line}}{{_got}}')
    except Exception as _e:
        _report.append(f'FAILED: {{_line}} ({{type(_e).__name__}}: {{_e}})')
print(f'{{_passed}} passed, {{len(_report)}} failed')
for _r in _report:
    print(_r)
'''


class Workspace:
  """One episode's copy of a repository."""

  def __init__(self, files: dict[str, str],
               limits: WorkspaceLimits = WorkspaceLimits()):
    self.files = {check_path(p): str(t) for p, t in files.items()}
    self.limits = limits
    self._check_size()

  # ------------------------------------------------------------- tools

  def list_files(self) -> str:
    return '\n'.join(sorted(self.files))

  def read_file(self, path: str) -> str:
    return self.files[self._existing(path)]

  def search(self, text: str) -> str:
    if not text or len(text) > 200:
      raise ToolCallError('search: give 1 to 200 characters to look for')
    hits = [f'{p}:{i}: {line}' for p in sorted(self.files)
            for i, line in enumerate(self.files[p].splitlines(), 1)
            if text in line]
    if not hits:
      return f'no match for {text!r}'
    more = len(hits) - self.limits.max_search_matches
    return '\n'.join(hits[:self.limits.max_search_matches] +
                     ([f'[{more} more matches]'] if more > 0 else []))

  def replace(self, path: str, old: str, new: str) -> str:
    src = self.files[self._existing(path)]
    n = src.count(old) if old else 0
    if n != 1:
      raise ToolCallError(f'replace: {old!r} occurs {n} times in {path}; it '
                          'must occur exactly once')
    self._write(path, src.replace(old, new))
    return f'replaced 1 occurrence in {path}'

  def apply_patch(self, patch: str) -> str:
    m = re.search(r'^\+\+\+ (?:b/)?(\S+)', patch, re.M)
    if not m:
      raise ToolCallError("apply_patch: a unified diff with a '+++ b/<path>' "
                          'header and @@ hunks')
    path = self._existing(m.group(1))
    try:
      out = apply_unified_diff(self.files[path], patch)
    except PatchError as e:
      raise ToolCallError(f'apply_patch: {e}') from None
    self._write(path, out)
    return f'patched {path}'

  def run_tests(self, sandbox, test_path: str) -> str:
    """Runs the visible test file in the sandbox; its report (capped)."""
    program = (_LOADER.format(files=self.files) +
               _RUNNER.format(test=self._existing(test_path)))
    res = sandbox.run_script(program)
    lim = sandbox.limits
    if res.status == 'timeout':
      return (f'error: the tests were stopped: wall-clock limit '
              f'({lim.wall_seconds:g} s)')
    if res.returncode is not None and res.returncode < 0:
      why = {signal.SIGXCPU: f'CPU time limit ({lim.cpu_seconds} s)',
             signal.SIGXFSZ: 'output size limit',
             signal.SIGKILL: 'killed (a memory or process limit)'}.get(
                 -res.returncode, f'signal {-res.returncode}')
      return f'error: the tests were stopped: {why}'
    out = (res.stdout + ('\n' + res.stderr.strip().splitlines()[-1]
                         if res.stderr.strip() else ''))
    return cap(out.strip() or f'(no output, exit code {res.returncode})',
               self.limits.max_output_chars)

  def judge(self, sandbox, *, module: str, entry_point: str,
            tests: str) -> bool:
    """Hidden tests against the repository (the sandbox's judge process)."""
    return sandbox.run_tests(self.judge_program(module, entry_point), tests,
                             [entry_point]).passed

  def judge_program(self, module: str, entry_point: str) -> str:
    """The program the judge calls: the repository loaded, `entry_point`
    imported from `module` (a pure function of the files: verdicts on it
    can be cached)."""
    return _LOADER.format(files=self.files) + (
        f'from {module} import {entry_point}\n')

  # --------------------------------------------------------- internals

  def _existing(self, path: str) -> str:
    check_path(path)
    if path not in self.files:
      raise ToolCallError(f'no file {path!r}; files: '
                          f'{", ".join(sorted(self.files))}')
    return path

  def _write(self, path: str, text: str) -> None:
    old = self.files.get(path)
    self.files[path] = text
    try:
      self._check_size()
    except ToolCallError:
      if old is None:
        del self.files[path]
      else:
        self.files[path] = old
      raise

  def _check_size(self) -> None:
    lim = self.limits
    if len(self.files) > lim.max_files:
      raise ToolCallError(f'at most {lim.max_files} files')
    big = [p for p, t in self.files.items() if len(t) > lim.max_file_chars]
    if big:
      raise ToolCallError(f'{big[0]} would exceed {lim.max_file_chars} '
                          'characters')
    if sum(map(len, self.files.values())) > lim.max_total_chars:
      raise ToolCallError(f'the repository would exceed '
                          f'{lim.max_total_chars} characters')
