"""Whether each rule came before its results, read from git: the rule file, the result files and the code that decides.

For every rule with committed results (`check`):

- the rule file was committed before every result file was added (files
  are followed through renames, so a moved result keeps the commit that
  made it), and the files it takes as `given` before the rule;
- the rule file is the same now as at its first result (the whole file;
  result paths that moved are read through `MOVED`);
- the verdict and measure functions that decide it are the same now as at
  its first result (compared as code: docstrings, comments and leading
  underscores aside). A rule whose functions changed keeps the old ones
  (`frozen.FROZEN`); otherwise the change fails here: a new procedure is
  a new rule, under a new number;
- no registered rule's result comes from a dirty tree.

A rule written down after its results says so (`post_hoc`); it is checked
for that mark only. `early_runs` lists, per rule, the result files whose
runs began before the rule: made at a commit that does not contain the
rule, or started (`meta.date`) before the rule's commit; the tables mark
those rules.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import datetime
import functools
import inspect
import json
import os
import subprocess

from experiments.claims import frozen
from experiments.claims import measures
from experiments.claims import rules as rules_lib
from experiments.claims import verdicts

# Result folders that moved, old prefix -> new prefix: a rule file written
# before the move names the old paths (see `_same_rule`).
MOVED = {'docs/results/claims_<date>/': 'docs/results/claims/<date>/',
         'docs/results/claims_*/': 'docs/results/claims/*/',
         **{f'docs/results/claims_{d}/': f'docs/results/claims/{d}/'
            for d in ('2026-12-02', '2026-12-03', '2026-12-04', '2026-12-05',
                      '2026-12-06', '2026-12-07')}}


def _git(root: str, *args: str) -> str:
  return subprocess.run(['git', '-C', root, *args], capture_output=True,
                        text=True, check=True).stdout


def available(root: str = rules_lib.ROOT) -> str | None:
  """None when root's git history can be read whole; else why not."""
  try:
    if _git(root, 'rev-parse', '--is-shallow-repository').strip() == 'true':
      return 'a shallow clone'
  except (OSError, subprocess.CalledProcessError):
    return 'not a git checkout'
  return None


@dataclasses.dataclass
class _Files:
  """Where each path came from."""
  origin: dict[str, str]            # path now -> commit that added it
  path_at: dict[str, list]          # path now -> [(commit, path then)]
  order: dict[str, int]             # commit -> position, oldest first
  time: dict[str, int]              # commit -> committer time (unix)


def _files(root: str) -> _Files:
  """One pass over the repository's history, renames followed."""
  # No limit on rename detection: one commit moved every result folder.
  out = _git(root, '-c', 'diff.renameLimit=0', 'log', '--reverse', '-M',
             '--name-status', '--format=@%H %ct')
  origin, path_at, order, when = {}, {}, {}, {}
  commit = None
  for line in out.splitlines():
    if line.startswith('@'):
      commit, t = line[1:].split()
      order[commit], when[commit] = len(order), int(t)
      continue
    if not line.strip():
      continue
    status, *paths = line.split('\t')
    if status.startswith('R'):
      old, new = paths
      origin[new] = origin.pop(old, commit)
      path_at[new] = path_at.pop(old, []) + [(commit, new)]
    elif status == 'D':
      origin.pop(paths[0], None)
      path_at.pop(paths[0], None)
    else:
      if status == 'A' or paths[0] not in origin:
        origin[paths[0]] = commit
        path_at[paths[0]] = []
      path_at[paths[0]].append((commit, paths[0]))
  return _Files(origin, path_at, order, when)


def _path_then(files: _Files, path: str, commit: str) -> str | None:
  """Where `path` (a path now) was at `commit`."""
  where = None
  for c, p in files.path_at.get(path, []):
    if files.order[c] > files.order[commit]:
      break
    where = p
  return where


@functools.lru_cache(maxsize=None)
def _ancestor(root: str, a: str, b: str) -> bool:
  return subprocess.run(['git', '-C', root, 'merge-base', '--is-ancestor',
                         a, b], capture_output=True).returncode == 0


def _before(root: str, files: _Files, a: str, b: str) -> bool:
  """Commit a is a strict ancestor of commit b."""
  del files
  return a != b and _ancestor(root, a, b)


# ------------------------------------------------------------------ code


