"""The RL learner: rollouts line up with the learner, filtering, and GRPO learns a toy reward."""

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import chex
import numpy as np
import pytest
from flax import nnx

from cascade_jax import data
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
  for t in (0.0, -1.0):
    with pytest.raises(ValueError, match='rl.temperature must be > 0'):
      rl.RLConfig(temperature=t)
  with pytest.raises(ValueError, match='rl.top_p'):
    rl.RLConfig(top_p=0.0)
  with pytest.raises(ValueError, match='rl.top_k'):
    rl.RLConfig(top_k=-1)
  for k in ('micro_batches', 'updates_per_batch'):
    with pytest.raises(ValueError, match=f'rl.{k} must be >= 1'):
      rl.RLConfig(**{k: 0})
  with pytest.raises(ValueError, match='rl.verifier_reward'):
    rl.RLConfig(verifier_reward='all')


def _main_job_policy(tok, seed=0):
  """The main job's preset (capacity dispatch, sigmoid router, shared
  expert, expert bias) with a non-zero bias, as after SFT's balancing."""
  cfg = model.small(vocab_size=tok.vocab_size)
  assert (cfg.moe.dispatch, cfg.moe.score_fn, cfg.moe.num_shared_experts,
          cfg.moe.use_expert_bias) == ('capacity', 'sigmoid', 1, True)
  m = model.Transformer(cfg, rngs=nnx.Rngs(seed))
  m.set_expert_biases(np.stack([
      np.random.RandomState(i).uniform(-0.1, 0.1, 8)
      for i in range(m.cfg.pattern.count('E'))]))
  opt = train.make_optimizer(train.OptimConfig(
      lr=1e-3, warmup_steps=1, schedule='constant', weight_decay=0.0))
  return (cfg, opt) + train.init_state(m, opt)


# code_rl's top-p by default (the scoring over the sampled set too); plain
# sampling in CI (and in every RL stage of tests/test_cascade.py's quick
# cascade).
@pytest.mark.parametrize('top_p', [pytest.param(1.0, marks=pytest.mark.slow),
                                   0.95])
def test_learner_equals_sampler_on_the_main_jobs_model(setup, top_p):
  # 64 rollouts x 16 tokens through the main job's model: its configured
  # capacity (factor 1.25) drops tokens in a batch this size, so the
  # learner must run an exact path to see what the sampler computed.
  tok, _, recs = setup
  cfg, opt, graph, state = _main_job_policy(tok)
  c = rl.RLConfig(prompts_per_step=8, rollouts_per_prompt=8,
                  max_new_tokens=16, top_p=top_p, dynamic_filtering=False,
                  overlong='none')
  batch, _ = rl.collect(
      nnx.merge(graph, state.params, state.rest), tok, rl.PromptStream(recs),
      c, jax.random.key(0), reward_fn=lambda r, _: np.arange(len(r)) % 2)
  if top_p < 1:   # the sampler kept part of the vocabulary at some tokens
    kept = batch.kept[batch.mask > 0]
    assert kept.min() < tok.vocab_size, kept.min()
  learner = rl.Learner(graph, opt, c)
  # What the configured path would do with the same batch (before `step`
  # donates the state).
  dev, _ = learner.prepare(batch)
  _, m_cap = rl.update(jax.tree.map(jnp.copy, state), dev, graph=graph,
                       opt=opt, cfg=c)
  state, m = learner.step(state, batch)
  assert m['sampler_mismatch_max'] <= 1e-5, m
  assert m['dropped_learner'] == 0.0
  assert float(m_cap['dropped_learner']) > 0.01
  assert float(m_cap['sampler_mismatch_max']) > 1e-3


