"""The claims' two tables, written from the rules and the committed results (never by hand).

- the evidence table, docs/claims/README.md: every rule, what its files
  show, its verdict, the rule in words, its files and their command;
- the claims at a glance, README.md: one short row a claim, its verdicts
  on each model, links to the rules;
- the claims in docs/results/INDEX.md: a rule, its verdict, its folders.

Each sits between markers in its file; `write` puts them there and `check`
fails when a file differs from what the results say.
"""

from __future__ import annotations

import dataclasses
import os

from experiments.claims import history
from experiments.claims import rules as rules_lib
from experiments.claims import verdicts
from experiments.claims.results import load

EVIDENCE = 'docs/claims/README.md'
GLANCE = 'README.md'
INDEX = 'docs/results/INDEX.md'
_MARKS = {EVIDENCE: ('<!-- evidence:begin (python -m experiments.claims '
                     '--write) -->', '<!-- evidence:end -->'),
          GLANCE: ('<!-- claims:begin (python -m experiments.claims '
                   '--write) -->', '<!-- claims:end -->'),
          INDEX: ('<!-- index-claims:begin (python -m experiments.claims '
                  '--write) -->', '<!-- index-claims:end -->')}

# The claims at a glance: (the claim in a few words, its rules on the
# attention + MoE model, its rules on the Mamba-2 hybrid), newest rule last.
GLANCE_ROWS = (
    ('Each RL stage improves its own domain', (1, 34), (15,)),
    ('SFT leaves math part-learned; GRPO on math improves it', (2,), (18,)),
    ('IF-RL with the paper\'s reward improves instruction following', (9,),
     (19,)),
    ('IF-RL hurts alignment; RLHF recovers it', (6, 35), (28,)),
    ('Training domains one after another forgets little', (8, 36), (16,)),
    ('MOPD reaches its teacher faster than GRPO', (3, 14), (23,)),
    ('MOPD recovers what a stage forgot', (10,), (20,)),
    ('A generative pairwise judge as the RLHF reward', (4,), (27,)),
    ('RLHF with the judge beats a Bradley-Terry reward', (5,), (26,)),
    ('RLHF\'s KL: the paper\'s 0.03 against 0.1', (7, 13), (30,)),
    ('Long-context RL mixed with other domains forgets less', (11,), (22,)),
    ('Long-context RL at half the learning rate forgets less', (25,), (24,)),
    ('The paper\'s stage order ends best', (12,), (29,)),
    ('Settings measured for the hybrid: RLHF, MOPD, SFT mix, the whole',
     (), (17, 32, 21, 31, 33)),
)


@dataclasses.dataclass
class Row:
  cid: str
  rule: dict
  text: str
  verdict: str
  early: list[str]

  @property
  def number(self) -> int:
    return rules_lib.number(self.cid)

  @property
  def marks(self) -> str:
    out = []
    if self.rule.get('post_hoc'):
      out.append('post hoc')
    elif self.early:
      out.append('runs began before the rule')
    return f" ({'; '.join(out)})" if out else ''

  @property
  def link(self) -> str:
    return f'{rules_lib.RULES}/{self.cid}.json'


def rows(root: str = rules_lib.ROOT) -> list[Row]:
  """Every rule's row: its measure's text and its verdict, by the
  functions that decide it (`history.resolve`)."""
  rules = rules_lib.load_rules(root)
  early = history.early_runs(root, rules) if not history.available(
      root) else {}
  out = []
  for cid, r in rules.items():
    fns = history.resolve(cid, r)
    if not rules_lib.result_files(r, root):
      text, verdict = 'not measured (no result files)', 'open'
    else:
      text, numbers = fns['measure'](rules_lib.result_files(r, root, 'all'))
      verdict = fns['verdict'](r['rule'], numbers)
      if r['rule']['verdict'] in verdicts.MEASUREMENTS:
        verdict = f'measured ({verdict}; no comparison decided)'
    out.append(Row(cid, r, text, verdict, early.get(cid, [])))
  return out


