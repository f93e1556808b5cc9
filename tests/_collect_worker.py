"""One of two processes collecting an RL batch whose verdicts differ between hosts.

  python tests/_collect_worker.py OUT.npz PROC NPROC PORT

The reward function answers differently on each process (as a sandbox
verdict near its time limit can): `rl.collect` must still give every
process the same rewards, and so the same filtering and the same batch.
"""

import os
import sys

out_path = sys.argv[1]
proc, nproc, port = map(int, sys.argv[2:5])
os.environ['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={8 // nproc}'
os.environ['JAX_PLATFORMS'] = 'cpu'

import jax  # pylint: disable=g-import-not-at-top

jax.config.update('jax_cpu_collectives_implementation', 'gloo')
jax.distributed.initialize(f'127.0.0.1:{port}', num_processes=nproc,
                           process_id=proc)

import numpy as np  # pylint: disable=g-import-not-at-top
from flax import nnx  # pylint: disable=g-import-not-at-top

from cascade_jax import data  # pylint: disable=g-import-not-at-top
from cascade_jax import model  # pylint: disable=g-import-not-at-top
from cascade_jax import rl  # pylint: disable=g-import-not-at-top
from cascade_jax import sharding  # pylint: disable=g-import-not-at-top


def main():
  tok = data.train_tokenizer(['aaa bbb ccc', 'abc cab bca', 'write letters',
                              'a b c d e'] * 20, 160)
  ctx = sharding.ShardingCtx(sharding.make_mesh(dict(data=8)))
  m = model.Transformer(model.tiny(vocab_size=tok.vocab_size), ctx=ctx,
                        rngs=nnx.Rngs(0))
  sharding.shard_model(m, ctx)
  recs = [dict(id=str(i), domain='toy',
               messages=[{'role': 'user', 'content': 'write letters'}])
          for i in range(8)]
  scored = []

  def reward(records, responses):
    # This process's verdicts: its index, plus 1 on every other row (so no
    # group of 2 has equal rewards, and none is filtered).
    scored.append(len(records))
    return jax.process_index() + np.arange(len(records)) % 2.0

  c = rl.RLConfig(prompts_per_step=4, rollouts_per_prompt=2, max_new_tokens=4,
                  overlong='none')
  batch, stats = rl.collect(m, tok, rl.PromptStream(recs), c,
                            jax.random.key(0), reward_fn=reward)
  n_scored = list(scored)
  # A reward model's scores (a computation every process runs on the mesh):
  # process 0's are everyone's.
  rm_batch, _ = rl.collect(m, tok, rl.PromptStream(recs), c,
                           jax.random.key(0), reward_fn=reward,
                           host_rewards=False)
  np.savez(out_path, rewards=batch.rewards, mask=batch.mask,
           inputs=batch.inputs, scored=np.asarray(n_scored),
           filtered=stats['filtered_groups'], rm_rewards=rm_batch.rewards)
  print(f'process {proc}: rewards {batch.rewards.tolist()}')


if __name__ == '__main__':
  main()