def test_top_p_is_scored_over_the_sampled_set():
  # Logits log [.5, .3, .15, .05]: top-p 0.8 keeps {0, 1} (0.5 < 0.8 <=
  # 0.8); renormalised, token 1 has log(.3 / .8). keep_top_n with the
  # recorded count (2) gives the same, and ties with the n-th are kept.
  logits = jnp.log(jnp.array([[.5, .3, .15, .05]]))
  sc = rollout.SampleConfig(top_p=0.8)
  lp = jax.nn.log_softmax(rollout.process_logits(logits, sc))
  np.testing.assert_allclose(lp[0, 1], np.log(.3 / .8), rtol=1e-6)
  lp2 = jax.nn.log_softmax(rollout.keep_top_n(logits, jnp.array([2])))
  np.testing.assert_allclose(lp2, lp, rtol=1e-6)
  tied = rollout.keep_top_n(jnp.array([[1.0, 2.0, 1.0, 0.0]]), jnp.array([2]))
  np.testing.assert_array_equal(tied > -1e29, [[True, True, True, False]])
  with pytest.raises(ValueError, match='temperature must be > 0'):
    rollout.process_logits(logits, rollout.SampleConfig(temperature=0.0))


def test_grpo_learns_a_toy_reward_with_matching_logprobs(setup):
  tok, cfg, recs = setup
  opt, graph, state = _init(cfg, lr=1e-2)
  c = rl.RLConfig(prompts_per_step=4, rollouts_per_prompt=8,
                  max_new_tokens=12)
  learner = rl.Learner(graph, opt, c)
  stream = rl.PromptStream(recs)
  key = jax.random.key(0)
  means = []
  for _ in range(30):
    key, sub = jax.random.split(key)
    batch, stats = rl.collect(
        nnx.merge(graph, state.params, state.rest), tok, stream, c, sub,
        reward_fn=share_of_a)
    means.append(np.mean(stats['rewards']))
    state, m = learner.step(state, batch)
    # The learner's forward pass (with the rollout's routing replayed) gives
    # the sampler's log-probs: strictly on-policy.
    assert float(m['sampler_mismatch_mean']) < 1e-5
  assert np.mean(means[-5:]) > 2 * np.mean(means[:5]) + 0.05, means


def test_trimming_the_empty_tail_changes_nothing(setup):
  tok, cfg, recs = setup
  opt, graph, state = _init(cfg)
  c = rl.RLConfig(prompts_per_step=2, rollouts_per_prompt=4,
                  max_new_tokens=40, dynamic_filtering=False, trim_bucket=16)
  batch, _ = rl.collect(
      nnx.merge(graph, state.params, state.rest), tok, rl.PromptStream(recs),
      c, jax.random.key(1), reward_fn=share_of_a)
  # The same batch with 32 more empty columns, as collect built it before.
  wide = batch.replace(**{
      k: v if v.ndim == 1 else np.pad(v, [(0, 0), (0, 32)] + [(0, 0)] * (
          v.ndim - 2)) for k, v in batch.arrays().items()})
  assert wide.trim_right(16).mask.shape == batch.mask.shape
  ms = [rl.Learner(graph, opt, c).step(jax.tree.map(jnp.copy, state), b)[1]
        for b in (batch, wide)]
  for k in ('loss', 'grad_norm', 'sampler_mismatch_mean', 'token_count'):
    np.testing.assert_allclose(float(ms[0][k]), float(ms[1][k]), rtol=1e-5,
                               atol=1e-6)


def test_trim_right_keeps_whole_buckets():
  mask = np.zeros((2, 40), np.int32)
  mask[1, 3:6] = 1
  ones = np.ones((2, 40))
  b = rl.RLBatch(inputs=ones, targets=ones, positions=ones, segment_ids=ones,
                 mask=mask, sampler_logp=ones, rewards=np.ones(2),
                 expert_idx=np.ones((2, 40, 3, 2)))
  out = b.trim_right(16)
  assert out.mask.shape == (2, 8) and out.expert_idx.shape == (2, 8, 3, 2)
  assert out.mask.sum() == 3 and out.rewards.shape == (2,)
  mask[0, 30] = 1
  assert b.trim_right(16).mask.shape == (2, 40)


def test_learner_scores_the_tempered_policy_the_sampler_drew_from(setup):
  tok, cfg, recs = setup
  opt, graph, state = _init(cfg)
  c = rl.RLConfig(prompts_per_step=2, rollouts_per_prompt=4,
                  max_new_tokens=8, dynamic_filtering=False, temperature=0.7,
                  overlong='none')
  batch, _ = rl.collect(
      nnx.merge(graph, state.params, state.rest), tok, rl.PromptStream(recs),
      c, jax.random.key(0), reward_fn=lambda recs, _: np.arange(len(recs)) % 2)
  _, m = rl.Learner(graph, opt, c).step(state, batch)
  assert m['sampler_mismatch_mean'] < 1e-5


