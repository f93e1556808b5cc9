"""Multi-turn rollouts: one KV cache across turns, masks on the model's tokens, learner == sampler."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from cascade_jax import data
from cascade_jax import domains
from cascade_jax import model
from cascade_jax import rl
from cascade_jax import rollout
from cascade_jax import train

import _mesh_helpers  # pylint: disable=g-import-not-at-top


def agent_records():
  """(tokenizer, 8 records): swe_agent and tool_use episodes of 1 to 4
  turns, a tokenizer trained on their texts."""
  recs = (domains.generate('swe_agent', split='train', n=4, seed=0,
                           levels=(2, 3)) +
          domains.generate('tool_use', split='train', n=4, seed=0))
  tok = data.train_tokenizer(
      [m['content'] for r in recs for m in r['messages'] + r['turns']] * 10,
      400)
  return tok, recs


@pytest.fixture(scope='module')
def setup():
  return agent_records()


def stopping_policy(tok, push=0.45, seed=0, cfg=None):
  """The main job's model (`small`: capacity dispatch, sigmoid router,
  shared expert) made to end a reply after a few tokens (a random model
  rarely samples <|im_end|>): every token's embedding gets a large shared
  component, which the output head reads for <|im_end|> alone."""
  cfg = cfg or model.small(vocab_size=tok.vocab_size)
  m = model.Transformer(cfg, rngs=nnx.Rngs(seed))
  m.embed_vd.value = m.embed_vd.value.at[:, 0].set(30.0)
  m.head_dv.value = m.head_dv.value.at[0, :].set(0.0).at[
      0, tok.im_end].set(push)
  return m


EC = rollout.EpisodeConfig(max_turns=4, max_new_tokens=24,
                           max_observation_tokens=48, max_tokens=320)


@pytest.fixture(scope='module')
def episodes(setup):
  tok, recs = setup
  m = stopping_policy(tok)
  eps = rollout.run_episodes(m, tok, recs * 2, cfg=EC,
                             sample=rollout.SampleConfig(temperature=1.0),
                             key=jax.random.key(3), record_experts=True)
  return m, eps


def test_episodes_run_several_turns_and_end_for_a_reason(setup, episodes):
  tok, _ = setup
  _, eps = episodes
  assert max(e.turns for e in eps) >= 3
  assert {e.end for e in eps} <= set(rollout.ENDS) and all(e.end for e in eps)
  for e in eps:
    assert len(e.tokens) <= EC.max_tokens
    assert e.turns <= EC.max_turns
    if e.end == 'turns':
      assert e.turns == EC.max_turns and e.reward == 0.0
    if e.end == 'cut':
      assert e.tokens[-1] != tok.im_end and e.reward == 0.0
  # The transcript alternates: first messages, then reply / observation.
  e = max(eps, key=lambda e: e.turns)
  roles = [m['role'] for m in e.messages]
  assert roles[0] == 'user' and roles[1] == 'assistant' and 'tool' in roles


def test_the_mask_covers_exactly_the_models_tokens(setup, episodes):
  tok, _ = setup
  _, eps = episodes
  batch = rl.from_episodes(eps, EC.max_tokens - 1)
  assert batch.domains == tuple(e.record['domain'] for e in eps)
  for i, e in enumerate(eps):
    n = len(e.tokens) - 1
    assert batch.mask[i].sum() == sum(e.model)
    assert not batch.mask[i, n:].any() and not batch.segment_ids[i, n:].any()
    assert batch.rewards[i] == e.reward
    # Between replies: the observation, as the chat template encodes it.
    toks, model_ = np.asarray(e.tokens), np.asarray(e.model)
    starts = np.flatnonzero(np.diff(model_) == -1) + 1   # reply -> observation
    obs_msgs = [m for m in e.messages[1:] if m['role'] != 'assistant']
    for s in starts:
      end = s + np.argmax(model_[s:] == 1) if model_[s:].any() else len(toks)
      obs = toks[s:end].tolist()
      assert obs[0] == tok.encode('\n')[0] and obs[-3:] == tok.encode(
          '<|im_start|>assistant\n')[-3:]
    assert len(starts) <= len(obs_msgs)
    # Each reply ends with <|im_end|> unless it was cut.
    replies_end = np.flatnonzero(np.diff(np.append(model_, 0)) == -1)
    for j, r in enumerate(replies_end):
      if j < len(replies_end) - 1 or e.end != 'cut':
        assert toks[r] == tok.im_end


def test_learner_logprobs_equal_the_samplers_over_whole_episodes(setup,
                                                                 episodes):
  # The main job's model and RL update, over episodes of up to 4 turns
  # whose observations were appended to the sampler's KV cache: the
  # learner's forward over the contiguous episode, with the routing
  # replayed, scores every model token as the sampler did.
  tok, _ = setup
  m, eps = episodes
  assert sum(e.turns >= 2 for e in eps) >= 4
  met = _mismatch(m, eps)
  assert met['sampler_mismatch_max'] <= 1e-5, met
  assert met['dropped_learner'] == 0.0


def test_collect_runs_a_stage_of_episodes_with_groups(setup):
  tok, recs = setup
  m = stopping_policy(tok, seed=1)
  c = rl.RLConfig(prompts_per_step=4, rollouts_per_prompt=2,
                  max_new_tokens=EC.max_new_tokens, dynamic_filtering=False)
  ec = c.episode_config(['swe_agent', 'tool_use'])
  assert (ec.max_turns, ec.max_tokens) == (5, 448)   # the domains' defaults
  ec = dataclasses.replace(ec, max_turns=3, max_tokens=320)
  batch, stats = rl.collect(m, tok, rl.PromptStream(recs), c,
                            jax.random.key(0), episodes=ec)
  assert batch.mask.shape == (8, 319) and batch.rewards.shape == (8,)
  assert batch.expert_idx.shape[:2] == (8, 319)      # batch-major routing
  assert len(stats['turns']) == 8 and set(stats['ends']) <= set(rollout.ENDS)
  assert batch.domains[::2] == batch.domains[1::2]   # groups of one record
  # The loss covers the model's replies alone: each turn's reply holds at
  # least its stop token and at most max_new_tokens (observations and the
  # chat template's tokens are not in the mask).
  turns = np.asarray(stats['turns'])
  replies = np.asarray(batch.mask).sum(1)
  assert turns.max() >= 2
  assert np.all(replies >= turns) and np.all(replies <= turns * c.max_new_tokens)


def test_a_budget_that_cannot_hold_a_reply_is_refused(setup):
  tok, recs = setup
  m = stopping_policy(tok)
  with pytest.raises(ValueError, match='exceeds episodes.max_tokens'):
    rollout.run_episodes(m, tok, recs[:1], sample=rollout.SampleConfig(),
                         cfg=rollout.EpisodeConfig(max_tokens=64))
  with pytest.raises(ValueError, match='max_turns must be >= 1'):
    rollout.EpisodeConfig(max_turns=0)


def _mismatch(m, eps):
  opt = train.make_optimizer(train.OptimConfig(
      lr=1e-3, warmup_steps=1, schedule='constant', weight_decay=0.0))
  graph, state = train.init_state(m, opt)
  c = rl.RLConfig(prompts_per_step=len(eps) // 2, rollouts_per_prompt=2,
                  max_new_tokens=EC.max_new_tokens)
  batch = rl.from_episodes(eps, EC.max_tokens - 1)
  batch = batch.replace(rewards=(np.arange(len(eps)) % 2).astype(np.float32))
  _, met = rl.Learner(graph, opt, c).step(state, batch)
  return met


@pytest.mark.slow  # ~16 s, not the default model (the hybrid): CI runs it
def test_hybrid_models_step_their_mamba_states_over_the_empty_slots(setup):
  # The hybrid main job's model ('ME*E': Mamba-2, MoE, attention, MoE):
  # its Mamba states skip the slots that other rows' longer replies and
  # observations leave empty, so the learner's forward over the contiguous
  # episode (chunked SSD) scores every model token as the sampler did.
  tok, recs = setup
  m = stopping_policy(tok, push=0.6, seed=3, cfg=model.small_hybrid(
      vocab_size=tok.vocab_size, pattern='ME*E'))
  eps = rollout.run_episodes(m, tok, recs * 2, cfg=EC,
                             sample=rollout.SampleConfig(temperature=1.0),
                             key=jax.random.key(5), record_experts=True)
  assert sum(e.turns >= 2 for e in eps) >= 4
  assert len({len(e.tokens) for e in eps}) >= 4      # rows of many lengths
  met = _mismatch(m, eps)
  assert met['sampler_mismatch_max'] <= 1e-5, met
  assert met['dropped_learner'] == 0.0


def test_an_observation_that_cannot_be_cut_to_fit_is_named(monkeypatch):
  """Short contents cannot be cut ('... [cut]' outgrows them): an error
  naming the limit, not a loop (it looped on contents of 9-24 characters)."""
  from cascade_jax.rollout import _episode  # pylint: disable=g-import-not-at-top
  calls = []

  def encode(tok, messages):
    calls.append(1)
    if len(calls) > 1000:
      raise AssertionError('the cut does not end')
    return list(range(10 + sum(len(m['content']) for m in messages)))

  monkeypatch.setattr(_episode.data, 'encode_observation', encode)
  for n in (5, 12, 20, 40):
    calls.clear()
    with pytest.raises(ValueError, match='max_observation_tokens=8 is too '
                       'small'):
      _episode.fit_observation(None, [{'role': 'tool', 'content': 'x' * n}],
                                 8)


# Continuous batching of episodes (run_episodes(slots=...), rl.episode_slots).

T1 = rollout.SampleConfig(temperature=1.0)


def _assert_same_episodes(got, want):
  for i, (x, y) in enumerate(zip(got, want)):
    msg = f'episode {i}'
    assert (x.tokens, x.model, x.kept) == (y.tokens, y.model, y.kept), msg
    assert (x.end, x.reward, x.passed, x.turns) == (
        y.end, y.reward, y.passed, y.turns), msg
    assert x.messages == y.messages, msg
    np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5,
                               err_msg=msg)
    assert len(x.experts) == len(y.experts), msg
    for a, b in zip(x.experts, y.experts):
      np.testing.assert_array_equal(a, b, err_msg=msg)


# Not the main job's path (rl.episode_slots=0): slow (~30 s on `small`,
# more on the hybrid, against a default suite past its 15 minutes on a
# slower machine); CI runs them.
@pytest.mark.slow
@pytest.mark.parametrize('preset', ['small', 'small_hybrid'])
def test_continuous_episodes_equal_the_fixed_batch_with_the_same_keys(
    setup, preset):
  # The main job's models (small: capacity dispatch; small_hybrid: Mamba-2
  # layers stepping over each row's padding). 16 episodes of 1 to 4 turns
  # through 4 rows: rows are refilled, each on its own turn, and every
  # episode is the fixed batch's for the same per-episode keys: tokens,
  # transcript, routing of every token, outcome; log-probs within 1e-5.
  # On `small`, new episodes are prefilled at most 3 rows at a time
  # (rl.prefill_rows: the first fill of the 4 rows takes two prefills); the
  # hybrid prefills every free row at once. Observations go in in place.
  tok, recs = setup
  m = stopping_policy(tok, cfg=getattr(model, preset)(
      vocab_size=tok.vocab_size))
  prefill_rows = 3 if preset == 'small' else 0
  stats = _slots_equal_the_fixed_batch(tok, recs * 2, m, m, slots=4,
                                       prefill_rows=prefill_rows)
  assert stats['slots'] == 4, stats
  assert stats['max_prefill'] == (prefill_rows or 4), stats
  # Each step samples for more than one row on average, fewer than all 4
  # (rows wait for their environments between turns).
  assert 1 < stats['tokens_per_step'] <= 4, stats


def _slots_equal_the_fixed_batch(tok, recs, m, sampler, slots,
                                 prefill_rows=0):
  """`recs` played `slots` rows at a time by `sampler` against the fixed
  batch of `m` (the same weights), a key an episode; the slots' stats."""
  keys = jax.random.split(jax.random.key(5), len(recs))
  fixed = rollout.run_episodes(m, tok, recs, cfg=EC, sample=T1, keys=keys,
                               record_experts=True)
  stats = {}
  played = rollout.run_episodes(sampler, tok, recs, cfg=EC, sample=T1,
                                keys=keys, record_experts=True, slots=slots,
                                stats=stats, prefill_rows=prefill_rows)
  turns = [e.turns for e in fixed]
  assert min(turns) == 1 and max(turns) >= 3, turns
  assert stats['places'] > 1, stats                # rows were refilled
  _assert_same_episodes(played, fixed)
  return stats


