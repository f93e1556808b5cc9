"""Compiles the ops' TPU kernels ahead of time on a CPU host: splash attention and tokamax's grouped matmul.

  bash scripts/tpu_aot_ops.sh          # makes .venv-tpu (jax[tpu], ~700 MB), then runs this

No TPU runs anything here: for each op, `ops` picks its TPU implementation
for an abstract TPU device of `--topology`, and XLA + Mosaic compile it
for that chip (inside `shard_map`, as the model calls them). What it shows:
the kernels' code paths trace, lower and compile for TPU with our shapes
and masks; not their speed or their numbers.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from cascade_jax import ops


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--topology', default='v5e:2x2')
  args = parser.parse_args()
  topo = topologies.get_topology_desc(platform='tpu',
                                      topology_name=args.topology)
  devs = np.array(topo.devices)
  mesh = Mesh(devs.reshape(-1), ('data',))
  n = devs.size
  b, t, heads, kv, h = 2 * n, 512, 8, 2, 128
  sds = jax.ShapeDtypeStruct
  bf16 = jnp.bfloat16

  def attn(q, k, v, seg, pos):
    return ops.attention(q, k, v, scale=h ** -0.5, segment_ids=(seg, seg),
                         positions=(pos, pos))

  def gmm(x, w, sizes):
    return ops.grouped_matmul(x, w, sizes[0])

  cases = {
      'attention': (attn, (sds((b, t, heads, h), bf16), sds((b, t, kv, h), bf16),
                           sds((b, t, kv, h), bf16), sds((b, t), jnp.int32),
                           sds((b, t), jnp.int32))),
      'grouped_matmul': (gmm, (sds((n * 4096, 2048), bf16),
                               sds((n * 16, 2048, 768), bf16),
                               sds((n, 16), jnp.int32))),
  }
  def fwd_bwd(fn):
    """The op and its gradient with respect to its first two inputs."""
    def loss(*a):
      return jnp.sum(fn(*a).astype(jnp.float32) ** 2)
    return lambda *a: jax.grad(loss, argnums=(0, 1))(*a)

  with jax.default_device(devs.flat[0]):
    for name, (fn, shapes) in cases.items():
      for kind, g in (('forward', fn), ('forward + backward', fwd_bwd(fn))):
        ops.reset_selected()
        out_specs = P('data') if kind == 'forward' else (P('data'), P('data'))
        f = jax.jit(jax.shard_map(g, mesh=mesh, in_specs=P('data'),
                                  out_specs=out_specs, check_vma=False))
        t0 = time.perf_counter()
        compiled = f.lower(*shapes).compile()
        mem = compiled.memory_analysis()
        print(f'{name} {kind}: compiled for {args.topology} in '
              f'{time.perf_counter() - t0:.1f}s; picked '
              f'{ops.selected()[name]}; temp '
              f'{getattr(mem, "temp_size_in_bytes", 0) / 2**20:.1f} MiB per '
              'device', flush=True)


if __name__ == '__main__':
  main()
