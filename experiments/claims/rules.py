"""The claims' rules as data: docs/claims/<number>_<name>.json, read and checked.

A rule file names the paper's claim, the result files that decide it, the
command that makes them, the measure (`measures.MEASURES`) that reads the
numbers from the files, and the rule: its metric, comparison, threshold and
seeds, and the verdict function (`verdicts.VERDICTS`) that applies it. The
rule is committed before the runs (`history.check`). A rule written down
after its results says so in `post_hoc` (why, and where the rule stood
before), and the tables mark its verdict "post hoc". Files a rule reads
that were there before it (another rule's finished runs, e.g. the arm it
is compared with) are `given`, not `results`: they must be committed before
the rule.
"""

from __future__ import annotations

import glob
import json
import os

from experiments.claims import verdicts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
RULES = 'docs/claims'
_FIELDS = {'claim', 'results', 'command', 'measure', 'rule', 'post_hoc',
           'given'}
_RULE_FIELDS = {'verdict', 'metric', 'comparison', 'threshold', 'seeds'}


def number(cid: str) -> int:
  """A rule id's number ('9_if_rl_reward' -> 9)."""
  head = cid.split('_')[0]
  return int(head) if head.isdigit() else 1 << 30


def load_rules(root: str = ROOT) -> dict[str, dict]:
  """{claim id: rule file}, in the order of the ids' leading numbers (9
  before 10); a malformed file is an error naming it and the field."""
  out = {}
  paths = glob.glob(os.path.join(root, RULES, '*.json'))
  for path in sorted(paths, key=lambda p: (number(os.path.basename(p)), p)):
    cid = os.path.splitext(os.path.basename(path))[0]
    with open(path) as f:
      r = json.load(f)
    where = os.path.relpath(path, root)
    if set(r) - _FIELDS or {'claim', 'results', 'command', 'measure',
                            'rule'} - set(r):
      raise ValueError(f'{where}: fields {sorted(r)}, want {sorted(_FIELDS)} '
                       "('post_hoc' and 'given' optional)")
    missing = _RULE_FIELDS - set(r['rule'])
    if missing:
      raise ValueError(f'{where}: rule lacks {sorted(missing)}')
    if r['rule']['verdict'] not in verdicts.VERDICTS:
      raise ValueError(f"{where}: unknown verdict {r['rule']['verdict']!r} "
                       f'(known: {sorted(verdicts.VERDICTS)})')
    out[cid] = r
  return out


def result_files(rule: dict, root: str = ROOT, key: str = 'results'
                 ) -> list[str]:
  """The rule's result files (its '|'-separated globs), relative to root;
  key='given' for the files it reads that came before it, both for all."""
  keys = ('results', 'given') if key == 'all' else (key,)
  return sorted({os.path.relpath(p, root)
                 for k in keys if rule.get(k)
                 for pattern in rule[k].split('|')
                 for p in glob.glob(os.path.join(root, pattern))})


def describe(rule: dict) -> str:
  """The rule in words, for the evidence table."""
  r = rule['rule']
  return (f"{r['metric']}; {r['comparison']} (threshold {r['threshold']}, "
          f"{r['seeds']} seed{'s' if r['seeds'] != 1 else ''})")
