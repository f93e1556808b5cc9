import jax, jax.numpy as jnp
from jax.experimental import topologies
from jax.sharding import NamedSharding, PartitionSpec as P, Mesh
import numpy as np
from cascade_jax import ops
topo = topologies.get_topology_desc(platform='tpu', topology_name='v5p:2x2x1')
dev = list(topo.devices)[0]
mesh = Mesh(np.array([dev]), ('x',))
sh = NamedSharding(mesh, P())
def f(x, w, g):
  return ops.grouped_matmul(x, w, g)
args = (jax.ShapeDtypeStruct((128, 2048), jnp.bfloat16, sharding=sh),
        jax.ShapeDtypeStruct((4, 2048, 768), jnp.bfloat16, sharding=sh),
        jax.ShapeDtypeStruct((4,), jnp.int32, sharding=sh))
with jax.default_device(dev):
  c = jax.jit(f).lower(*args).compile()
ca = c.cost_analysis(); ca = ca[0] if isinstance(ca, list) else ca
print(f'TPU v5p grouped_matmul {ops.selected().get("grouped_matmul")}: weights {4*2048*768*2/1e6:.1f} MB, rows {128*2048*2/1e6:.2f} MB, bytes accessed {ca["bytes accessed"]/1e6:.1f} MB')