@pytest.mark.slow  # not the main job's path; CI runs it
def test_continuous_episodes_on_a_mesh_in_the_inference_layout(setup):
  # The RL sampler on a pod (the weight sync's copy on an fsdp x expert
  # mesh, MoE layers through the mesh dispatch): 16 episodes through 6
  # rows, rounded up to the 8 devices the rows split over; every episode
  # is the single-device fixed batch's with the same keys.
  tok, recs = setup
  m = stopping_policy(tok, cfg=_mesh_helpers.tiny_moe(tok.vocab_size))
  sm = _mesh_helpers.inference_layout_sampler(m, dict(fsdp=2, expert=4))
  stats = _slots_equal_the_fixed_batch(tok, recs * 2, m, sm, slots=6)
  assert stats['slots'] == 8, stats


def test_continuous_episodes_refuse_bad_input(setup):
  tok, recs = setup
  m = stopping_policy(tok)
  with pytest.raises(ValueError, match='one key an episode'):
    rollout.run_episodes(m, tok, recs, cfg=EC, sample=T1, slots=2,
                         keys=jax.random.split(jax.random.key(0), 3))
  with pytest.raises(ValueError, match='slots must be >= 1'):
    rollout.run_episodes(m, tok, recs, cfg=EC, sample=T1, slots=-2)
  with pytest.raises(ValueError, match='prefill_rows must be >= 0'):
    rollout.run_episodes(m, tok, recs, cfg=EC, sample=T1, slots=2,
                         prefill_rows=-1)
  with pytest.raises(ValueError, match='episode_slots'):
    rl.RLConfig(episode_slots=-1)


