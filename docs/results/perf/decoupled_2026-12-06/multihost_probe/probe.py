# Two processes x 4 CPU devices: does device_put move a sharded array
# from a mesh over each process's devices 0-1 to a mesh over 2-3?
import os, sys
pid = int(sys.argv[1])
os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=4'
import jax, numpy as np
jax.config.update('jax_cpu_collectives_implementation', 'gloo')
jax.distributed.initialize('127.0.0.1:12355', num_processes=2, process_id=pid)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
devs = jax.devices()
print(pid, [ (d.id, d.process_index) for d in devs], flush=True)
def local(lo, hi):
  return [d for d in devs if lo <= [x for x in devs if x.process_index == d.process_index].index(d) < hi]
A = Mesh(np.array(local(0, 2)), ('data',))
B = Mesh(np.array(local(2, 4)), ('data',))
print(pid, 'A', [d.id for d in A.devices.flat], 'B', [d.id for d in B.devices.flat], flush=True)
x = jax.jit(lambda: jax.numpy.arange(16.).reshape(4, 4), out_shardings=NamedSharding(A, P('data')))()
try:
  y = jax.device_put(x, NamedSharding(B, P('data')))
  y = jax.jit(lambda y: y * 2)(y)
  print(pid, 'device_put across meshes ok', float(jax.jit(lambda y: y.sum(), out_shardings=NamedSharding(B, P()))(y)), flush=True)
except Exception as e:
  print(pid, 'device_put FAILED', type(e).__name__, str(e)[:400], flush=True)
