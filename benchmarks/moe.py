"""Benchmarks the MoE dispatch paths (forward + backward) against an ideal dense MLP.

  python -m benchmarks.moe --config=benchmarks/configs/moe.py
"""

from absl import app
from absl import flags
from ml_collections import config_flags

import jax

from cascade_jax import utils
from benchmarks import moe_layers

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'benchmarks/configs/moe.py', 'Benchmark config.', lock_config=True)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'If set, writes config.json and results.json here.')


def main(argv):
  del argv
  c = _CONFIG.value
  print(f'MoE layer fwd+bwd on {jax.devices()[0].device_kind} '
        f'(jax {jax.__version__}): {c.tokens} tokens, embed {c.embed_dim}, '
        f'{c.num_experts} experts x width {c.expert_dim}, top-{c.top_k}, '
        f'{c.activation}, capacity factor {c.capacity_factor}, {c.dtype}')
  rows = moe_layers.moe_layer_benchmark(**c.to_dict())
  print(utils.format_table(
      ['path', 'ms', 'x ideal', 'GFLOP/s', 'of matmul peak', 'dropped'],
      [[r['path'], r['seconds'] * 1e3, r['ratio'], r['gflops'], r['of_peak'],
        r['dropped']] for r in rows]))
  best = min((r for r in rows[1:-1]), key=lambda r: r['ratio'])
  print(f"best path: {best['path']} at {best['ratio']:.2f}x the ideal dense MLP")
  if _WORKDIR.value:
    utils.write_results(_WORKDIR.value, c, rows)


if __name__ == '__main__':
  app.run(main)
