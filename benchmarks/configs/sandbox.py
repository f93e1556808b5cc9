"""Sandbox throughput: executions per second for a batch of small programs.

  python -m benchmarks.sandbox --config=benchmarks/configs/sandbox.py
  python -m benchmarks.sandbox --config=benchmarks/configs/sandbox.py \
      --config.workers=1

Each execution is one generated `code` task: a program run against its
hidden tests in a fresh judge + solution process pair (half of the
programs are buggy, to exercise both verdicts).
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.programs = 256
  c.workers = 0              # 0: one per CPU core
  # How each sandbox process starts: 'fork' (forked from the fork server,
  # the default), 'exec' (an interpreter of its own) or 'both', measured
  # in alternating rounds.
  c.start = 'both'
  c.rounds = 3
  c.seed = 0
  if arg == 'quick':
    c.programs = 16
    c.rounds = 1
  elif arg:
    raise ValueError(f'benchmarks/configs/sandbox.py: unknown argument {arg!r}')
  return c


def sweep():
  for w in (1, 2, 4):
    yield {'config.workers': w}
