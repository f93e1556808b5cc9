"""python -m experiments.claims [--write | --check]: the claims' tables, and whether each rule came first."""

import sys

from experiments.claims import history
from experiments.claims import tables


def main(argv: list[str]) -> int:
  if '--write' in argv:
    for path in tables.write():
      print(f'wrote the claims table in {path}')
    return 0
  if '--check' not in argv:
    for path, text in tables.sections().items():
      print(f'# {path}\n\n{text}\n')
    return 0
  stale = tables.stale()
  if stale:
    print(f'{", ".join(stale)}: the claims table is not what the results '
          'say; run python -m experiments.claims --write', file=sys.stderr)
    return 1
  print('the claims tables match docs/results')
  why = history.available()
  if why:
    print(f'rules against their results: not checked ({why})')
    return 0
  problems = history.check()
  if problems:
    print('claims whose rule did not come first:\n'
          + '\n'.join(f'  - {p}' for p in problems), file=sys.stderr)
    return 1
  print('every rule came before its results and is decided by the code it '
        'was registered with (or is marked post hoc)')
  for cid, files in history.early_runs().items():
    print(f'  marked: rule {cid}: {len(files)} result file(s) from runs that '
          'began before the rule')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
