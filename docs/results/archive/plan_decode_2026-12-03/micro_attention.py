import jax, jax.numpy as jnp, functools
from jax.experimental import topologies
from jax.sharding import NamedSharding, PartitionSpec as P, Mesh
import numpy as np
topo = topologies.get_topology_desc(platform='tpu', topology_name='v5p:2x2x1')
mesh = Mesh(np.array(list(topo.devices)[:1]), ('x',))
sh = NamedSharding(mesh, P())
S = 10240
@functools.partial(jax.jit, donate_argnums=(0, 1))
def f(ck, cv, k, v, q, i):
  ck = jax.lax.dynamic_update_slice_in_dim(ck, k.transpose(0, 2, 3, 1), i, axis=3)
  cv = jax.lax.dynamic_update_slice_in_dim(cv, v.transpose(0, 2, 1, 3), i, axis=2)
  lg = jnp.einsum('bkqh,bkhs->bkqs', q, ck, preferred_element_type=jnp.float32)
  p = jax.nn.softmax(lg, -1).astype(q.dtype)
  return ck, cv, jnp.einsum('bkqs,bksh->bkqh', p, cv)
sds = lambda s: jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=sh)
args = (sds((8, 4, 128, S)), sds((8, 4, S, 128)), sds((8, 1, 4, 128)), sds((8, 1, 4, 128)), sds((8, 4, 8, 128)), jax.ShapeDtypeStruct((), jnp.int32, sharding=sh))
ca = f.lower(*args).compile().cost_analysis()
ca = ca[0] if isinstance(ca, list) else ca
print(f'TPU v5p: one layer cache K+V {2*8*4*128*S*2/1e6:.1f} MB, write + attend bytes accessed {ca["bytes accessed"]/1e6:.1f} MB')
