# The diagnostic run on the H200 after run 2 (its NaN gradients), from the
# repository root at 6709687 with the wheels of scripts/gpu_bench.sh on
# PYTHONPATH: `JAX_PLATFORMS=cuda python3 diag_gpu.py`. Which op makes the
# NaN: the test's qwen3-flagged model at length 383, with and without a
# padding row, each kernel swapped for XLA in turn. The second call ran the
# same file cut to `padrow True` / `fast` after ops/_matmul.py passed
# zero_initialize=True to tokamax (the change d024869 commits).
import sys; sys.path.insert(0, 'tests')
import numpy as np, jax, jax.numpy as jnp
from flax import nnx
import test_ops
from cascade_jax import ops, model
cfg = test_ops._gpu_preset('qwen3')
m = model.Transformer(cfg, rngs=nnx.Rngs(0))
b, t = 4, 383
rng = np.random.RandomState(0)
toks = jnp.asarray(rng.randint(1, cfg.vocab_size, (b, t + 1)), jnp.int32)
for padrow in (True, False):
  seg = np.ones((b, t + 1), np.int32); seg[:, 200:] = 2
  if padrow: seg[1, 350:] = 0
  pos = np.zeros_like(seg)
  for r in range(b):
    for s_id in set(seg[r]) - {0}:
      idx = np.where(seg[r] == s_id)[0]; pos[r, idx] = np.arange(len(idx))
  seg, pos = jnp.asarray(seg), jnp.asarray(pos)
  real = (seg[:, 1:] != 0) & (seg[:, 1:] == seg[:, :-1])
  def loss(m):
    logits, info = m(toks[:, :-1], positions_bt=pos[:, :-1], segment_ids_bt=seg[:, :-1])
    lp = ops.token_logprobs(logits, toks[:, 1:])
    return -jnp.sum(jnp.where(real, lp, 0)) / jnp.sum(real)
  for name, kw in (('fast', {}), ('xla_attn', dict(attention='xla')), ('xla_gmm', dict(grouped_matmul='xla'))):
    with ops.forced(**kw):
      l, g = nnx.jit(nnx.value_and_grad(loss))(m)
    bad = [jax.tree_util.keystr(p) for p, x in jax.tree_util.tree_leaves_with_path(nnx.state(g, nnx.Param)) if not np.isfinite(np.asarray(x, np.float32)).all()]
    print('padrow', padrow, name, float(l), 'nan leaves', len(bad), bad[:4], flush=True)