@pytest.mark.slow  # ~10 s, not the main job's path: CI runs it
def test_continuous_episode_slots_collect_what_a_key_an_episode_draws(
    setup, monkeypatch):
  # rl.episode_slots: an episode stage's step plays its episodes a few rows
  # at a time, a key an episode, prefilling at most 2 new ones at a time
  # (rl.prefill_rows). The learner's batch is the fixed batch's with
  # the same keys, row for row: tokens, masks, routing, rewards, log-probs.
  tok, recs = setup
  m = stopping_policy(tok)
  c = rl.RLConfig(prompts_per_step=4, rollouts_per_prompt=4,
                  dynamic_filtering=False, overlong='none', episode_slots=5,
                  prefill_rows=2)
  key = jax.random.key(4)
  stream = rl.PromptStream(recs)
  played, run = [], rollout.run_episodes

  def spy(*args, **kwargs):
    kwargs['stats'] = kwargs.get('stats', {})
    played.append(kwargs)
    return run(*args, **kwargs)

  monkeypatch.setattr(rollout, 'run_episodes', spy)
  batch, stats = rl.collect(m, tok, stream, c, key, episodes=EC)
  monkeypatch.undo()
  assert [(k['slots'], k['prefill_rows'], k['stats']['max_prefill'])
          for k in played] == [(5, 2, 2)], played
  assert max(stats['turns']) >= 2, stats['turns']
  # collect's first round samples with split(key)[1].
  stream = rl.PromptStream(recs)
  rows = [r for r in stream.take(4) for _ in range(4)]
  eps = rollout.run_episodes(
      m, tok, rows, cfg=EC, sample=c.sample_config, record_experts=True,
      keys=jax.random.split(jax.random.split(key)[1], 16),
      prompt_width=stream.prompt_width(tok))
  want = rl.from_episodes(eps, EC.max_tokens - 1)
  # The step's decode counts (rl metrics episode_decode_steps and
  # episode_tokens_per_step): every token the model sampled, once.
  assert stats['sampled_tokens'] == sum(sum(e.model) for e in eps)
  assert 0 < stats['decode_steps'] < stats['sampled_tokens']
  for name in ('inputs', 'targets', 'mask', 'segment_ids', 'positions',
               'rewards', 'expert_idx'):
    np.testing.assert_array_equal(getattr(batch, name), getattr(want, name),
                                  err_msg=name)
  np.testing.assert_allclose(batch.sampler_logp, want.sampler_logp, atol=1e-5)
