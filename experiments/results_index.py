"""docs/results/INDEX.md, checked, and the README's figures written from it.

  python -m experiments.results_index            # print the README's sections
  python -m experiments.results_index --write    # write them into README.md
  python -m experiments.results_index --check    # exit 1 if the index or the
                                                 # README's figures are wrong

The index's Figures table is the one place a current figure is written by
hand (with its machine, date and folder); the README shows some of its rows
(`FRONT`) and the two commands' own figures (`COMMANDS`). `--check` fails
when a row's folder is missing or archived, a date is malformed, a quantity
the README needs has no row, or the README's sections are stale.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INDEX = 'docs/results/INDEX.md'
README = 'README.md'
# The README's figures: these quantities' rows, every machine's.
FRONT = (
    'main job, wall time',
    'default test suite, wall time',
    'sampler vs transformers\' generate, tokens/s at batch 1 / 4 / 16 / 64',
    'Qwen3-30B-A3B on v5p-64 (32 chips), peak a chip: GRPO and MOPD / '
    'prefill / decode / weight sync',
    'Nemotron-3-Nano on v5p-16 (8 chips, bf16 Adam moments), peak a chip: '
    'SFT / GRPO / MOPD',
    'the pod model (v5p-64, recipe batch): a synchronous GRPO step, tokens/s '
    'a chip, best learner/sampler split',
    'MoE layer on a GPU (Qwen3-like, bf16), time against an ideal dense MLP: '
    'ragged / dropless / capacity',
    'train-step MFU on a GPU (~1.3B MoE, sequence 4,096)',
)
# The two commands' figures (the README's line under them): each the
# first row of its quantity.
COMMANDS = (('bash scripts/main.sh', 'main job, wall time'),
            ('bash scripts/test.sh', 'default test suite, wall time'))
_MARKS = {
    'figures': ('<!-- figures:begin (python -m experiments.results_index '
                '--write) -->', '<!-- figures:end -->'),
    'commands': ('<!-- commands:begin (python -m experiments.results_index '
                 '--write) -->', '<!-- commands:end -->'),
}
_LINK = re.compile(r'\[([^\]]+)\]\(([^)]+)\)')


@dataclasses.dataclass
class Figure:
  quantity: str
  figure: str
  machine: str
  date: str
  folders: list[str]             # relative to docs/results


def figures(root: str = ROOT) -> list[Figure]:
  """The rows of the index's Figures table."""
  with open(os.path.join(root, INDEX)) as f:
    text = f.read()
  body = text.split('## Figures', 1)[1].split('\n## ', 1)[0]
  out = []
  for line in body.splitlines():
    cells = [c.strip() for c in line.strip().strip('|').split('|')]
    if len(cells) != 5 or cells[0] in ('quantity', '---'):
      continue
    out.append(Figure(*cells[:4], [t for _, t in _LINK.findall(cells[4])]))
  return out


def problems(root: str = ROOT) -> list[str]:
  """What is wrong with the index: one line each."""
  rows, out = figures(root), []
  if not rows:
    out.append(f'{INDEX}: no Figures table')
  for r in rows:
    if not re.fullmatch(r'\d{4}-\d{2}-\d{2}', r.date):
      out.append(f'{INDEX}: {r.quantity!r}: date {r.date!r} is not '
                 'YYYY-MM-DD')
    if not r.folders:
      out.append(f'{INDEX}: {r.quantity!r}: no folder')
    for f in r.folders:
      if f.split('/')[0] == 'archive':
        out.append(f'{INDEX}: {r.quantity!r} points into archive/ ({f})')
      elif not os.path.isdir(os.path.join(root, 'docs', 'results', f)):
        out.append(f'{INDEX}: {r.quantity!r}: no folder docs/results/{f}')
  have = {r.quantity for r in rows}
  for q in FRONT + tuple(q for _, q in COMMANDS):
    if q not in have:
      out.append(f'{INDEX}: no row for {q!r}, which README.md shows')
  return out


def _link(f: str) -> str:
  return f'[{f}](docs/results/{f})'


def sections(root: str = ROOT) -> dict[str, str]:
  rows = figures(root)
  table = ['| quantity | figure | machine | date | folder |',
           '|---|---|---|---|---|']
  for q in FRONT:
    for r in rows:
      if r.quantity == q:
        table.append(f'| {r.quantity} | {r.figure} | {r.machine} | {r.date} '
                     f"| {', '.join(map(_link, r.folders))} |")
  commands = []
  for cmd, q in COMMANDS:
    r = next((r for r in rows if r.quantity == q), None)
    if r is not None:
      commands.append(f'`{cmd}`: {r.figure} on a {r.machine} ({r.date}, '
                      f'{_link(r.folders[0])}).')
  return dict(figures='\n'.join(table), commands='\n'.join(commands))


def put(text: str, doc: str, name: str) -> str:
  begin, end = _MARKS[name]
  if begin not in doc or end not in doc:
    raise ValueError(f'{README} has no {name} markers ({begin} ... {end})')
  head, rest = doc.split(begin, 1)
  _, tail = rest.split(end, 1)
  return f'{head}{begin}\n{text}\n{end}{tail}'


def readme_with(root: str = ROOT) -> tuple[str, str]:
  """(README.md as it is, as the index says it should be)."""
  with open(os.path.join(root, README)) as f:
    doc = f.read()
  want = doc
  for name, text in sections(root).items():
    want = put(text, want, name)
  return doc, want


def main(argv: list[str]) -> int:
  if '--write' in argv:
    _, want = readme_with()
    with open(os.path.join(ROOT, README), 'w') as f:
      f.write(want)
    print(f'wrote the figures of {README} from {INDEX}')
    return 0
  if '--check' in argv:
    bad = problems()
    doc, want = readme_with()
    if doc != want:
      bad.append(f'{README}: its figures are not {INDEX}\'s; run python -m '
                 'experiments.results_index --write')
    for p in bad:
      print(p, file=sys.stderr)
    if not bad:
      print(f'{INDEX} checked; {README} shows its figures')
    return 1 if bad else 0
  for name, text in sections().items():
    print(f'# {name}\n{text}\n')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
