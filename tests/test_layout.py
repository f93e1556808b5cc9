"""The house rules that code can check: no private imports across packages, arrows down, short RL functions."""

import ast
import pathlib

import pytest

_ROOT = pathlib.Path(__file__).resolve().parents[1]
_LIB = _ROOT / 'cascade_jax'


def _imports(path: pathlib.Path):
  """(line, module) of every `from cascade_jax...` / `import cascade_jax...`."""
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and (
        node.module.startswith('cascade_jax')):
      for alias in node.names:
        yield node.lineno, f'{node.module}.{alias.name}'
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith('cascade_jax'):
          yield node.lineno, alias.name


def _files(*dirs):
  return sorted(p for d in dirs for p in (_ROOT / d).rglob('*.py'))


def test_no_module_imports_another_packages_private_module():
  bad = []
  for path in _files('cascade_jax', 'experiments', 'configs', 'colabs'):
    rel = path.relative_to(_ROOT)
    own = rel.parts[1] if rel.parts[0] == 'cascade_jax' else None
    for line, mod in _imports(path):
      parts = mod.split('.')
      if len(parts) > 2 and parts[1] != own and any(
          p.startswith('_') for p in parts[2:]):
        bad.append(f'{rel}:{line} imports {mod}')
  assert not bad, '\n'.join(bad)


# Packages each library package may import (arrows point down only).
_BELOW = {
    'losses': set(),
    'ops': {'kernels', 'utils'},
    'sharding': set(),
    'model': {'sharding', 'ops'},
}


@pytest.mark.parametrize('package', sorted(_BELOW))
def test_low_packages_import_only_what_is_below_them(package):
  bad = []
  for path in _files(f'cascade_jax/{package}'):
    for line, mod in _imports(path):
      other = mod.split('.')[1]
      if other not in _BELOW[package] | {package}:
        bad.append(f'{path.relative_to(_ROOT)}:{line} imports {mod}')
  assert not bad, '\n'.join(bad)


def test_nothing_in_the_library_imports_experiments_or_configs():
  for path in _files('cascade_jax'):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import)
               else [node.module or ''] if isinstance(node, ast.ImportFrom)
               else [])
      assert not any(n.split('.')[0] in ('experiments', 'configs')
                     for n in names), path


def test_no_function_in_rl_runs_past_80_lines():
  # A standing rule (issue 28): the RL step is the code later work changes.
  long = []
  for path in _files('cascade_jax/rl'):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = node.end_lineno - node.lineno + 1
        if n > 80:
          long.append(f'{path.name}:{node.lineno} {node.name}: {n} lines')
  assert not long, long