def _provenance(files: list[str]) -> str:
  """' (n runs at commits ...; k from a dirty tree; ...)' over the files
  that record their run (meta.commit)."""
  metas = []
  for f in files:
    if f.endswith('.json'):
      doc = load(f)
      if isinstance(doc, dict) and (doc.get('meta') or {}).get('commit'):
        metas.append(doc['meta'])
  if not metas:
    return ''
  commits = sorted({m['commit'][:7] for m in metas})
  dirty = sum(bool(m.get('dirty')) for m in metas)
  return (f" ({len(metas)} run{'s' if len(metas) > 1 else ''} at "
          f"{', '.join(commits)}; {dirty} from a dirty tree; each file's "
          'meta.command is its command)')


def evidence(table: list[Row], root: str = rules_lib.ROOT) -> str:
  lines = ['| # | the paper says | at CPU scale (from the files) | verdict | '
           'rule (committed before the results unless marked) | evidence | '
           'command |', '|---|---|---|---|---|---|---|']
  for x in table:
    r = x.rule
    where = (', '.join(f'`{p}`' for p in r['results'].split('|'))
             + ''.join(f', `{p}` (given: from before the rule)'
                       for p in (r.get('given') or '').split('|') if p)
             + _provenance(rules_lib.result_files(r, root, 'all')))
    lines.append(
        f"| [{x.number}]({x.cid}.json) | {r['claim']} | {x.text} | "
        f'**{x.verdict}**{x.marks} | {rules_lib.describe(r)} | {where} | '
        f"`{r['command']}` |")
  return '\n'.join(lines)


def glance(table: list[Row]) -> str:
  by = {x.number: x for x in table}
  cell = lambda ns: '; '.join(
      f'{by[n].verdict}{by[n].marks} ([{n}]({by[n].link}))' for n in ns
      if n in by) or '-'
  lines = ['| claim | attention + MoE | Mamba-2 hybrid |', '|---|---|---|']
  lines += [f'| {claim} | {cell(a)} | {cell(h)} |'
            for claim, a, h in GLANCE_ROWS]
  listed = {n for _, a, h in GLANCE_ROWS for n in a + h}
  missing = sorted(set(by) - listed)
  if missing:
    raise ValueError(f'claims {missing} are in no row of the README\'s '
                     'glance table (experiments/claims/tables.py GLANCE_ROWS)')
  return '\n'.join(lines)


def _folders(files: list[str]) -> list[str]:
  """The result folders (docs/results/<kind>/<date>/<name>) of `files`."""
  out = []
  for f in files:
    parts = f.split('/')
    if parts[:2] == ['docs', 'results'] and len(parts) > 5:
      folder = '/'.join(parts[2:5])
      if folder not in out:
        out.append(folder)
  return out


def index(table: list[Row], root: str = rules_lib.ROOT) -> str:
  """docs/results/INDEX.md's claims: a rule, its verdict, its folders."""
  lines = ['| rule | claim | verdict | folders |', '|---|---|---|---|']
  for x in table:
    folders = _folders(rules_lib.result_files(x.rule, root))
    lines.append(f"| [{x.number}](../claims/{x.cid}.json) | "
                 f"{x.rule['claim']} | {x.verdict}{x.marks} | "
                 + (', '.join(f'[{f}]({f})' for f in folders) or '-') + ' |')
  return '\n'.join(lines)


def sections(root: str = rules_lib.ROOT) -> dict[str, str]:
  table = rows(root)
  return {EVIDENCE: evidence(table, root), GLANCE: glance(table),
          INDEX: index(table, root)}


def put(text: str, doc: str, path: str) -> str:
  """`doc` with `text` between the markers of `path`'s table."""
  begin, end = _MARKS[path]
  if begin not in doc or end not in doc:
    raise ValueError(f'{path} has no table markers ({begin} ... {end})')
  head, rest = doc.split(begin, 1)
  _, tail = rest.split(end, 1)
  return f'{head}{begin}\n\n{text}\n\n{end}{tail}'


def write(root: str = rules_lib.ROOT) -> list[str]:
  """Writes both tables; the paths written."""
  out = []
  for path, text in sections(root).items():
    full = os.path.join(root, path)
    with open(full) as f:
      doc = f.read()
    with open(full, 'w') as f:
      f.write(put(text, doc, path))
    out.append(path)
  return out


def stale(root: str = rules_lib.ROOT) -> list[str]:
  """The files whose table is not what the results say."""
  out = []
  for path, text in sections(root).items():
    with open(os.path.join(root, path)) as f:
      doc = f.read()
    if put(text, doc, path) != doc:
      out.append(path)
  return out
