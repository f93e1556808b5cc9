"""The 30B decode step with the sampler's layer weights passed one array per layer.

attribute.py finds that, above one layer, XLA copies each layer's weights
out of the stacked [L, ...] arrays before the MoE layer's conditional (its
operands must be buffers of their own). This compiles the plan's decode
step (as attribute.py: v5p-64, bf16 inference layout, strict ops, unrolled)
twice at each depth, with the same memory layouts (`decode`, the weight
sync's, by default; `default` on the command line: row-major):

- `stacked`: the sampler's state as the plan passes it ([L, ...] leaves);
- `unstacked`: every stacked leaf passed as L arrays of its own and
  stacked again inside the program (`jnp.stack`), which XLA may fold into
  the per-layer slices the model takes (slice of a concatenate).

and prints XLA's bytes accessed per chip and the arguments' bytes.

  LIBTPU_INIT_ARGS=--xla_tpu_msa_inefficient_use_to_copy_ratio=1000 \
      .venv-tpu/bin/python docs/results/archive/plan_decode_bytes_2026-12-05/unstacked.py 1 2 [default]
"""
import sys

sys.path.insert(0, '.')
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax.experimental.layout import Format  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax.experimental.layout import Layout  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax.sharding import PartitionSpec  # pylint: disable=g-import-not-at-top,wrong-import-position

from configs import plan as plan_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import aot  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import ops  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax.aot import _plan  # pylint: disable=g-import-not-at-top,wrong-import-position


def _drop_layer_axis(f, sharding):
  """The per-layer part's format of a stacked leaf's `Format` (or sharding)."""
  if not isinstance(f, Format) or f.layout is None:
    return sharding
  order = [d - 1 for d in f.layout.major_to_minor if d != 0]
  return Format(Layout(major_to_minor=tuple(order)), sharding)


def compile_both(layers: int, weight_layout: str):
  c = plan_config.get_config('qwen3_30b_a3b')
  cfg = aot.model_config(c)
  cfg = cfg.replace(scan_layers=False, pattern=cfg.pattern[:2 * layers])
  spec = dict(c.meshes['v5p-64'].to_dict())
  devs, _ = _plan.devices(32, spec.pop('topology'))
  ctx = sharding.ShardingCtx(sharding.make_mesh(spec, devs))
  shapes = dict(_plan.mesh_shapes(c.shapes.to_dict(), 32),
                sampler_dtype='bfloat16', sampler_layout='inference',
                sampler_weight_layout=weight_layout)
  fn, (graph, state, cache, tokens), _, _ = _plan._abstract_step(  # pylint: disable=protected-access
      'decode', cfg, ctx, None, shapes)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
  stacked = [i for i, (p, a) in enumerate(leaves)
             if "'layers'" in jax.tree_util.keystr(p) and a.ndim > 1
             and a.shape[0] == layers]
  shard = lambda t: jax.tree.map(lambda a: a.sharding, t)
  # `decode`: the weights in the layouts the weight sync writes (rl.weight_formats).
  fmt = lambda t: jax.tree.map(
      lambda a: a.format if getattr(a, 'format', None) is not None
      else a.sharding, t)
  out = {}
  with ops.strict_mode(True), jax.default_device(devs[0]):
    step = jax.jit(lambda s, k, t: fn.__wrapped__(graph, s, k, t),
                   in_shardings=(fmt(state), shard(cache), shard(tokens)),
                   donate_argnums=(1,))
    compiled = step.lower(state, cache, tokens).compile()
    out['stacked'] = (compiled.cost_analysis(),
                      _plan.per_device_bytes((state, cache, tokens)))

    flat = [a for _, a in leaves]
    parts, part_fmts = {}, {}
    for i in stacked:
      a = flat[i]
      s = NamedSharding(a.sharding.mesh,
                        PartitionSpec(*tuple(a.sharding.spec)[1:]))
      parts[i] = [jax.ShapeDtypeStruct(a.shape[1:], a.dtype, sharding=s)
                  for _ in range(layers)]
      part_fmts[i] = [_drop_layer_axis(getattr(a, 'format', None), s)
                      for _ in range(layers)]
    rest = {i: a for i, a in enumerate(flat) if i not in parts}

    def unstacked(parts, rest, k, t):
      vals = [jnp.stack(parts[i]) if i in parts else rest[i]
              for i in range(len(flat))]
      return fn.__wrapped__(graph, jax.tree.unflatten(treedef, vals), k, t)

    step = jax.jit(unstacked, in_shardings=(part_fmts, fmt(rest),
                                            shard(cache), shard(tokens)),
                   donate_argnums=(2,))
    compiled = step.lower(parts, rest, cache, tokens).compile()
    out['unstacked'] = (compiled.cost_analysis(),
                        _plan.per_device_bytes((parts, rest, cache, tokens)))
  return out


def main(depths, weight_layout):
  rows = {}
  print(f'sampler weight layout: {weight_layout}')
  for layers in depths:
    for name, (ca, args) in compile_both(layers, weight_layout).items():
      ca = ca[0] if isinstance(ca, (list, tuple)) else ca
      rows[(layers, name)] = (ca['bytes accessed'], args)
      print(f'{layers} layer(s), {name:>9}: XLA bytes accessed '
            f'{ca["bytes accessed"] / 1e9:.3f} GB, arguments {args / 1e9:.3f} '
            f'GB', flush=True)
  lo, hi = depths[0], depths[-1]
  for name in ('stacked', 'unstacked'):
    if lo == hi:
      b, a = rows[(lo, name)]
      print(f'{name:>9}: {b / a:.2f} x the arguments')
      continue
    (b0, a0), (b1, a1) = rows[(lo, name)], rows[(hi, name)]
    slope, arg_slope = (b1 - b0) / (hi - lo), (a1 - a0) / (hi - lo)
    at48 = b0 + (48 - lo) * slope
    args48 = a0 + (48 - lo) * arg_slope
    print(f'{name:>9}: per layer {slope / 1e6:.1f} MB accessed against '
          f'{arg_slope / 1e6:.1f} MB of arguments; at 48 layers '
          f'{at48 / 1e9:.2f} GB against {args48 / 1e9:.2f} GB: '
          f'{at48 / args48:.2f} x')


if __name__ == '__main__':
  args = sys.argv[1:]
  main([int(a) for a in args if a.isdigit()] or [1, 2],
       'default' if 'default' in args else 'decode')
