"""Does XLA:TPU's cost analysis charge a conditional for its operands, beside what its branch reads?"""
import jax, jax.numpy as jnp
from jax.experimental import topologies
topo = topologies.get_topology_desc(platform='tpu', topology_name='v5p:2x2x1')
dev = topo.devices[0]
sh = jax.sharding.SingleDeviceSharding(dev)
sds = lambda s, d: jax.ShapeDtypeStruct(s, d, sharding=sh)
W = sds((4, 2048, 768), jnp.bfloat16); X = sds((128, 2048), jnp.bfloat16); P = sds((), jnp.bool_)
def plain(w, x, p):
  return jnp.einsum('nd,edf->enf', x, w)
def cond(w, x, p):
  return jax.lax.cond(p, lambda: jnp.einsum('nd,edf->enf', x, w), lambda: 2 * jnp.einsum('nd,edf->enf', x, w))
def cond_trivial(w, x, p):
  return jax.lax.cond(p, lambda: jnp.einsum('nd,edf->enf', x, w), lambda: jnp.zeros((4, 128, 768), jnp.bfloat16))
with jax.default_device(dev):
  for f in (plain, cond, cond_trivial):
    c = jax.jit(f).lower(W, X, P).compile()
    ca = c.cost_analysis(); ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    print(f.__name__, f'{ca["bytes accessed"]/1e6:.1f} MB', f'W {4*2048*768*2/1e6:.1f} MB, X {128*2048*2/1e6:.2f} MB, out {4*128*768*2/1e6:.2f} MB')
