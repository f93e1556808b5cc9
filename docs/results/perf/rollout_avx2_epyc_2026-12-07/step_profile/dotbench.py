"""The decode step's dot shapes alone: XLA (8 chained dots in one jit, per dot) against numpy, GFLOP/s."""
import time, numpy as np, jax, jax.numpy as jnp
def bench(f, *a, n=200):
  f(*a).block_until_ready()
  ts=[]
  for _ in range(5):
    t0=time.perf_counter()
    for _ in range(n): r=f(*a)
    r.block_until_ready(); ts.append((time.perf_counter()-t0)/n)
  return min(ts)*1e6
for (m,k,nn) in [(64,256,256),(64,256,128),(64,256,1024),(64,256,640),(16,256,256)]:
  x=jnp.ones((m,k),jnp.float32); w=jnp.ones((k,nn),jnp.float32)
  f=jax.jit(lambda x,w: x@w)
  # chain of 8 dots inside one jit, to remove dispatch
  def g(x,w):
    for _ in range(8): y = x@w; x = jnp.tile(y, (1, max(1, k // y.shape[1])))[:, :k] * 0.5
    return x
  g=jax.jit(g)
  us=bench(g,x,w)/8
  xn=np.ones((m,k),np.float32); wn=np.ones((k,nn),np.float32)
  t0=time.perf_counter()
  for _ in range(2000): xn@wn
  un=(time.perf_counter()-t0)/2000*1e6
  fl=2*m*k*nn
  print(f'{m}x{k}x{nn}: xla {us:.1f} us ({fl/us/1e3:.0f} GFLOP/s)  numpy {un:.1f} us ({fl/un/1e3:.0f})')
