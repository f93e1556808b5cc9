# Two processes x 4 CPU devices: (1) a mirrored copy: a sharded array on a
# mesh over each process's local devices 0-1 moved shard by shard, on its
# own process, onto a mesh over 2-3 and assembled; (2) two threads of each
# process running all-reduces on the two disjoint meshes at once (after one
# warm-up each), in different rhythms per process.
import os, sys, threading, time
pid = int(sys.argv[1])
os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=4'
import jax, numpy as np
jax.config.update('jax_cpu_collectives_implementation', 'gloo')
jax.distributed.initialize('127.0.0.1:12357', num_processes=2, process_id=pid)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
devs = jax.devices()
def local(lo, hi):
  out = []
  for p in range(2):
    mine = [d for d in devs if d.process_index == p]
    out += mine[lo:hi]
  return out
A = Mesh(np.array(local(0, 2)).reshape(2, 2), ('data', 'fsdp'))
B = Mesh(np.array(local(2, 4)).reshape(2, 2), ('data', 'fsdp'))
x = jax.jit(lambda: jax.numpy.arange(64.).reshape(8, 8), out_shardings=NamedSharding(A, P('fsdp', 'data')))()
mirror = dict(zip(A.devices.flat, B.devices.flat))
t0 = time.time()
shards = [jax.device_put(s.data, mirror[s.device]) for s in x.addressable_shards]
y = jax.make_array_from_single_device_arrays(x.shape, NamedSharding(B, P('fsdp', 'data')), shards)
# reshard to another layout on B
y2 = jax.jit(lambda v: v * 1, out_shardings=NamedSharding(B, P(None, ('data', 'fsdp'))))(y)
s = jax.jit(lambda v: v.sum(), out_shardings=NamedSharding(B, P()))(y2)
print(pid, 'mirrored ok', float(s), 'expected', float(np.arange(64.).sum()), time.time() - t0, flush=True)

# mesh of different shape on same B devices? learner 2x2 -> transit on A as (k=1, 2,2)
def loop(mesh, n, tag, delay):
  f = jax.jit(lambda v: jax.numpy.sum(v), out_shardings=NamedSharding(mesh, P()))
  v = jax.jit(lambda: jax.numpy.ones((8, 8)), out_shardings=NamedSharding(mesh, P('data', 'fsdp')))()
  tot = 0.
  for i in range(n):
    time.sleep(delay)
    tot += float(f(v * i))
  print(pid, tag, 'done', tot, flush=True)
loop(A, 2, 'warmA', 0); loop(B, 2, 'warmB', 0)
d1, d2 = (0.0, 0.003) if pid == 0 else (0.003, 0.0)
ts = [threading.Thread(target=loop, args=(A, 200, 'A', d1)), threading.Thread(target=loop, args=(B, 200, 'B', d2))]
t0 = time.time()
[t.start() for t in ts]
for t in ts: t.join(timeout=120)
print(pid, 'threads alive', [t.is_alive() for t in ts], time.time() - t0, flush=True)
os._exit(0)