def _normal(fn: ast.FunctionDef) -> str:
  """A function as code: its body without the docstring, its own name and
  leading underscores of names aside (a helper moved to a public name is
  the same helper)."""
  fn = ast.parse(ast.unparse(fn)).body[0]
  body = fn.body
  if body and isinstance(body[0], ast.Expr) and isinstance(
      body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
    fn.body = body[1:]
  fn.name = 'f'
  for node in ast.walk(fn):
    if isinstance(node, ast.Name):
      node.id = node.id.lstrip('_') or node.id
    elif isinstance(node, ast.Attribute):
      node.attr = node.attr.lstrip('_') or node.attr
    elif isinstance(node, ast.arg):
      node.arg = node.arg.lstrip('_') or node.arg
  return ast.dump(fn, include_attributes=False)


def _now(fn) -> str:
  return _normal(ast.parse(inspect.getsource(fn)).body[0])


def _blobs(root: str, ids: list[str]) -> dict[str, str]:
  """The contents of git blobs, read in one call."""
  out = subprocess.run(['git', '-C', root, 'cat-file', '--batch'],
                       input=('\n'.join(ids) + '\n').encode(),
                       capture_output=True,
                       check=True).stdout
  blobs, i = {}, 0
  for blob in ids:
    header_end = out.index(b'\n', i)
    size = int(out[i:header_end].split()[2])
    blobs[blob] = out[header_end + 1:header_end + 1 + size].decode()
    i = header_end + 1 + size + 1
  return blobs


@functools.lru_cache(maxsize=None)
def _parsed(root: str, blob: str, text: str):
  del root, blob
  try:
    return ast.parse(text)
  except SyntaxError:
    return None


@functools.lru_cache(maxsize=None)
def _code_at(root: str, commit: str) -> dict:
  """At `commit`: {'functions': {(file stem, name): FunctionDef},
  'measures': {key: (file stem, expression)}} over experiments/'s files."""
  listing = [line.split(None, 3) for line in _git(
      root, 'ls-tree', '-r', commit, 'experiments').splitlines()]
  files = {path: blob for _, _, blob, path in listing if path.endswith('.py')}
  texts = _blobs(root, sorted(set(files.values())))
  fns, meas = {}, {}
  for path, blob in files.items():
    tree = _parsed(root, blob, texts[blob])
    if tree is None:
      continue
    stem = os.path.splitext(os.path.basename(path))[0].lstrip('_')
    for node in tree.body:
      if isinstance(node, ast.FunctionDef):
        fns[(stem, node.name)] = node
      target = (node.target if isinstance(node, ast.AnnAssign) else
                node.targets[0] if isinstance(node, ast.Assign) else None)
      if getattr(target, 'id', None) == 'MEASURES' and isinstance(
          node.value, ast.Call):
        meas.update({kw.arg: (stem, kw.value) for kw in node.value.keywords})
  return dict(functions=fns, measures=meas)


def _function_at(root: str, commit: str, kind: str, name: str):
  """The verdict function `verdict_<name>`, or the measure registered as
  `name`, at `commit` (None if there was none)."""
  code = _code_at(root, commit)
  fns = code['functions']
  if kind == 'verdict':
    hits = [f for (_, n), f in fns.items() if n == f'verdict_{name}']
    return hits[0] if hits else None
  if name not in code['measures']:
    return None
  stem, expr = code['measures'][name]
  if isinstance(expr, ast.Attribute):     # module.function
    stem, fn = expr.value.id.lstrip('_'), expr.attr
  else:
    fn = expr.id
  return fns.get((stem, fn))


def resolve(cid: str, rule: dict) -> dict:
  """{'verdict': fn, 'measure': fn}: the functions that decide rule `cid`
  (its frozen ones where the code changed after its results)."""
  out = dict(verdict=verdicts.VERDICTS[rule['rule']['verdict']],
             measure=measures.MEASURES[rule['measure']])
  out.update(frozen.FROZEN.get(cid, {}))
  return out


# ----------------------------------------------------------------- rules


def _moved(text: str) -> str:
  for old, new in MOVED.items():
    text = text.replace(old, new)
  return text


def _same_rule(then: dict, now: dict) -> list[str]:
  """The fields of a rule file that differ (paths read through MOVED)."""
  then = json.loads(_moved(json.dumps(then)))
  return sorted(k for k in set(then) | set(now) if then.get(k) != now.get(k))


def _meta(path: str) -> dict:
  try:
    with open(path) as f:
      doc = json.load(f)
  except (OSError, json.JSONDecodeError, UnicodeDecodeError):
    return {}
  return (doc.get('meta') or {}) if isinstance(doc, dict) else {}


def check(root: str = rules_lib.ROOT, rules: dict | None = None,
          deciders=None) -> list[str]:
  """Problems, one line each (see the module's docstring). `deciders(cid,
  rule)`: the functions that decide a rule (default `resolve`)."""
  deciders = deciders or resolve
  rules = rules_lib.load_rules(root) if rules is None else rules
  files = _files(root)
  problems = []
  for cid, r in rules.items():
    rel = os.path.join(rules_lib.RULES, f'{cid}.json')
    at = files.origin.get(rel)
    results = rules_lib.result_files(r, root)
    added = {f: files.origin.get(f) for f in results}
    late = [f'{f} (the rule is not committed)' for f, a in added.items()
            if a is None and at is None]
    late += [f'{f} (added at {a[:7]}, the rule at '
             f"{at[:7] if at else 'uncommitted'})"
             for f, a in added.items()
             if a is not None and (at is None or not _before(root, files, at,
                                                                  a))]
    for f in rules_lib.result_files(r, root, 'given'):
      a = files.origin.get(f)
      if a is None or at is None or not _before(root, files, a, at):
        late.append(f'{f} (given, but not committed before the rule)')
    if r.get('post_hoc'):
      if not late and results:
        problems.append(f'{rel}: marked post_hoc, but its rule was committed '
                        'before every result: drop post_hoc')
      continue
    if late:
      problems.append(f'{rel}: its rule was not committed before its '
                      f'results: {"; ".join(late)}')
      continue
    committed = [a for a in added.values() if a]
    if not committed:
      continue
    first = min(committed, key=files.order.__getitem__)
    problems += _changed_since(root, files, cid, r, rel, first,
                               deciders(cid, r))
    for f in results:
      if f.endswith('.json') and _meta(os.path.join(root, f)).get('dirty'):
        problems.append(f'{f}: made from a dirty tree (rule {cid})')
  return problems


def _changed_since(root, files, cid, r, rel, first, fns) -> list[str]:
  """What changed in the rule file and its functions (`fns`) since
  `first`."""
  del cid
  out = []
  then_path = _path_then(files, rel, first)
  then = json.loads(_git(root, 'show', f'{first}:{then_path}'))
  with open(os.path.join(root, rel)) as f:
    now = json.load(f)
  diff = _same_rule(then, now)
  if diff:
    out.append(f'{rel}: changed after its first result ({first[:7]}): '
               f'{diff}; a new rule takes a new number')
  names = dict(verdict=r['rule']['verdict'], measure=r['measure'])
  for kind, fn in fns.items():
    old = _function_at(root, first, kind, names[kind])
    if old is None:
      out.append(f'{rel}: its {kind} {names[kind]!r} did not exist at its '
                 f'first result ({first[:7]})')
    elif _normal(old) != _now(fn):
      out.append(f'{rel}: its {kind} function {fn.__name__} changed after '
                 f'its first result ({first[:7]}): keep the old one for this '
                 'rule (claims/frozen.py) or register a new rule')
  return out


def early_runs(root: str = rules_lib.ROOT, rules: dict | None = None
               ) -> dict[str, list[str]]:
  """{rule id: result files whose runs began before the rule}: made at a
  commit that does not contain the rule's, or started (their meta.date)
  before the rule's commit."""
  rules = rules_lib.load_rules(root) if rules is None else rules
  files = _files(root)
  out = collections.defaultdict(list)
  for cid, r in rules.items():
    at = files.origin.get(os.path.join(rules_lib.RULES, f'{cid}.json'))
    if at is None:
      continue
    for f in rules_lib.result_files(r, root):
      meta = _meta(os.path.join(root, f)) if f.endswith('.json') else {}
      commit, date = meta.get('commit'), meta.get('date')
      if not commit or commit == 'unknown':
        continue
      started = datetime.datetime.fromisoformat(date).timestamp() if (
          date) else None
      if (commit != at and not _before(root, files, at, commit)) or (
          started is not None and started < files.time[at]):
        out[cid].append(f)
  return dict(out)
