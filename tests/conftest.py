"""Test set-up: 8 fake CPU devices for the sharding tests (before JAX starts)."""

import os

flags = os.environ.get('XLA_FLAGS', '')
if '--xla_force_host_platform_device_count' not in flags:
  os.environ['XLA_FLAGS'] = (
      flags + ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import fcntl
import gc
import shutil
import tempfile

import pytest

# One persistent XLA compilation cache for the whole test run, fresh each
# run (a laptop and CI start equally cold): the xdist workers and the
# launchers the tests start (experiments.*) share it, so a program compiled
# by one test file is loaded by the next (the quick configs recur across
# files). Set before the workers start, which inherit it;
# CASCADE_JAX_TEST_XLA_CACHE=0 runs without it.
_MADE_CACHE = None
if os.environ.get('CASCADE_JAX_TEST_XLA_CACHE', '1') != '0':
  if 'CASCADE_JAX_XLA_CACHE' not in os.environ:
    _MADE_CACHE = tempfile.mkdtemp(prefix='cascade_jax_test_xla_')
    os.environ['CASCADE_JAX_XLA_CACHE'] = _MADE_CACHE
  from cascade_jax import utils  # pylint: disable=g-import-not-at-top
  utils.enable_compilation_cache()


def pytest_unconfigure(config):
  # The process that made the cache (pytest itself, not an xdist worker,
  # which inherits it) removes it.
  if _MADE_CACHE and not hasattr(config, 'workerinput'):
    shutil.rmtree(_MADE_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _cpu_kernels_setting():
  """A run pins CASCADE_JAX_CPU_KERNELS to its kernels (ops.keep_run_kernels)
  for its processes: a test's run leaves the next test the setting it
  found."""
  before = os.environ.get('CASCADE_JAX_CPU_KERNELS')
  yield
  if before is None:
    os.environ.pop('CASCADE_JAX_CPU_KERNELS', None)
  else:
    os.environ['CASCADE_JAX_CPU_KERNELS'] = before


@pytest.fixture(autouse=True, scope='module')
def _free_compiled_programs():
  """After each test file, drop JAX's compiled programs and traces.

  A test worker lives through hundreds of tests: without this its memory
  only grows, beside the multi-process tests that need room of their own.
  """
  yield
  import jax
  jax.clear_caches()
  gc.collect()


# Files of whole cascades and long compiles, longest first (measured in the
# clean-clone run at 1391021: 200-320 s a test).
_LONG_FILES = ('test_cascade.py', 'test_import_hf.py', 'test_colabs.py',
               'test_rl_step.py', 'test_data.py', 'test_sft.py')


def pytest_collection_modifyitems(config, items):
  """Longest work first, so that the two xdist workers end together.

  test_scale's cascades and plans (marked xdist_group 'heavy', about 1,700 s
  in all) were collected late and started when the other worker had little
  left. (The mark does not group them on one worker here: pytest-xdist 3.8
  marks a group in the node's `_nodeid`, which pytest 9.2 no longer reads,
  so each test is sent on its own (pytest-dev/pytest-xdist#1386; checked
  on a file of 4 tests, grouped under pytest 9.1.1); tests that must share
  a fixture are one test. Sending each file whole instead, `--dist
  loadfile`, was no faster: docs/results/archive/test_suite_2026-12-07b.) Now
  they start first, then the files of full cascades, then the rest, each
  in collected order (a stable sort).
  """
  del config

  def rank(item):
    if item.get_closest_marker('xdist_group'):
      return 0
    name = item.path.name
    return 1 + (_LONG_FILES.index(name) if name in _LONG_FILES
                else len(_LONG_FILES))

  items.sort(key=rank)


def shared_run(tmp_path_factory, name: str, build) -> str:
  """A run directory made once for the whole session, whichever xdist
  worker asks first: it builds `build(path)` under a file lock while the
  others wait, then all read it. Tests must not write into it (copy it to
  continue a run)."""
  base = tmp_path_factory.getbasetemp()
  root = base.parent if 'PYTEST_XDIST_WORKER' in os.environ else base
  path = root / name
  with open(root / f'{name}.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (path / '.built').exists():
      shutil.rmtree(path, ignore_errors=True)
      kernels = os.environ.get('CASCADE_JAX_CPU_KERNELS')
      try:
        build(str(path))
      finally:   # the run pinned its kernels (_cpu_kernels_setting)
        if kernels is None:
          os.environ.pop('CASCADE_JAX_CPU_KERNELS', None)
        else:
          os.environ['CASCADE_JAX_CPU_KERNELS'] = kernels
      (path / '.built').write_text('')
  return str(path)


@pytest.fixture(scope='session')
def main_job_sft(tmp_path_factory):
  """A finished run of the main job's model (configs/sft.py's quick SFT:
  `small`, its capacity dispatch, fp32) after 6 steps, its checkpoint at
  step 6: what the RL, judge and SFT-refusal tests start from, as users
  do. Made once for the session; read-only."""
  import sys  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
      __file__))))
  from cascade_jax import sft  # pylint: disable=g-import-not-at-top
  from configs import sft as sft_config  # pylint: disable=g-import-not-at-top

  def build(d):
    c = sft_config.get_config('quick')
    c.steps, c.eval_n, c.checkpoint_every = 6, 0, 6
    sft.run(c, d)
  return shared_run(tmp_path_factory, 'main_job_sft', build)
