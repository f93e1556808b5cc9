"""The RL learner: rollouts line up with the learner, filtering, and GRPO learns a toy reward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cascade_jax import data
from cascade_jax import losses
from cascade_jax import model
from cascade_jax import rl
from cascade_jax import train


@pytest.fixture(scope='module')
def setup():
  tok = data.train_tokenizer(['aaa bbb ccc', 'abc cab bca', 'write letters',
                              'a b c d e'] * 20, 160)
  cfg = model.tiny(vocab_size=tok.vocab_size, pattern='*E*E')
  recs = [dict(id=str(i), domain='toy',
               messages=[{'role': 'user', 'content': 'write letters'}])
          for i in range(8)]
  return tok, cfg, recs


def share_of_a(records, responses):
  return np.asarray([r.count('a') / max(len(r), 1) for r in responses],
                    np.float32)


def _init(cfg, lr=3e-3):
  opt = train.make_optimizer(train.OptimConfig(
      lr=lr, warmup_steps=1, schedule='constant', weight_decay=0.0))
  graph, state = train.init_state(model.Transformer(cfg, rngs=nnx.Rngs(0)),
                                  opt)
  return opt, graph, state


def test_config_errors():
  with pytest.raises(ValueError, match='rl.algorithm'):
    rl.RLConfig(algorithm='ppo')
  with pytest.raises(ValueError, match='rollouts_per_prompt'):
    rl.RLConfig(rollouts_per_prompt=1)


def test_grpo_learns_a_toy_reward_with_matching_logprobs(setup):
  tok, cfg, recs = setup
  opt, graph, state = _init(cfg)
  c = rl.RLConfig(prompts_per_step=4, rollouts_per_prompt=8,
                  max_new_tokens=12)
  stream = rl.PromptStream(recs)
  key = jax.random.key(0)
  means = []
  for _ in range(30):
    key, sub = jax.random.split(key)
    batch, rewards, _, stats = rl.collect(
        nnx.merge(graph, state.params, state.rest), tok, stream, c, sub,
        reward_fn=share_of_a)
    means.append(np.mean(stats['rewards']))
    batch['advantages'] = np.asarray(losses.group_advantages(
        jnp.asarray(rewards), c.rollouts_per_prompt))
    state, m = rl.update(state, jax.tree.map(jnp.asarray, batch), graph=graph,
                         opt=opt, cfg=c)
    # The learner's forward pass (with the rollout's routing replayed) gives
    # the sampler's log-probs: strictly on-policy.
    assert float(m['sampler_mismatch']) < 1e-5
  assert np.mean(means[-5:]) > 2 * np.mean(means[:5]) + 0.05, means


def test_dynamic_filtering_drops_groups_with_equal_rewards(setup):
  tok, cfg, recs = setup
  _, graph, state = _init(cfg)
  c = rl.RLConfig(prompts_per_step=2, rollouts_per_prompt=4, max_new_tokens=6,
                  max_refill_rounds=1, overlong='none')
  batch, _, _, stats = rl.collect(
      nnx.merge(graph, state.params, state.rest), tok, rl.PromptStream(recs),
      c, jax.random.key(0), reward_fn=lambda r, s: np.ones(len(s)))
  assert batch is None
  assert stats['groups'] == stats['filtered_groups'] == 4   # 2 + 2 refilled


def test_overlong_responses_are_penalised(setup):
  tok, cfg, recs = setup
  _, graph, state = _init(cfg)
  c = rl.RLConfig(prompts_per_step=2, rollouts_per_prompt=4, max_new_tokens=2,
                  dynamic_filtering=False)
  batch, rewards, _, stats = rl.collect(
      nnx.merge(graph, state.params, state.rest), tok, rl.PromptStream(recs),
      c, jax.random.key(0), reward_fn=lambda r, s: np.ones(len(s)))
  assert stats['truncated'] > 0
  assert rewards.min() == 0.0      # cut at the limit: reward 0
  assert batch['inputs'].shape[0] == 8
