"""Compiles a model's steps ahead of time for several meshes and prints what each costs per device.

  python -m experiments.plan --config=configs/plan.py:qwen3_30b_a3b
  python -m experiments.plan --config=configs/plan.py:small --workdir=/tmp/p

With --workdir, writes config.json and results.json (every figure) there.
"""

import json
import os
import sys

# Fake CPU devices for the meshes when no TPU topology is compiled for
# (before JAX starts; a mesh of up to 256 devices).
if '--xla_force_host_platform_device_count' not in os.environ.get(
    'XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             ' --xla_force_host_platform_device_count=256')
os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')
os.environ.setdefault('TPU_WORKER_HOSTNAMES', 'localhost')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from ml_collections import config_flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from cascade_jax import aot  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import model  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import utils  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/plan.py', 'Plan config.', lock_config=True)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'If set, writes config.json, results.json and table.txt '
    'here (after every step).')
_FROM = flags.DEFINE_string(
    'from_results', None, 'Prints (and with --workdir writes) the table of '
    'an earlier results.json instead of compiling.')


def main(argv):
  del argv
  utils.quiet_logs()
  c = _CONFIG.value
  if _FROM.value:
    with open(_FROM.value) as f:
      costs = aot.from_results(json.load(f))
    _write(c, costs)
    print(utils.format_table(*aot.table(costs)))
    print(_LEGEND)
    return
  cfg = aot.model_config(c)
  print(f'[plan] {c.model.preset}: {model.count_params(cfg)}; params '
        f'{cfg.param_dtype}, compute {cfg.dtype}; remat {cfg.remat}, '
        f'scan_layers {cfg.scan_layers}, logits_chunk {cfg.logits_chunk}; '
        f'libtpu {"found" if aot.libtpu_available() else "not installed"}',
        flush=True)
  costs = aot.run(c, progress=lambda s: print(s, flush=True),
                  on_step=lambda costs: _write(c, costs))
  print(utils.format_table(*aot.table(costs)))
  print(_LEGEND)
  sys.stdout.flush()


_LEGEND = (
    'Per device. args: weights + optimizer state + batch as compiled; '
    'state (counted): the weights (+ optimizer state in training) one '
    'device holds, from their shapes and shardings; peak: args + outputs + '
    'temporaries - donated. TFLOP and HBM GB moved: cost_analysis of the '
    'step compiled unrolled at 1 and 2 repeats of the layer unit, '
    'extrapolated to the depth (XLA counts a scanned loop body once); TFLOP '
    '(counted): 2 x active weights x tokens per forward, plus attention '
    '(4 x heads x head_dim x mean keys seen, per token and attention '
    'layer; x3 training, x4 with full remat; Mamba scans not counted). '
    'Times: max(TFLOP / '
    'peak, bytes / HBM bandwidth), communication not counted; "(counted)": '
    'the counted TFLOP and the arguments read once (a lower bound). '
    'free GB: the chip\'s HBM (v5p 95 GB, H200 141 GB) less the peak; the '
    'runtime\'s own reserve and fragmentation come out of it, so a step '
    'with a few GB free may still not run.')


def _write(c, costs):
  if not _WORKDIR.value:
    return
  header, rows = aot.table(costs)
  utils.write_results(_WORKDIR.value, c, [
      dict(zip(header, r), **{k: getattr(x, k) for k in (
          'platform', 'argument_bytes', 'output_bytes', 'temp_bytes',
          'alias_bytes', 'flops', 'bytes_accessed', 'compile_s',
          'state_bytes', 'model_flops', 'step', 'variant', 'error', 'ops')})
      for r, x in zip(rows, costs)])
  with open(os.path.join(_WORKDIR.value, 'table.txt'), 'w') as f:
    f.write(utils.format_table(header, rows) + '\n\n' + _LEGEND + '\n')


if __name__ == '__main__':
  app.run(main)
