"""One of two processes collecting an RL batch whose verdicts differ between hosts.

  python tests/_collect_worker.py OUT.npz PROC NPROC PORT

The reward function answers differently on each process (as a sandbox
verdict near its time limit can): `rl.collect` must still give every
process the same rewards, and so the same filtering and the same batch.
"""

from _worker_start import out_path  # pylint: disable=g-bad-import-order
from _worker_start import proc

import jax  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
from flax import nnx  # pylint: disable=g-import-not-at-top

from cascade_jax import data  # pylint: disable=g-import-not-at-top
from cascade_jax import envs  # pylint: disable=g-import-not-at-top
from cascade_jax import model  # pylint: disable=g-import-not-at-top
from cascade_jax import rl  # pylint: disable=g-import-not-at-top
from cascade_jax import rollout  # pylint: disable=g-import-not-at-top
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
  # Multi-turn episodes: the environment's verdict differs per process too
  # (each episode a one-turn math record here). On process 0 every reward is
  # 0, so every group is filtered; on process 1 every reply gets a reward of
  # its own (1, 2, ...), so none is: on its own each process would build a
  # batch of another size.
  calls = []

  def step(self, assistant):
    del self, assistant
    calls.append(1)
    return envs.Step(reward=float(jax.process_index() * len(calls)),
                     done=True, info={})

  envs.SingleTurn.step = step
  # A model that ends its replies at once (every embedding's first unit
  # large, the head reading it as <|im_end|>): the environment steps only
  # replies that stopped.
  m2 = model.Transformer(model.tiny(vocab_size=tok.vocab_size), ctx=ctx,
                         rngs=nnx.Rngs(0))
  m2.embed_vd[...] = m2.embed_vd[...].at[:, 0].set(30.0)
  m2.head_dv[...] = m2.head_dv[...].at[0, :].set(0.0).at[0, tok.im_end].set(
      3.0)
  sharding.shard_model(m2, ctx)
  math_recs = [dict(id=str(i), domain='math', answer='7',
                    messages=[{'role': 'user', 'content': 'write letters'}])
               for i in range(8)]
  ep_batch, ep_stats = rl.collect(
      m2, tok, rl.PromptStream(math_recs), c, jax.random.key(0),
      episodes=rollout.EpisodeConfig(max_turns=1, max_new_tokens=4,
                                     max_tokens=64))
  np.savez(out_path, rewards=batch.rewards, mask=batch.mask,
           inputs=batch.inputs, scored=np.asarray(n_scored),
           filtered=stats['filtered_groups'], rm_rewards=rm_batch.rewards,
           ep_rewards=ep_batch.rewards, ep_inputs=ep_batch.inputs,
           ep_filtered=ep_stats['filtered_groups'])
  print(f'process {proc}: rewards {batch.rewards.tolist()}')


if __name__ == '__main__':
  main()
