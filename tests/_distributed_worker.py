"""One process of the two-process test (or the single-process reference).

  python tests/_distributed_worker.py OUT.npz                       # reference
  python tests/_distributed_worker.py OUT.npz PROC NPROC PORT       # one of N

Each of the N processes has 8 / N CPU devices; together they form one
fsdp 2 x expert 2 x tensor 2 mesh and take one AdamW step on the tiny MoE.
"""

from _worker_start import distributed  # pylint: disable=g-bad-import-order
from _worker_start import nproc
from _worker_start import out_path
from _worker_start import proc

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import optax  # pylint: disable=g-import-not-at-top
from flax import nnx  # pylint: disable=g-import-not-at-top
from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

from cascade_jax import model  # pylint: disable=g-import-not-at-top
from cascade_jax import sharding  # pylint: disable=g-import-not-at-top


def main():
  cfg = model.tiny(pattern='*E*-', moe=model.MoEConfig(
      num_experts=4, top_k=2, expert_dim=16, dispatch='capacity',
      capacity_factor=2.0))
  ctx = None
  if distributed:
    assert jax.device_count() == 8 and jax.local_device_count() == 8 // nproc
    ctx = sharding.ShardingCtx(
        sharding.make_mesh(dict(fsdp=2, expert=2, tensor=2)))
  m = model.Transformer(cfg, rngs=nnx.Rngs(0), ctx=ctx)
  if ctx is not None:
    sharding.shard_model(m, ctx)  # each process places its own shards
  toks = np.asarray(jax.random.randint(jax.random.key(1), (8, 6), 0,
                                       cfg.vocab_size))
  if ctx is not None:
    toks = sharding.put(toks, ctx.sharding(('batch', None), toks.shape))
  graph, params, rest = nnx.split(m, nnx.Param, ...)
  opt = optax.adamw(1e-2)
  opt_state = opt.init(params)

  @jax.jit
  def train_step(params, opt_state, toks):
    def loss(params):
      logits, info = nnx.merge(graph, params, rest)(toks)
      nll = -jnp.mean(jnp.take_along_axis(
          jax.nn.log_softmax(logits[:, :-1]), toks[:, 1:, None], -1))
      return nll + info['aux_loss']
    l, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, l

  params, opt_state, loss0 = train_step(params, opt_state, toks)
  _, _, loss1 = train_step(params, opt_state, toks)
  flat = {jax.tree_util.keystr(k): v for k, v in
          jax.tree_util.tree_leaves_with_path(params)}
  if distributed:
    flat = {k: multihost_utils.process_allgather(v, tiled=True)
            for k, v in flat.items()}
    # Scalars are replicated: every process holds the whole value.
    loss0, loss1 = loss0.addressable_data(0), loss1.addressable_data(0)
  if not distributed or proc == 0:
    np.savez(out_path, loss0=np.asarray(loss0), loss1=np.asarray(loss1),
             **{k: np.asarray(v) for k, v in flat.items()})
  print(f'process done: loss {float(np.asarray(loss0).ravel()[0]):.6f} -> '
        f'{float(np.asarray(loss1).ravel()[0]):.6f}')


if __name__ == '__main__':
  main()
