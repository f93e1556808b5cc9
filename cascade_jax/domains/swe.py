"""SWE: repair a short buggy Python function given a failing test; graded by running the tests.

The response is the fixed function, or a unified diff against the buggy
code (`--- a/solution.py` / `+++ b/solution.py` / `@@` hunks). Records carry
`buggy_code`, `entry_point`, `tests` (the failing test among them).
"""

from __future__ import annotations

import random
import re

from cascade_jax.domains import _base
from cascade_jax.domains import code
from cascade_jax.envs import apply_unified_diff
from cascade_jax.envs import PatchError


def looks_like_diff(text: str) -> bool:
  return bool(re.search(r'^@@ -\d', text, re.M))


def _diff_body(text: str) -> str:
  m = re.search(r'```(?:diff|patch)?\n(.*?)```', text, re.S)
  return m.group(1) if m else text


def program_from_response(rec, response: str) -> str:
  text = _base.strip_think(response)
  if looks_like_diff(text):
    try:
      return apply_unified_diff(rec['buggy_code'], _diff_body(text))
    except PatchError:
      return ''  # a patch that does not apply fixes nothing
  return _base.extract_code(text)


def failing_tests(src: str, tests) -> list[str]:
  """The tests (one assert each) that `src`, our own generated code, fails."""
  failing = []
  for t in tests:
    ns: dict = {}
    exec(src, ns)  # pylint: disable=exec-used  # our own generated code
    try:
      exec(t, ns)  # pylint: disable=exec-used
    except Exception:  # pylint: disable=broad-except
      failing.append(t)
  return failing


def _make(rng: random.Random, level: int):
  task, params, ref, tests, _ = code.make_instance(rng, level)
  buggy = code.source(task, params, buggy=True)
  failing = failing_tests(buggy, tests)
  if not failing:  # the bug is invisible to these inputs: draw again
    return _make(rng, level)
  shown = rng.choice(failing)
  prompt = (f'This function has a bug: the test `{shown}` fails.\n'
            f'Reply with the fixed function.\n\n{buggy}')
  key = f"{task.name}:{sorted(params.items())}"
  return key, dict(messages=_base.user(prompt), entry_point=task.name,
                   buggy_code=buggy, failing_test=shown, tests=tests,
                   response=ref)


def _flaw(rng: random.Random, rec: dict) -> str:
  """The buggy function handed back unchanged."""
  del rng
  return rec['buggy_code']


def generate(*, split, n, seed, levels=(1, 2, 3), eval_fraction=0.2,
             split_by='problem', response_quality=1.0):
  return _base.sample(_make, domain='swe', split=split, n=n, seed=seed,
                      levels=levels, eval_fraction=eval_fraction,
                      split_by=split_by, response_quality=response_quality,
                      flaw=_flaw)


def verify(records, responses, *, sandbox=None):
  programs = [program_from_response(r, s) for r, s in
              zip(records, responses, strict=True)]
  return code.run_programs(records, programs, sandbox)


DOMAIN = _base.Domain(
    name='swe', generate=generate, verify=verify,
    required_fields=('buggy_code', 'entry_point', 'tests'), needs_sandbox=True,
    description='fix a buggy function (code or unified diff); sandboxed tests')
