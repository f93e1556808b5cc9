"""The RL learner: rollouts line up with the learner, filtering, and GRPO learns a toy reward."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cascade_jax import data
from cascade_jax import losses
from cascade_jax import model
from cascade_jax import rl
from cascade_jax import rollout
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
  opt, graph, state = _init(cfg, lr=1e-2)
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


def test_trimming_the_empty_tail_changes_nothing(setup):
  tok, cfg, recs = setup
  opt, graph, state = _init(cfg)
  c = rl.RLConfig(prompts_per_step=2, rollouts_per_prompt=4,
                  max_new_tokens=40, dynamic_filtering=False, trim_bucket=16)
  batch, rewards, _, _ = rl.collect(
      nnx.merge(graph, state.params, state.rest), tok, rl.PromptStream(recs),
      c, jax.random.key(1), reward_fn=share_of_a)
  batch['advantages'] = np.asarray(losses.group_advantages(
      jnp.asarray(rewards), c.rollouts_per_prompt))
  # The same batch with 32 more empty columns, as collect built it before.
  wide = {k: np.pad(v, [(0, 0), (0, 0), (0, 32), (0, 0)])
          if k == 'expert_idx' else
          (v if v.ndim == 1 else np.pad(v, [(0, 0), (0, 32)]))
          for k, v in batch.items()}
  assert rl.trim_right(wide)['mask'].shape == batch['mask'].shape
  ms = [rl.update(jax.tree.map(jnp.copy, state), jax.tree.map(jnp.asarray, b),
                  graph=graph, opt=opt, cfg=c)[1] for b in (batch, wide)]
  for k in ('loss', 'grad_norm', 'sampler_mismatch', 'token_count'):
    np.testing.assert_allclose(float(ms[0][k]), float(ms[1][k]), rtol=1e-5,
                               atol=1e-6)


def test_trim_right_keeps_whole_buckets():
  mask = np.zeros((2, 40), np.int32)
  mask[1, 3:6] = 1
  b = dict(mask=mask, inputs=np.ones((2, 40)), expert_idx=np.ones((3, 2, 40, 2)))
  out = rl.trim_right(b, bucket=16)
  assert out['mask'].shape == (2, 8) and out['expert_idx'].shape == (3, 2, 8, 2)
  assert out['mask'].sum() == 3
  mask[0, 30] = 1
  assert rl.trim_right(b, bucket=16)['mask'].shape == (2, 40)


def test_learner_scores_the_tempered_policy_the_sampler_drew_from(setup):
  tok, cfg, recs = setup
  opt, graph, state = _init(cfg)
  c = rl.RLConfig(prompts_per_step=2, rollouts_per_prompt=4,
                  max_new_tokens=8, dynamic_filtering=False, temperature=0.7,
                  overlong='none')
  batch, rewards, _, _ = rl.collect(
      nnx.merge(graph, state.params, state.rest), tok, rl.PromptStream(recs),
      c, jax.random.key(0), reward_fn=lambda recs, _: np.arange(len(recs)) % 2)
  batch['advantages'] = np.asarray(losses.group_advantages(
      jnp.asarray(rewards), c.rollouts_per_prompt))
  _, m = rl.update(state, jax.tree.map(jnp.asarray, batch), graph=graph,
                   opt=opt, cfg=c)
  assert float(m['sampler_mismatch']) < 1e-5


def test_more_updates_per_batch_are_off_policy_after_the_first(setup):
  tok, cfg, recs = setup
  opt, graph, state = _init(cfg)
  c = rl.RLConfig(prompts_per_step=4, rollouts_per_prompt=4,
                  max_new_tokens=8, dynamic_filtering=False,
                  updates_per_batch=2, overlong='none')
  batch, rewards, _, _ = rl.collect(
      nnx.merge(graph, state.params, state.rest), tok, rl.PromptStream(recs),
      c, jax.random.key(0),
      reward_fn=lambda recs, _: np.arange(len(recs)) % 3)
  batch['advantages'] = np.asarray(losses.group_advantages(
      jnp.asarray(rewards), c.rollouts_per_prompt))
  state, m = rl.update_minibatches(state, batch, graph=graph, opt=opt, cfg=c)
  assert int(state.step) == 2 and abs(m['ratio_mean'] - 1.0) < 1e-5  # lr 0
  state, m = rl.update_minibatches(state, batch, graph=graph, opt=opt, cfg=c)
  # Minibatch 2 is scored after the update on minibatch 1: off-policy.
  assert abs(m['ratio_mean'] - 1.0) > 1e-4, m
  with pytest.raises(ValueError, match='whole groups'):
    rl.update_minibatches(state, batch, graph=graph, opt=opt,
                          cfg=dataclasses.replace(c, updates_per_batch=3))


def test_every_step_has_the_stream_width_and_compiles_once(setup):
  tok, cfg, _ = setup
  _, graph, state = _init(cfg)
  # Prompts of 28 to 78 tokens: a batch's longest rounded up to the sampler's
  # bucket (32) would give some steps 64 or 96 columns, others 78.
  recs = [dict(id=str(i), domain='toy', messages=[
      {'role': 'user', 'content': ' '.join(['a b c d e'] * (1 + i))}])
          for i in range(6)]
  stream = rl.PromptStream(recs)
  width = stream.prompt_width(tok)
  assert width % 32, width          # the case that used to recompile
  c = rl.RLConfig(prompts_per_step=2, rollouts_per_prompt=2, max_new_tokens=4,
                  dynamic_filtering=False)
  policy = nnx.merge(graph, state.params, state.rest)
  widths, traces = set(), []
  for step in range(3):
    batch, _, _, _ = rl.collect(policy, tok, stream, c, jax.random.key(step),
                                reward_fn=share_of_a)
    widths.add(batch['inputs'].shape[1])
    traces.append(rollout.trace_count())
  assert widths == {width + c.max_new_tokens - 1}
  assert traces[-1] == traces[0], traces   # no sampler compile after the first


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


# ------------------------------------------------------- the stage runner

import os  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
import sys  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import rl as rl_config  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from configs import sft as sft_config  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

from cascade_jax import sft  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(scope='module')
def sft_dir(tmp_path_factory):
  d = str(tmp_path_factory.mktemp('sft'))
  c = sft_config.get_config('quick')
  c.steps, c.eval_n = 6, 0
  # Dropless experts: sampler, learner and teacher then compute the same
  # log-probs (capacity drops depend on how many tokens a call sees).
  c.model.overrides.moe = dict(c.model.overrides.moe.to_dict(),
                               dispatch='dense')
  sft.run(c, d)
  return d


def test_grpo_stage_runs_checkpoints_and_resumes(sft_dir, tmp_path):
  c = rl_config.get_config('quick')
  c.init_from = sft_dir
  scores = rl.run(c, str(tmp_path))
  assert set(scores) == {'math'}
  rows = [json.loads(l) for l in open(tmp_path / 'rl_metrics.jsonl')]
  steps = [r for r in rows if 'reward_mean' in r]
  assert [r['step'] for r in steps] == [1, 2, 3, 4]
  c.steps = 6                       # continue the same run: resumes at 4
  rl.run(c, str(tmp_path))
  rows = [json.loads(l) for l in open(tmp_path / 'rl_metrics.jsonl')]
  assert [r['step'] for r in rows if 'reward_mean' in r][-2:] == [5, 6]


def test_mopd_stage_uses_teachers_and_names_a_missing_one(sft_dir, tmp_path):
  c = rl_config.get_config('quick')
  c.init_from = sft_dir
  c.rl.algorithm, c.rl.dynamic_filtering = 'mopd', False
  c.teachers.math = sft_dir
  c.steps = 2
  rl.run(c, str(tmp_path / 'ok'))
  rows = [json.loads(l) for l in open(tmp_path / 'ok' / 'rl_metrics.jsonl')]
  # Teacher = the student's own start: reverse KL ~ 0 on the first step.
  first = [r for r in rows if 'reverse_kl' in r][0]
  assert abs(first['reverse_kl']) < 1e-4
  c.teachers.math = str(tmp_path / 'nowhere')
  with pytest.raises(FileNotFoundError, match="teacher for domain 'math'"):
    rl.run(c, str(tmp_path / 'bad'))


def test_model_spec_follows_init_from(tmp_path):
  from cascade_jax import train as train_lib  # pylint: disable=g-import-not-at-top
  (tmp_path / 'sft').mkdir()
  (tmp_path / 'rl').mkdir()
  (tmp_path / 'sft' / 'config.json').write_text(json.dumps(
      {'model': {'preset': 'tiny', 'overrides': {}}}))
  (tmp_path / 'rl' / 'config.json').write_text(json.dumps(
      {'init_from': str(tmp_path / 'sft')}))
  assert train_lib.model_spec(str(tmp_path / 'rl'))['preset'] == 'tiny'
  (tmp_path / 'sft' / 'config.json').write_text('{}')
  with pytest.raises(ValueError, match='names no model'):
    train_lib.model_spec(str(tmp_path / 'rl'))
