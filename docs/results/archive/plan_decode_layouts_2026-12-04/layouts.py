"""The 30B sampler's decode step at depth: its weights' memory layouts, and what XLA's cost model counts.

Compiles the plan's decode step (configs/plan.py:qwen3_30b_a3b, v5p-64:
32 chips, fsdp 4 x expert 8, bf16 sampler copy in the inference layout,
unrolled over the 48 layers as the plan compiles it) for the TPU topology on
this CPU host, with the sampler's weights in one of three layouts:

- `default`: the learner's (row-major) layout;
- `decode`: `rl.sampler_weight_layout='decode'`, the attention's input
  projections with the embed axis minor (what the weight sync now writes);
- `auto`: `Layout.AUTO`, every weight's layout left to the compiler (what
  `decode` was read from).

and prints XLA's cost analysis (FLOPs, bytes accessed) and the count of the
program's copy-start / copy-done into memory space S(1) (VMEM prefetches
that memory-space assignment inserts; XLA's cost model counts each as its
operand + its output, a 16.8 MB weight prefetch as ~100 MB, although it
reads 16.8 MB of HBM once).

Run with libtpu (.venv-tpu), from the repository root, once per layout and
once more with memory-space assignment's prefetching off
(LIBTPU_INIT_ARGS=--xla_tpu_msa_inefficient_use_to_copy_ratio=1000: a
different program, whose cost analysis then counts the weights as read by
their consumers):

  .venv-tpu/bin/python docs/results/archive/plan_decode_layouts_2026-12-04/layouts.py default
"""
import re
import sys

sys.path.insert(0, '.')
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax.experimental.layout import Format  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax.experimental.layout import Layout  # pylint: disable=g-import-not-at-top,wrong-import-position

from configs import plan as plan_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import aot  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax.aot import _plan  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(layout: str):
  c = plan_config.get_config('qwen3_30b_a3b')
  cfg = aot.model_config(c).replace(scan_layers=False)
  spec = dict(c.meshes['v5p-64'].to_dict())
  devs, platform = _plan.devices(32, spec.pop('topology'))
  ctx = sharding.ShardingCtx(sharding.make_mesh(spec, devs))
  shapes = dict(_plan.mesh_shapes(c.shapes.to_dict(), 32),
                sampler_dtype='bfloat16', sampler_layout='inference',
                sampler_weight_layout='default' if layout == 'auto' else layout)
  fn, (graph, state, cache, tokens), _, _ = _plan._abstract_step(  # pylint: disable=protected-access
      'decode', cfg, ctx, None, shapes)
  shard = lambda t: jax.tree.map(lambda a: a.sharding, t)
  if layout == 'auto':
    formats = jax.tree.map(lambda a: Format(Layout.AUTO, a.sharding), state)
  else:   # as _abstract_step made them (`decode`: rl.weight_formats)
    formats = jax.tree.map(lambda a: a.format if hasattr(a, 'format') and
                           a.format is not None else a.sharding, state)
  step = jax.jit(lambda s, k, t: fn.__wrapped__(graph, s, k, t),
                 in_shardings=(formats, shard(cache), shard(tokens)),
                 donate_argnums=(1,))
  with jax.default_device(devs[0]):
    compiled = step.lower(state, cache, tokens).compile()
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  text = compiled.as_text()
  prefetches = len(re.findall(r'S\(1\)[^\n]*\bcopy-start\(', text))
  chosen = {}
  for path, f in jax.tree_util.tree_flatten_with_path(
      compiled.input_formats[0][0])[0]:
    name = jax.tree_util.keystr(path).split("['")[-1].split("']")[0]
    if f.layout.major_to_minor != tuple(range(len(f.layout.major_to_minor))):
      chosen[name] = f.layout.major_to_minor
  print(f'{platform}, decode at depth (48 layers), weights {layout}: '
        f'{ca["bytes accessed"] / 1e9:.2f} GB accessed, '
        f'{ca["flops"] / 1e9:.1f} GFLOP; {prefetches} prefetches into S(1); '
        f'non-default weight layouts {chosen}')


if __name__ == '__main__':
  main(sys.argv[1])