def test_more_updates_per_batch_are_off_policy_after_the_first(setup):
  tok, cfg, recs = setup
  opt, graph, state = _init(cfg)
  c = rl.RLConfig(prompts_per_step=2, rollouts_per_prompt=4,
                  max_new_tokens=8, dynamic_filtering=False,
                  updates_per_batch=2, overlong='none')
  batch, _ = rl.collect(
      nnx.merge(graph, state.params, state.rest), tok, rl.PromptStream(recs),
      c, jax.random.key(0),
      reward_fn=lambda recs, _: np.arange(len(recs)) % 3)
  learner = rl.Learner(graph, opt, c)
  state, m = learner.step(state, batch)
  # The warm-up's first step has lr 0: minibatch 2 sees the same policy.
  assert int(state.step) == 2 and abs(m['ratio_mean'] - 1.0) < 1e-5
  state, m = learner.step(state, batch)
  # Minibatch 2 is scored after the update on minibatch 1: off-policy.
  assert abs(m['ratio_mean'] - 1.0) > 1e-4, m
  with pytest.raises(ValueError, match='whole groups'):
    rl.Learner(graph, opt, dataclasses.replace(c, updates_per_batch=3)).step(
        state, batch)


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
    batch, _ = rl.collect(policy, tok, stream, c, jax.random.key(step),
                          reward_fn=share_of_a)
    widths.add(batch.inputs.shape[1])
    traces.append(rollout.trace_count())
  assert widths == {width + c.max_new_tokens - 1}
  assert traces[-1] == traces[0], traces   # no sampler compile after the first


def test_dynamic_filtering_drops_groups_with_equal_rewards(setup):
  tok, cfg, recs = setup
  opt, graph, state = _init(cfg)
  c = rl.RLConfig(prompts_per_step=2, rollouts_per_prompt=4, max_new_tokens=8,
                  max_refill_rounds=1, overlong='none')
  batch, stats = rl.collect(
      nnx.merge(graph, state.params, state.rest), tok, rl.PromptStream(recs),
      c, jax.random.key(0), reward_fn=lambda r, s: np.ones(len(s)))
  assert not batch.learn and stats['kept_groups'] == 0
  assert stats['groups'] == stats['filtered_groups'] == 4   # 2 + 2 refilled
  # Nothing to learn from (the first group, then empty copies), but the
  # step still shows it is on-policy, and takes no optimizer step.
  assert batch.inputs.shape[0] == 8 and batch.mask[4:].sum() == 0
  state, m = rl.Learner(graph, opt, c).step(state, batch)
  assert int(state.step) == 0 and 'loss' not in m
  assert m['sampler_mismatch_max'] <= 1e-5
  assert m['dropped_learner'] == 0.0


def test_overlong_filter_removes_cut_responses_from_the_loss(setup):
  tok, cfg, recs = setup
  opt, graph, state = _init(cfg)
  # <|im_end|>'s output weights scaled up: some rows stop within 3 tokens.
  head = state.params['head_dv']
  head[...] = head[...].at[:, tok.im_end].multiply(30.0)
  c = rl.RLConfig(prompts_per_step=2, rollouts_per_prompt=4, max_new_tokens=3,
                  dynamic_filtering=False, overlong='filter')
  ones = lambda r, s: np.ones(len(s))
  policy = nnx.merge(graph, state.params, state.rest)
  batch, stats = rl.collect(policy, tok, rl.PromptStream(recs), c,
                            jax.random.key(0), reward_fn=ones)
  unfiltered, _ = rl.collect(
      policy, tok, rl.PromptStream(recs),
      dataclasses.replace(c, overlong='none'), jax.random.key(0),
      reward_fn=ones)
  cut = batch.mask.sum(1) == 0
  assert 0 < stats['truncated'] == cut.sum() < 8    # rows cut at 3 tokens
  np.testing.assert_array_equal(batch.mask[~cut], unfiltered.mask[~cut])
  np.testing.assert_array_equal(batch.rewards, 1.0)  # rewards kept as scored
  # The update on the filtered batch equals the update on the finished
  # responses alone (advantages as given): the cut ones add no gradient.
  batch = batch.replace(advantages=np.linspace(-1, 1, 8).astype(np.float32))
  keep = batch.rows(~cut)
  outs = [rl.update(jax.tree.map(jnp.copy, state), jax.device_put(b),
                    graph=graph, opt=opt, cfg=c, moe=rl.exact_moe(cfg, b))
          for b in (batch, keep)]
  for k in ('loss', 'grad_norm', 'token_count'):
    np.testing.assert_allclose(float(outs[0][1][k]), float(outs[1][1][k]),
                               rtol=1e-5)
  chex.assert_trees_all_close(outs[0][0].params, outs[1][0].params, atol=1e-6)


