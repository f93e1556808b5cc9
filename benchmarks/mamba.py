"""A Mamba-2 layer against an attention layer of the same width: fwd+bwd and one decode step, by sequence length.

  python -m benchmarks.mamba
  python -m benchmarks.mamba --seq_lens=512,2048 --width=512 --repeats=2

One mixer each (Nemotron-H's shapes scaled to `width`): attention with
width / 128 query heads of 128 and 2 KV heads, no RoPE; Mamba-2 with
2 x width / 64 heads of 64, state 128, 8 groups, conv 4, chunk 128. Batch 1,
fp32, jitted, the median of `repeats` runs after a warm-up. The decode step
is one token against a cache of the sequence's length (attention reads all
of it; Mamba's state does not grow). Then the chunked SSD alone: its useful
FLOPs (the chunked algorithm's einsums) per second against this machine's
fp32 matmul rate, measured in the same run.
"""

import statistics
import time

import jax
import jax.numpy as jnp
from absl import app
from absl import flags
from flax import nnx

from cascade_jax import model
from cascade_jax import ops
from cascade_jax import utils

_SEQ = flags.DEFINE_list('seq_lens', ['512', '1024', '2048', '4096', '8192'],
                         'Sequence lengths.')
_WIDTH = flags.DEFINE_integer('width', 1024, 'Model width D.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed runs per figure.')


def _time(fn, *args) -> float:
  jax.block_until_ready(fn(*args))           # compile + warm-up
  ts = []
  for _ in range(_REPEATS.value):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    ts.append(time.perf_counter() - t0)
  return statistics.median(ts)


def _cfg(d: int) -> model.ModelConfig:
  return model.ModelConfig(
      vocab_size=256, embed_dim=d, pattern='M*', num_heads=max(1, d // 128),
      num_kv_heads=2, head_dim=128, use_rope=False, norm_eps=1e-5,
      mamba=model.MambaConfig(num_heads=2 * d // 64, head_dim=64,
                              state_dim=128, num_groups=8, conv_kernel=4,
                              chunk_size=128))


def _fwd_bwd(layer, call):
  graph, params = nnx.split(layer)

  @jax.jit
  def f(params, x):
    def loss(params, x):
      return jnp.sum(call(nnx.merge(graph, params), x) ** 2)
    return jax.grad(loss, argnums=(0, 1))(params, x)
  return lambda x: f(params, x)


def _decode(layer, kind, cfg, t):
  """One token against a length-t cache (attention) or a state (Mamba)."""
  graph, params = nnx.split(layer)
  x = jnp.ones((1, 1, cfg.embed_dim), jnp.float32)
  if kind == 'mamba':
    state = model.mamba_init_state(cfg, 1, jnp.float32)

    @jax.jit
    def f(params, x, state):
      return nnx.merge(graph, params)(x, reset_bt=jnp.zeros((1, 1), bool),
                                      state=state)
    return lambda: f(params, x, state)
  k, h = cfg.num_kv_heads, cfg.head_dim
  kc = jnp.zeros((1, k, h, t + 1), jnp.float32)
  vc = jnp.zeros((1, k, t + 1, h), jnp.float32)
  pos_s = jnp.arange(t + 1, dtype=jnp.int32)[None]
  seg_s = jnp.ones((1, t + 1), jnp.int32)

  @jax.jit
  def g(params, x, kc, vc):
    return nnx.merge(graph, params)(
        x, positions_bt=jnp.full((1, 1), t, jnp.int32),
        segment_ids_bt=jnp.ones((1, 1), jnp.int32), kv_cache=(kc, vc),
        cache_index=jnp.asarray(t, jnp.int32), cache_positions_bs=pos_s,
        cache_segment_ids_bs=seg_s)
  return lambda: g(params, x, kc, vc)


def ssd_flops(t: int, h: int, p: int, n: int, q: int) -> float:
  """The chunked SSD's einsum FLOPs at batch 1 (`ops.ssd`, heads expanded)."""
  c = -(-t // q)
  intra = 2 * c * q * q * h * (n + p)          # C.B, then (C.B * L) x
  states = 2 * 2 * c * q * h * p * n           # chunk states, read-out
  inter = 2 * (c + 1) ** 2 * h * p * n         # the chunk recurrence
  return float(intra + states + inter)


def main(argv):
  del argv
  utils.quiet_logs()
  d = _WIDTH.value
  cfg = _cfg(d)
  m = cfg.mamba
  mamba = model.Mamba2(cfg, rngs=nnx.Rngs(0))
  attn = model.Attention(cfg, rngs=nnx.Rngs(1))
  print(f'width {d}; attention {cfg.num_heads} x {cfg.head_dim} '
        f'(kv {cfg.num_kv_heads}); Mamba-2 {m.num_heads} x {m.head_dim}, '
        f'state {m.state_dim}, groups {m.num_groups}, chunk {m.chunk_size}; '
        f'{jax.devices()[0].device_kind}, fp32, batch 1', flush=True)

  n = 4096
  a = jnp.ones((n, n), jnp.float32)
  mm = jax.jit(lambda a: a @ a)
  matmul_gflops = 2 * n ** 3 / _time(mm, a) / 1e9

  header = ['seq', 'attn fwd+bwd ms', 'mamba fwd+bwd ms', 'mamba / attn',
            'attn decode us', 'mamba decode us', 'SSD fwd ms',
            'SSD GFLOP/s', 'of matmul']
  rows = []
  f_m = _fwd_bwd(mamba, lambda mod, x: mod(
      x, reset_bt=jnp.zeros(x.shape[:2], bool))[0])

  def attn_call(mod, x):
    t = x.shape[1]
    pos = jnp.arange(t, dtype=jnp.int32)[None]
    seg = jnp.ones((1, t), jnp.int32)
    return mod(x, positions_bt=pos, segment_ids_bt=seg)[0]
  f_a = _fwd_bwd(attn, attn_call)
  ssd = jax.jit(lambda *a: ops.ssd(*a, chunk=m.chunk_size)[0])
  for t in map(int, _SEQ.value):
    x = jax.random.normal(jax.random.key(0), (1, t, d)) * 0.5
    ta, tm = _time(f_a, x), _time(f_m, x)
    da = _time(_decode(attn, 'attention', cfg, t))
    dm = _time(_decode(mamba, 'mamba', cfg, t))
    k = jax.random.split(jax.random.key(1), 4)
    h, p, g, s = m.num_heads, m.head_dim, m.num_groups, m.state_dim
    args = (jax.random.normal(k[0], (1, t, h, p)),
            jax.nn.softplus(jax.random.normal(k[1], (1, t, h))) * 0.1,
            -jnp.arange(1, h + 1, dtype=jnp.float32),
            jax.random.normal(k[2], (1, t, g, s)),
            jax.random.normal(k[3], (1, t, g, s)), jnp.ones((h,)))
    ts = _time(ssd, *args)
    gf = ssd_flops(t, h, p, s, m.chunk_size) / ts / 1e9
    rows.append([t, 1e3 * ta, 1e3 * tm, tm / ta, 1e6 * da, 1e6 * dm,
                 1e3 * ts, gf, f'{gf / matmul_gflops:.0%}'])
    print(utils.format_table(header, rows[-1:]), flush=True)
  print(f'\nfp32 matmul {n}x{n}: {matmul_gflops:.1f} GFLOP/s')
  print(utils.format_table(header, rows))


if __name__ == '__main__':
  app.run(main)
