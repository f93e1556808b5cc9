"""One process of the two-process continuous-batching test (or the reference).

  python tests/_continuous_worker.py OUT.npz                    # one device
  python tests/_continuous_worker.py OUT.npz PROC NPROC PORT    # one of N

Each of the N processes has 8 / N CPU devices; together they hold the RL
sampler's copy (the inference layout) on one fsdp 2 x expert 4 mesh and
sample 21 prompts through 6 rows (rounded up to 8), refilled a row at a
time, then play 8 episodes through 6 rows; the reference samples them on
one device with the same keys (`generate`, and the fixed episode batch).
"""

from _worker_start import distributed  # pylint: disable=g-bad-import-order
from _worker_start import nproc
from _worker_start import out_path
from _worker_start import proc

import jax  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
from flax import nnx  # pylint: disable=g-import-not-at-top

from cascade_jax import model  # pylint: disable=g-import-not-at-top
from cascade_jax import rollout  # pylint: disable=g-import-not-at-top

import _mesh_helpers  # pylint: disable=g-import-not-at-top
import test_episodes  # pylint: disable=g-import-not-at-top


def main():
  rng = np.random.RandomState(0)
  prompts = [rng.randint(4, 48, k).tolist() for k in rng.randint(1, 14, 21)]
  sc = rollout.SampleConfig(max_new_tokens=12, prompt_bucket=8,
                            temperature=1.0)
  keys = jax.random.split(jax.random.key(3), len(prompts))
  m = model.Transformer(_mesh_helpers.tiny_moe(48), rngs=nnx.Rngs(0))
  tok, recs = test_episodes.agent_records()
  # Replies that end after a few tokens.
  policy = test_episodes.stopping_policy(
      tok, cfg=_mesh_helpers.tiny_moe(tok.vocab_size))
  ec, t1 = test_episodes.EC, test_episodes.T1
  ep_keys = jax.random.split(jax.random.key(5), len(recs))
  if distributed:
    assert jax.device_count() == 8 and jax.local_device_count() == 8 // nproc
    mesh = dict(fsdp=2, expert=4)
    sm = _mesh_helpers.inference_layout_sampler(m, mesh)
    ro = rollout.generate_continuous(sm, prompts, cfg=sc, stop_ids=(3, 5, 7),
                                     slots=6, keys=keys, refill=1,
                                     record_experts=True)
    eps = rollout.run_episodes(
        _mesh_helpers.inference_layout_sampler(policy, mesh), tok, recs,
        cfg=ec, sample=t1, keys=ep_keys, record_experts=True, slots=6)
  else:
    ro = rollout.generate(m, prompts, cfg=sc, stop_ids=(3, 5, 7), key=keys,
                          record_experts=True)
    eps = rollout.run_episodes(policy, tok, recs, cfg=ec, sample=t1,
                               keys=ep_keys, record_experts=True)
  from cascade_jax import sharding  # pylint: disable=g-import-not-at-top
  ro = sharding.to_host(ro)
  if not distributed or proc == 0:
    np.savez(out_path, tokens=ro.tokens * ro.mask, mask=ro.mask,
             logprobs=ro.logprobs,
             episodes=np.asarray([t for e in eps for t in e.tokens]),
             turns=np.asarray([e.turns for e in eps]),
             ep_logprobs=np.asarray([x for e in eps for x in e.logprobs]))
  print('process done')


if __name__ == '__main__':
  main()