def test_each_teacher_scores_its_own_domains_rows_only(setup, monkeypatch):
  from cascade_jax.rl import _learner  # pylint: disable=g-import-not-at-top
  tok, cfg, recs = setup
  opt, graph, state = _init(cfg)
  teachers = {dom: rl.freeze(model.Transformer(cfg, rngs=nnx.Rngs(10 + seed)))
              for seed, dom in enumerate(('a', 'b'))}
  mixed = [dict(r, domain='ab'[i % 3 == 0]) for i, r in enumerate(recs)]
  c = rl.RLConfig(prompts_per_step=6, rollouts_per_prompt=2, max_new_tokens=6,
                  dynamic_filtering=False, algorithm='mopd')
  batch, _ = rl.collect(
      nnx.merge(graph, state.params, state.rest), tok, rl.PromptStream(mixed),
      c, jax.random.key(0), reward_fn=share_of_a)
  doms = np.asarray(batch.domains)
  assert set(doms) == {'a', 'b'}
  calls = []
  frozen = _learner.frozen_logprobs

  def recording(graph, params, rest, fwd, **kw):
    calls.append((params, np.asarray(fwd['inputs'])))
    return frozen(graph, params, rest, fwd, **kw)
  monkeypatch.setattr(_learner, 'frozen_logprobs', recording)
  dev, extra = rl.Learner(graph, opt, c, teachers=teachers).prepare(batch)
  lp = np.asarray(dev.teacher_logp)
  assert float(extra['dropped_teacher']) == 0.0 and len(calls) == 2
  fwd = {k: jnp.asarray(getattr(batch, k))
         for k in ('inputs', 'targets', 'positions', 'segment_ids')}
  for dom, (params, inputs) in zip(('a', 'b'), calls):
    assert params is teachers[dom].params
    rows = np.flatnonzero(doms == dom)
    # Its own rows (then copies of its first, up to the stage's one
    # chunk size: 12 rows over 2 teachers, 8): no other domain's row
    # reaches this teacher.
    assert len(inputs) == 8
    np.testing.assert_array_equal(inputs[:len(rows)], batch.inputs[rows])
    np.testing.assert_array_equal(inputs[len(rows):],
                                  batch.inputs[rows[:1]].repeat(
                                      len(inputs) - len(rows), 0))
    # ... and those rows get this teacher's log-probs, not the other's.
    own, _ = frozen(*teachers[dom], fwd)
    other, _ = frozen(*teachers['b' if dom == 'a' else 'a'], fwd)
    m = batch.mask[rows] > 0
    np.testing.assert_allclose(lp[rows][m], np.asarray(own)[rows][m],
                               atol=1e-5)
    assert np.abs(lp[rows][m] - np.asarray(other)[rows][m]).max() > 1e-2
  with pytest.raises(ValueError, match=r"no teacher for domains \['b'\]"):
    rl.teacher_rows(batch.domains, {'a': teachers['a']})


