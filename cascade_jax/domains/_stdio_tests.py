"""Code answers checked as LiveCodeBench checks them: the last fenced block, run once per test with its stdin, stdout compared.

The NeMo-Gym code rows' verifier (`nemo_gym.code_reward`): the whole
output stripped, then line by line, each line stripped; a line that
differs passes if its tokens are numbers that agree (floats within 1e-6
absolute or relative, integers exactly); the first failing test reported
(wrong answer, time limit, runtime error).
"""

from __future__ import annotations

import decimal
from collections.abc import Sequence

from absl import logging

from cascade_jax.domains import _base
from cascade_jax.sandbox import Limits
from cascade_jax.sandbox import SANDBOX_ERROR
from cascade_jax.sandbox import Sandbox

# One test's limits (LiveCodeBench's default per-test timeout is 6 s).
TEST_LIMITS = Limits(wall_seconds=6.0, cpu_seconds=6, memory_bytes=1 << 30,
                     processes=16, output_bytes=16 << 20)


def last_fenced_block(text: str) -> str:
  """LiveCodeBench's extraction: the lines between the last two lines that
  hold a ``` fence; '' when there are fewer than two."""
  lines = text.split('\n')
  fences = [i for i, line in enumerate(lines) if '```' in line]
  if len(fences) < 2:
    return ''
  return '\n'.join(lines[fences[-2] + 1:fences[-1]])


def _stripped_lines(text: str) -> list[str]:
  return [line.strip() for line in text.strip().split('\n')]


def _is_float_token(token: str) -> bool:
  return '.' in token or 'e' in token.lower()


def _tokens_match(want: str, got: str) -> bool:
  try:
    a, b = decimal.Decimal(want), decimal.Decimal(got)
  except decimal.InvalidOperation:
    return False
  if a == b:
    return True
  if not (_is_float_token(want) or _is_float_token(got)):
    return False
  if not (a.is_finite() and b.is_finite()):
    return False
  err, tol = abs(a - b), decimal.Decimal('1e-6')
  return err <= tol or err / max(abs(a), decimal.Decimal(1)) <= tol


def outputs_match(expected: str, got: str) -> tuple[bool, str]:
  """LiveCodeBench's stdout comparison; (ok, why not)."""
  want, have = _stripped_lines(expected), _stripped_lines(got)
  if len(want) != len(have):
    return False, (f'wrong answer: {len(have)} output lines, expected '
                   f'{len(want)}')
  for i, (w, h) in enumerate(zip(want, have)):
    if w == h:
      continue
    wt, ht = w.split(), h.split()
    if len(wt) != len(ht) or not all(_tokens_match(a, b)
                                     for a, b in zip(wt, ht)):
      return False, f'wrong answer at line {i}: {h[:100]!r} != {w[:100]!r}'
  return True, ''


def code_reward(inputs: Sequence[str], outputs: Sequence[str], response: str,
                sandbox: Sandbox) -> tuple[float, dict]:
  """1 when the program passes every test; else 0 and the first failure. A
  sandbox that fails to start says nothing of the program: that test runs
  once more, and a second failure is reported as such (`status`
  SANDBOX_ERROR), not as the program's."""
  program = last_fenced_block(_base.strip_think(response))
  if not program.strip():
    return 0.0, dict(error='no fenced code block in the response')
  for i, (stdin, want) in enumerate(zip(inputs, outputs)):
    res = sandbox.run_script(program, stdin)
    if res.status == SANDBOX_ERROR:
      res = sandbox.run_script(program, stdin)
      if res.status == SANDBOX_ERROR:
        logging.warning('nemo_gym: the sandbox failed twice to start: %s',
                        res.stderr[-300:])
        return 0.0, dict(first_failure=i, status=SANDBOX_ERROR,
                         error=f'sandbox failed to start: {res.stderr[-200:]}',
                         tests=len(inputs))
    if res.status == 'timeout':
      why = f'time limit ({sandbox.limits.wall_seconds:g} s)'
    elif res.returncode is not None and res.returncode < 0:
      why = f'killed by signal {-res.returncode} (a CPU, memory or output limit)'
    elif res.status != 'ok':
      last = (res.stderr.strip().splitlines() or [''])[-1]
      why = f'runtime error (exit {res.returncode}): {last[:200]}'
    else:
      ok, why = outputs_match(want, res.stdout)
      if ok:
        continue
    return 0.0, dict(first_failure=i, error=why, tests=len(inputs))
  return 1.0, dict(tests=len(inputs))
