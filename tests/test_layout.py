"""The house rules that code can check: no import circles, no private names across files, arrows down, short RL functions."""

import ast
import collections
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
  # A standing rule: the RL step is the code later work changes.
  long = []
  for path in _files('cascade_jax/rl'):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = node.end_lineno - node.lineno + 1
        if n > 80:
          long.append(f'{path.name}:{node.lineno} {node.name}: {n} lines')
  assert not long, long


# ------------------------------------------------- circles and private names
# Checked over the library and everything that imports it (tests may reach
# into the code they test).
_CHECKED = ('cascade_jax', 'experiments', 'benchmarks', 'configs', 'colabs')


def _module_name(root: pathlib.Path, path: pathlib.Path) -> str:
  parts = list(path.relative_to(root).with_suffix('').parts)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _import_graph(root: pathlib.Path, dirs=_CHECKED):
  """({module: modules it imports anywhere in its file, lazily included},
  [private names it takes from another file]) over `dirs` of `root`.

  An import of `a.b.c` is an arrow to `a.b.c` (not to the packages above
  it, which Python runs first but which do not depend on the importer);
  `from a.b import c` is an arrow to `a.b.c` where that is a module, else
  to `a.b`, taking its name `c`; `m._x` of an imported module `m` takes
  `m`'s name `_x` unless `m._x` is a module of its own.
  """
  paths = {}
  for d in dirs:
    for path in sorted((root / d).rglob('*.py')):
      paths[_module_name(root, path)] = path
  edges, private = collections.defaultdict(set), []
  for mod, path in paths.items():
    tree = ast.parse(path.read_text())
    package = mod if path.name == '__init__.py' else mod.rpartition('.')[0]
    aliases = {}
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        for a in node.names:
          if a.name in paths:
            edges[mod].add(a.name)
            if a.asname:
              aliases[a.asname] = a.name
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ''
        if node.level:
          up = package.split('.')[:len(package.split('.')) - node.level + 1]
          base = '.'.join(up + ([base] if base else []))
        for a in node.names:
          full = f'{base}.{a.name}'
          if full in paths:
            edges[mod].add(full)
            aliases[a.asname or a.name] = full
          elif base in paths:
            edges[mod].add(base)
            if a.name.startswith('_') and not a.name.startswith('__'):
              private.append(f'{path.relative_to(root)}:{node.lineno} takes '
                             f'{a.name} from {base}')
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
          and node.value.id in aliases and node.attr.startswith('_')
          and not node.attr.startswith('__')
          and f'{aliases[node.value.id]}.{node.attr}' not in paths):
        private.append(f'{path.relative_to(root)}:{node.lineno} takes '
                       f'{node.attr} from {aliases[node.value.id]}')
    edges[mod].discard(mod)
  return dict(edges), private


def _circles(edges) -> list[list[str]]:
  """The import graph's circles: each strongly connected set of two or
  more modules (Tarjan's algorithm), sorted."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in edges.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      group = []
      while True:
        w = stack.pop()
        on.discard(w)
        group.append(w)
        if w == v:
          break
      if len(group) > 1:
        out.append(sorted(group))

  for v in sorted(edges):
    if v not in index:
      visit(v)
  return sorted(out)


def test_no_file_imports_one_that_imports_it_back():
  edges, _ = _import_graph(_ROOT)
  circles = _circles(edges)
  assert not circles, 'import circles (a lazy import counts):\n' + '\n'.join(
      ' <-> '.join(c) for c in circles)


def test_no_file_takes_another_files_private_names():
  _, private = _import_graph(_ROOT)
  assert not private, '\n'.join(private)


def test_the_layout_checks_find_a_planted_circle_and_private_name(tmp_path):
  # The checks above, on a package with one of each: a lazy import back
  # (a -> b -> c -> a) and a private helper taken from another file.
  pkg = tmp_path / 'cascade_jax' / 'pkg'
  pkg.mkdir(parents=True)
  (tmp_path / 'cascade_jax' / '__init__.py').write_text('')
  (pkg / '__init__.py').write_text('from cascade_jax.pkg._a import run\n')
  (pkg / '_a.py').write_text('from cascade_jax.pkg import _b\n'
                             'def run():\n  return _b._helper()\n')
  (pkg / '_b.py').write_text('def _helper():\n'
                             '  from cascade_jax.pkg import _c\n'
                             '  return _c.x\n')
  (pkg / '_c.py').write_text('from cascade_jax.pkg._a import run as x\n')
  edges, private = _import_graph(tmp_path, dirs=('cascade_jax',))
  assert _circles(edges) == [['cascade_jax.pkg._a', 'cascade_jax.pkg._b',
                              'cascade_jax.pkg._c']]
  assert private == ['cascade_jax/pkg/_a.py:3 takes _helper from '
                     'cascade_jax.pkg._b']