def test_teacher_rows_chunks_of_one_size_whatever_the_mix():
  from cascade_jax.rl import _learner  # pylint: disable=g-import-not-at-top
  # 12 rows, 2 teachers: chunks of 8 (6 rounded up to a power of two);
  # a domain of 10 rows takes two, one of 2 rows one; padding repeats the
  # domain's first row and scatters out of range (12: dropped).
  doms = ['a'] * 5 + ['b'] + ['a'] * 5 + ['b']
  plans = rl.teacher_rows(doms, {'a': None, 'b': None})
  assert _learner.teacher_chunk(12, 2) == 8
  assert [len(g) for g, _ in plans['a']] == [8, 8] and len(plans['b']) == 1
  whole = lambda dom, i: np.concatenate([c[i] for c in plans[dom]])
  np.testing.assert_array_equal(
      whole('a', 0), [0, 1, 2, 3, 4, 6, 7, 8, 9, 10] + [0] * 6)
  np.testing.assert_array_equal(
      whole('a', 1), [0, 1, 2, 3, 4, 6, 7, 8, 9, 10] + [12] * 6)
  np.testing.assert_array_equal(whole('b', 0), [5, 11] + [5] * 6)
  np.testing.assert_array_equal(whole('b', 1), [5, 11] + [12] * 6)
  # On 4 devices a chunk is a multiple of 4; one teacher: the whole batch.
  assert _learner.teacher_chunk(12, 5, rows_multiple=4) == 4
  assert _learner.teacher_chunk(64, 1) == 64
  assert _learner.teacher_chunk(12, 1) == 12      # not 16: the batch's rows
  assert _learner.teacher_chunk(64, 3, rows_multiple=8) == 32


def test_overlong_penalty_by_reward_kind():
  r = np.array([0.7, 0.2, 0.9, 0.4, -3.0, 5.0], np.float32)
  cut = np.array([False, False, True, False, True, False])
  # A verifier's rewards: a cut response gets 0.
  np.testing.assert_allclose(rl.overlong_penalty(r, cut, 3),
                             [0.7, 0.2, 0.0, 0.4, 0.0, 5.0])
  # A reward model's: the lowest score of its group (0.2; -3.0 is its own).
  np.testing.assert_allclose(rl.overlong_penalty(r, cut, 3, bounded=False),
                             [0.7, 0.2, 0.2, 0.4, -3.0, 5.0])


def test_refills_sample_only_what_is_missing(setup):
  tok, cfg, recs = setup
  _, graph, state = _init(cfg)
  assert [rl.refill_size(m, 16) for m in (1, 3, 4, 5, 9, 16)] == [
      4, 4, 4, 8, 16, 16]
  assert rl.refill_size(1, 2) == 1
  c = rl.RLConfig(prompts_per_step=8, rollouts_per_prompt=2, max_new_tokens=4,
                  max_refill_rounds=2, overlong='none')
  # Prompts 0 and 1 get equal rewards in both rollouts: filtered.
  seen = []

  def reward(records, _):
    seen.append(len(records))
    return np.asarray([float(i % 2) if int(r['id']) >= 2 else 1.0
                       for i, r in enumerate(records)])
  recs = [dict(r, id=str(i)) for i, r in enumerate(recs)]
  batch, stats = rl.collect(
      nnx.merge(graph, state.params, state.rest), tok, rl.PromptStream(recs),
      c, jax.random.key(0), reward_fn=reward)
  # Round 1 samples all 8 prompts and keeps 6; the 2 missing are refilled
  # with 2 prompts (4 rollouts), not another 8.
  assert seen[:2] == [16, 4], seen
  assert all(n <= 4 for n in seen[1:]), seen
  assert stats['sampled_prompts'] == sum(seen) // 2
  assert stats['kept_groups'] == min(
      8, stats['groups'] - stats['filtered_groups'])
  assert batch.inputs.shape[0] == 16


def test_prompt_stream_order_and_resume():
  recs = [dict(id=str(i)) for i in range(5)]
  s = rl.PromptStream(recs, seed=3)
  got = [r['id'] for r in s.take(12)]
  # A new seeded permutation each epoch (seed + epoch), as before.
  want = [str(i) for e in range(3)
          for i in np.random.RandomState(3 + e).permutation(5)][:12]
  assert got == want
  s2 = rl.PromptStream(recs, seed=3, position=7)
  assert [r['id'] for r in s2.take(5)] == want[7:12]


def test_overlong_responses_are_penalised(setup):
  tok, cfg, recs = setup
  _, graph, state = _init(cfg)
  c = rl.RLConfig(prompts_per_step=2, rollouts_per_prompt=4, max_new_tokens=8,
                  dynamic_filtering=False)
  batch, stats = rl.collect(
      nnx.merge(graph, state.params, state.rest), tok, rl.PromptStream(recs),
      c, jax.random.key(0), reward_fn=lambda r, s: np.ones(len(s)))
  assert stats['truncated'] > 0
  assert batch.rewards.min() == 0.0      # cut at the limit: reward 0
  assert batch.inputs.shape[0] == 8


