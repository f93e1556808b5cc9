"""Verifies NeMo-Gym rollout rows: each row back, in order, with its reward.

  python -m experiments.verify --rows=rollouts.jsonl --out=verified.jsonl
  python -m experiments.verify --rows=workplace.jsonl --out=verified.jsonl \
      --workplace_db=Gym/resources_servers/workplace_assistant/csv_data

Rows are NeMo-Gym's (the public RL set's format plus the rollout's
`response`, Responses API output); see cascade_jax/domains/nemo_gym.py for
the fields each kind needs and how it is verified (math: math-verify alone;
code: the sandbox, stdin / stdout tests as LiveCodeBench runs them;
workplace assistant: the state its calls leave in the tables of
--workplace_db, which the rows do not carry).
Every row is read and checked before any is verified: a malformed one stops
the run naming its file, line and field, and nothing is written. A row
whose checkers need data that is not installed (IFBench's
`ratio:stop_words` and `words:start_verb`: nltk's stopwords and tagger) is
written with its reason and no reward, the others verified, and the
command that installs the data is printed. The table at the end gives each
kind's rows and mean reward with its standard error.
"""

import dataclasses
import json
import math
import os
import time

from absl import app
from absl import flags
from absl import logging

from cascade_jax.domains import nemo_gym
from cascade_jax.sandbox import Sandbox

_ROWS = flags.DEFINE_string('rows', None, 'NeMo-Gym rollout rows (JSONL).',
                            required=True)
_OUT = flags.DEFINE_string('out', None, 'Where to write the verified rows.',
                           required=True)
_WORKERS = flags.DEFINE_integer('workers', os.cpu_count() or 1,
                                'Code rows verified at once.')
_TEST_SECONDS = flags.DEFINE_float(
    'test_seconds', nemo_gym.TEST_LIMITS.wall_seconds,
    "A code test's wall-clock (and CPU) limit.")
_WORKPLACE_DB = flags.DEFINE_string(
    'workplace_db', '', "Workplace-assistant rows' tables: a directory with "
    "NeMo-Gym's workplace_assistant CSVs (default: $CASCADE_JAX_WORKPLACE_DB).")


def summary(rows: list[dict], kinds: list[str]) -> str:
  """Per kind: rows verified, mean reward and its standard error, and rows
  not verified, as a table."""
  lines = [f"{'kind':<24}{'rows':>6}{'reward':>10}{'se':>8}{'skipped':>9}"]
  for kind in sorted(set(kinds)):
    r = [row['reward'] for row, k in zip(rows, kinds)
         if k == kind and row['reward'] is not None]
    skipped = sum(row['reward'] is None for row, k in zip(rows, kinds)
                  if k == kind)
    mean = sum(r) / len(r) if r else float('nan')
    se = (math.sqrt(sum((x - mean) ** 2 for x in r) / (len(r) - 1) / len(r))
          if len(r) > 1 else float('nan'))
    lines.append(f'{kind:<24}{len(r):>6}{mean:>10.3f}{se:>8.3f}{skipped:>9}')
  # Why the rows earned what they did, where the verifier says (tool use:
  # its category; code: the first failure's kind).
  why = {}
  for row, k in zip(rows, kinds):
    cat = (row.get('verifier_details') or {}).get('category')
    if cat:
      why.setdefault(k, {}).setdefault(cat, 0)
      why[k][cat] += 1
  for k, cats in sorted(why.items()):
    lines.append(f'{k} by category: ' + ', '.join(
        f'{c} {n}' for c, n in sorted(cats.items(), key=lambda kv: -kv[1])))
  return '\n'.join(lines)


def verify_file(rows_path: str, out_path: str, *, workers: int = 1,
                test_seconds: float = nemo_gym.TEST_LIMITS.wall_seconds,
                workplace_db: str = '') -> list[dict]:
  rows = nemo_gym.read_rows(rows_path)
  limits = dataclasses.replace(nemo_gym.TEST_LIMITS, wall_seconds=test_seconds,
                               cpu_seconds=max(1, math.ceil(test_seconds)))
  sandbox = (Sandbox(limits, workers=workers)
             if any(r.kind == 'code' for r in rows) else None)
  t0, last = time.time(), [0.0]

  def progress(done, total):
    if done == total or time.time() - last[0] > 10:
      last[0] = time.time()
      logging.info('[verify] %d / %d rows (%.0f s)', done, total,
                   time.time() - t0)

  out = nemo_gym.verify_rows(rows, sandbox=sandbox, workers=workers,
                             progress=progress, workplace_db=workplace_db)
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  tmp = out_path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    for row in out:
      f.write(json.dumps(row, ensure_ascii=False) + '\n')
  os.replace(tmp, out_path)
  print(summary(out, [r.kind for r in rows]))
  skipped = [row for row in out if row['reward'] is None]
  if skipped:
    need = nemo_gym.missing_data(rows)
    print(f'{len(skipped)} row(s) not verified: their checkers need data '
          'that is not installed here (each written with its reason, '
          "verifier_details.skipped, and reward null). Install it and run "
          'again:\n  python -m nltk.downloader ' + ' '.join(need))
  return out


def main(argv):
  del argv
  verify_file(_ROWS.value, _OUT.value, workers=_WORKERS.value,
              test_seconds=_TEST_SECONDS.value,
              workplace_db=_WORKPLACE_DB.value)


if __name__ == '__main__':
  app.run(main)
