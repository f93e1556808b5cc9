"""Rules of the repository as their tables decide them, for the claims tests."""

import importlib.util

from experiments.claims import history
from experiments.claims import rules as rules_lib


def rule_of(cid: str) -> dict:
  """The repository's rule `cid`, with its id (`verdict` reads it)."""
  return dict(rules_lib.load_rules()[cid], id=cid)


def verdict(rule: dict, numbers: dict) -> str:
  """The verdict of `rule` (from `rule_of`) by the function that decides it
  in the tables (a frozen one where its code changed after its results)."""
  fn = history.resolve(rule['id'], rule)['verdict']
  return fn(rule['rule'], numbers)


def measure(rule: dict):
  """The measure that decides `rule` (from `rule_of`) in the tables."""
  return history.resolve(rule['id'], rule)['measure']


def repo_deciders(root):
  """`history.check`'s deciders for a test repository: the functions of its
  own experiments/claims/code.py as it is on disk."""
  def deciders(cid, rule):
    del cid
    spec = importlib.util.spec_from_file_location(
        'repo_code', root / 'experiments' / 'claims' / 'code.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return dict(verdict=getattr(mod, f"verdict_{rule['rule']['verdict']}"),
                measure=mod.MEASURES[rule['measure']])
  return deciders