# ------------------------------------------------------- the stage runner

import os  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
import sys  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import rl as rl_config  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position



@pytest.fixture
def sft_dir(main_job_sft):
  return main_job_sft     # conftest: the main job's model, 6 quick SFT steps


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


@pytest.mark.slow  # ~14 s, bf16 sampler (not the default; its loss test stays): CI runs it
def test_weight_sync_stage_samples_bf16_and_logs_the_sync(sft_dir, tmp_path):
  # rl.sampler_dtype='bfloat16' through the stage: every step samples from
  # a fresh bf16 copy (the sync's seconds logged), the learner keeps fp32
  # weights (its checkpoint too) and corrects the loss (is_* metrics).
  c = rl_config.get_config('quick')
  c.init_from = sft_dir
  c.rl.sampler_dtype, c.steps, c.eval_n = 'bfloat16', 2, 0
  c.rl.dynamic_filtering = False    # every step learns (rewards may all be 0)
  rl.run(c, str(tmp_path))
  rows = [json.loads(l) for l in open(tmp_path / 'rl_metrics.jsonl')]
  steps = [r for r in rows if 'reward_mean' in r]
  assert [r['step'] for r in steps] == [1, 2]
  assert all(r['weight_sync_s'] > 0 for r in steps)
  learned = [r for r in steps if 'loss' in r]
  assert learned and all(0 < r['is_weight_mean'] for r in learned)
  assert max(r['sampler_mismatch_max'] for r in steps) > 1e-4
  _, restored, _ = train.restore_run(str(tmp_path))
  assert {x.dtype for x in jax.tree.leaves(nnx.state(restored, nnx.Param))
          } == {jnp.dtype('float32')}


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
  # A teacher unlike the student (its weights moved by noise): the reverse
  # KL the stage reports, the mean of log pi_student - log pi_teacher over
  # the student's own samples, estimates KL(student || teacher) > 0; with
  # teacher and student swapped anywhere it would come out negative.
  c.teachers.math = _perturbed_copy(sft_dir, tmp_path / 'teacher')
  c.steps = 1
  rl.run(c, str(tmp_path / 'far'))
  rows = [json.loads(l) for l in open(tmp_path / 'far' / 'rl_metrics.jsonl')]
  far = [r for r in rows if 'reverse_kl' in r][0]
  assert far["reverse_kl"] > 0.1, far      # measured 0.98
  c.teachers.math = str(tmp_path / 'nowhere')
  with pytest.raises(FileNotFoundError, match="teacher for domain 'math'"):
    rl.run(c, str(tmp_path / 'bad'))


def _perturbed_copy(run_dir, out) -> str:
  """A copy of a run whose latest weights have Gaussian noise added
  (std 0.5 x each tensor's std)."""
  from cascade_jax import checkpoint  # pylint: disable=g-import-not-at-top
  shutil.copytree(run_dir, out)
  ckpt = checkpoint.Checkpointer(str(out / 'checkpoints'))
  step = ckpt.latest_step()
  state, extra = ckpt.read(step)
  rng = np.random.default_rng(0)
  noisy = jax.tree.map(
      lambda x: (x + 0.5 * np.std(x) * rng.standard_normal(x.shape)).astype(
          x.dtype) if np.issubdtype(np.asarray(x).dtype, np.floating)
      and np.size(x) > 1 else x, state)
  ckpt.close()
  shutil.rmtree(out / 'checkpoints' / str(step))
  ckpt = checkpoint.Checkpointer(str(out / 'checkpoints'))
  ckpt.save(step, noisy, extra)
  ckpt.wait()
  ckpt.close()
  return str(out)


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


def test_domain_options_give_row_files_to_the_row_domain_only():
  data = dict(domain='math,nemo_gym', n_train=64, levels=(1, 2),
              split_by='prompt', files='a.jsonl', eval_files='',
              per_domain={'math': {'levels': (3,)}})
  assert rl.domain_options(data, 'math') == dict(levels=(3,),
                                                 split_by='prompt')
  assert rl.domain_options(data, 'nemo_gym') == dict(
      levels=(1, 2), split_by='prompt', files='a.jsonl', eval_files='')
