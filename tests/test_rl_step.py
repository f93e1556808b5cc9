"""One RL step on the main job's path: micro-batched updates equal the whole batch's, and the data crosses once each way."""

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cascade_jax import data
from cascade_jax import domains
from cascade_jax import model
from cascade_jax import rl
from cascade_jax import rollout
from cascade_jax import sharding
from cascade_jax import train
from cascade_jax.rl import _batch as rl_batch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import rl as rl_config  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

EC = rollout.EpisodeConfig(max_turns=3, max_new_tokens=24,
                           max_observation_tokens=48, max_tokens=256)


@pytest.fixture(scope='module')
def setup():
  recs = [dict(id=str(i), domain='toy',
               messages=[{'role': 'user', 'content': 'write letters'}])
          for i in range(8)]
  agentic = (domains.generate('swe_agent', split='train', n=4, seed=0,
                              levels=(2, 3)) +
             domains.generate('tool_use', split='train', n=4, seed=0))
  tok = data.train_tokenizer(
      ['aaa bbb ccc', 'abc cab bca', 'write letters', 'a b c d e'] * 20 +
      [m['content'] for r in agentic for m in r['messages'] + r['turns']] * 10,
      400)
  return tok, recs, agentic


def _policy(tok, seed=0, preset='small'):
  """The main job's preset (capacity dispatch, sigmoid router, shared
  expert, expert bias), fp32, with a non-zero bias as after SFT's balancing,
  made to end replies after a few tokens (multi-turn episodes then take
  turns): every embedding gets a large shared component, which the output
  head reads for <|im_end|> alone. `preset` 'small_hybrid': the hybrid
  main job's model (Mamba-2 layers, pattern 'ME*E')."""
  cfg = (model.small(vocab_size=tok.vocab_size) if preset == 'small' else
         model.small_hybrid(vocab_size=tok.vocab_size, pattern='ME*E'))
  assert (cfg.moe.dispatch, cfg.dtype, cfg.moe.use_expert_bias) == (
      'capacity', 'float32', True)
  m = model.Transformer(cfg, rngs=nnx.Rngs(seed))
  m.set_expert_biases(np.stack([
      np.random.RandomState(i).uniform(-0.1, 0.1, 8)
      for i in range(m.cfg.pattern.count('E'))]))
  m.embed_vd.value = m.embed_vd.value.at[:, 0].set(30.0)
  m.head_dv.value = m.head_dv.value.at[0, :].set(0.0).at[0, tok.im_end].set(
      0.45)
  return cfg, m


def _optimizer():
  """The main job's RL optimizer (configs/rl.py), warm-up done."""
  oc = rl_config.get_config().optim.to_dict()
  return train.make_optimizer(train.OptimConfig(**dict(oc, warmup_steps=1)))


def _batch(kind, tok, recs, agentic, m, c):
  policy = m
  if kind == 'episodes':
    batch, stats = rl.collect(policy, tok, rl.PromptStream(agentic), c,
                              jax.random.key(2), episodes=EC)
    assert max(stats['turns']) >= 2, stats['turns']
    # An untrained policy solves none: rewards of three levels instead,
    # so that the advantages (and the gradient) are not all zero.
    return batch.replace(rewards=(np.arange(batch.num_rows) % 3).astype(
        np.float32))
  return rl.collect(policy, tok, rl.PromptStream(recs), c, jax.random.key(1),
                    reward_fn=lambda r, _: np.arange(len(r)) % 3)[0]


@pytest.mark.slow  # grpo ~40 s, not the default (rl.micro_batches=1): CI runs them
@pytest.mark.parametrize('kind', ['grpo', 'mopd', 'episodes'])
def test_micro_batches_give_the_same_update(setup, kind):
  # One optimizer step over 32 rollouts, its gradient in 1, 2 or 4
  # micro-batches: the same objective (every micro-batch's loss divides by
  # the whole batch's token / sequence count), so only float sums move.
  tok, recs, agentic = setup
  cfg, m = _policy(tok)
  c = rl.RLConfig(algorithm='mopd' if kind == 'mopd' else 'grpo',
                  prompts_per_step=8 if kind != 'episodes' else 4,
                  rollouts_per_prompt=4 if kind != 'episodes' else 8,
                  max_new_tokens=EC.max_new_tokens if kind == 'episodes'
                  else 12, dynamic_filtering=False, overlong='none',
                  kl_coef=0.05 if kind == 'grpo' else 0.0)
  batch = _batch(kind, tok, recs, agentic, m, c)
  assert batch.num_rows == 32 and batch.expert_idx is not None
  if kind == 'episodes':   # loss on the replies only, several per row
    assert (batch.mask.sum(1) > 0).all()
    assert (batch.mask.sum(1) < batch.segment_ids.sum(1)).all()
  opt = _optimizer()
  reference = rl.freeze(m, copy=True) if c.kl_coef else None
  teachers = ({'toy': rl.freeze(_policy(tok, seed=1)[1])}
              if kind == 'mopd' else None)
  out = {}
  for k in (1, 2, 4):
    graph, state = train.init_state(_policy(tok)[1], opt)
    learner = rl.Learner(graph, opt, dataclasses.replace(c, micro_batches=k),
                         reference=reference, teachers=teachers)
    out[k] = learner.step(state, batch)
  s1, m1 = out[1]
  assert m1['sampler_mismatch_max'] <= 1e-5 and m1['dropped_learner'] == 0.0
  assert m1['grad_norm'] > 0 and m1['token_count'] == batch.mask.sum()
  # GRPO's on-policy loss, -sum_i A_i |o_i| / N, cancels terms of size |A|
  # ~ 1 to near 0: it is held to 1e-6 of that scale; the rest relatively.
  scale = {'loss': 1.0 if kind != 'mopd' else abs(m1['loss'])}
  for k in (2, 4):
    sk, mk = out[k]
    for key in ('loss', 'grad_norm', 'token_count', 'entropy',
                'sampler_mismatch_mean', 'sampler_mismatch_max'):
      np.testing.assert_allclose(mk[key], m1[key], rtol=1e-6,
                                 atol=1e-6 * scale.get(key, 0.0),
                                 err_msg=f'{key}, micro_batches={k}')
    assert mk['moe_capacity'] <= m1['moe_capacity']   # fits every part
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(sk.params),
                            jax.tree.leaves(s1.params)):
      a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
      assert np.linalg.norm(a - b) <= 1e-6 * np.linalg.norm(b), (
          jax.tree_util.keystr(path), k)


# The main job's path (episodes) by default; the others in CI (~70 s).
@pytest.mark.parametrize('kind', ['episodes', pytest.param(
    'grpo', marks=pytest.mark.slow), pytest.param(
        'hybrid', marks=pytest.mark.slow)])
def test_packed_update_equals_the_padded_one(setup, kind):
  # rl.pack_width (the main job's episode stages): the rollouts packed
  # into rows of several, the update equals the padded batch's (the same
  # tokens, routing, advantages and token-level loss; float sums only),
  # whole and in micro-batches, with a KL reference scored packed too; on
  # the hybrid, the Mamba state restarts at every packed rollout.
  tok, recs, agentic = setup
  preset = 'small_hybrid' if kind == 'hybrid' else 'small'
  cfg, m = _policy(tok, preset=preset)
  episodes = kind == 'episodes'
  # Episodes: 16 (4 prompts x 4), several to a packed row.
  c = rl.RLConfig(prompts_per_step=4 if episodes else 8,
                  rollouts_per_prompt=4,
                  max_new_tokens=EC.max_new_tokens if episodes else 12,
                  dynamic_filtering=False, overlong='none',
                  kl_coef=0.0 if episodes else 0.05)
  batch = _batch('grpo' if kind == 'hybrid' else kind, tok, recs, agentic,
                 m, c)
  width = 256 if episodes else 64
  packed = rl_batch.pack(batch, width)
  seg = batch.segment_ids != 0
  w = packed.segment_ids.shape[1]
  assert packed.num_rows < batch.num_rows and w % width == 0
  assert w - width < seg.sum(1).max() <= w
  # Every rollout's positions once, in order, each its own segment.
  for i in range(batch.num_rows):
    at = packed.source_row == i
    assert at.sum() == seg[i].sum()
    for k in ('inputs', 'targets', 'positions', 'mask', 'sampler_logp',
              'kept', 'expert_idx'):
      np.testing.assert_array_equal(getattr(packed, k)[at],
                                    getattr(batch, k)[i][seg[i]], err_msg=k)
    assert len(np.unique(packed.segment_ids[at])) == 1
  assert ((packed.segment_ids != 0) ==
          (packed.source_row < batch.num_rows)).all()
  opt = _optimizer()
  reference = rl.freeze(m, copy=True) if c.kl_coef else None
  out = {}
  for key in ((0, 1), (width, 1), (width, 2)):
    graph, state = train.init_state(_policy(tok, preset=preset)[1], opt)
    learner = rl.Learner(graph, opt, dataclasses.replace(
        c, pack_width=key[0], micro_batches=key[1]), reference=reference)
    out[key] = learner.step(state, batch)
  s0, m0 = out[0, 1]
  assert m0['grad_norm'] > 0 and 'packed_rows' not in m0
  for key in ((width, 1), (width, 2)):
    sk, mk = out[key]
    # The first batch sizes the rows with the capacity's headroom.
    roomy = rl_batch.pack(batch, width, key[1], headroom=0.25).num_rows
    assert mk['packed_rows'] == roomy > packed.num_rows, (roomy, key)
    assert 0 < mk['packed_fill'] <= 1
    assert mk['sampler_mismatch_max'] <= 1e-5 and mk['dropped_learner'] == 0
    for name in ('loss', 'grad_norm', 'token_count', 'entropy', 'kl',
                 'response_length'):
      np.testing.assert_allclose(mk[name], m0[name], rtol=1e-5, atol=1e-6,
                                 err_msg=f'{name}, {key}')
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(sk.params),
                            jax.tree.leaves(s0.params)):
      a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
      assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b), (
          jax.tree_util.keystr(path), key)


def test_packed_rows_are_sized_once_and_never_lowered(setup):
  # As the MoE capacity: each row count compiles the update once, so the
  # stage's first batch sizes it with headroom, a later batch only raises
  # it, and a resumed learner (rows restored from the checkpoint) keeps it.
  tok, recs, agentic = setup
  cfg, m = _policy(tok)
  c = rl.RLConfig(prompts_per_step=8, rollouts_per_prompt=4,
                  max_new_tokens=12, dynamic_filtering=False, overlong='none',
                  pack_width=64)
  batch = _batch('grpo', tok, recs, agentic, m, c)
  need = rl_batch.pack(batch, 64).num_rows
  opt = _optimizer()
  graph, state = train.init_state(m, opt)
  learner = rl.Learner(graph, opt, c)
  state, m1 = learner.step(state, batch)
  assert m1['packed_rows'] == learner.pack_rows > need
  # Later batches: no headroom on top again, and never fewer rows (the
  # packing alone, without another update).
  assert learner.pack(batch).num_rows == m1['packed_rows']
  assert learner.pack(batch.replace(segment_ids=np.where(
      np.arange(batch.mask.shape[1]) < 8, 0, batch.segment_ids))
                      ).num_rows == m1['packed_rows']
  assert rl.Learner(graph, opt, c, pack_rows=need).pack(
      batch).num_rows == need                      # resumed: restored rows
  assert rl.Learner(graph, opt, c, pack_rows=4 * need).pack(
      batch).num_rows == 4 * need
  # rl.pack_rows (the main job's SWE-agent RL): the first batch starts at
  # that many rows, without headroom on top; at most the batch's rollouts.
  mid = (need + batch.num_rows) // 2
  assert need < mid < batch.num_rows
  for least, rows in ((mid, mid), (batch.num_rows, batch.num_rows),
                      (4 * batch.num_rows, batch.num_rows), (1, need)):
    fresh = rl.Learner(graph, opt, dataclasses.replace(c, pack_rows=least))
    assert fresh.pack(batch).num_rows == rows == fresh.pack_rows, least


def test_a_refill_round_samples_in_the_steps_shape(setup):
  # A refill's fewer prompts are padded to the step's rows (one sampler
  # compile for the stage, not one per refill size); the padding changes
  # none of the real rows' draws: tokens, routing, kept sets equal, log-probs
  # to float rounding. The main job's path (capacity preset, replay).
  tok, recs, agentic = setup
  cfg, m = _policy(tok)
  sc = rollout.SampleConfig(max_new_tokens=12, temperature=1.0)
  prompts = [data.encode_prompt(tok, r['messages']) + [5 + i]
             for i, r in enumerate(recs[:4])]
  ptoks, plens = rollout.pad_prompts(prompts, 1, tok.pad_id)
  key = jax.random.key(7)
  run = lambda rows: sharding.to_host(rollout.generate_padded(
      m, ptoks, plens, cfg=sc, stop_ids=tok.stop_ids, pad_id=tok.pad_id,
      key=key, record_experts=True, min_rows=rows))
  alone, padded = run(0), run(16)
  assert padded.tokens.shape == alone.tokens.shape == (4, 12)
  for k in ('tokens', 'mask', 'truncated', 'expert_idx', 'kept'):
    np.testing.assert_array_equal(getattr(padded, k), getattr(alone, k), k)
  np.testing.assert_allclose(padded.logprobs, alone.logprobs, atol=1e-6)
  # rl.collect: 4 prompts x 4 a step; the first round's rewards filter one
  # group, so a refill round samples 1 prompt, in the step's shape.
  c = rl.RLConfig(prompts_per_step=4, rollouts_per_prompt=4,
                  max_new_tokens=12, overlong='none', max_refill_rounds=1)
  calls = []

  def rewards(r, _):
    calls.append(len(r))
    out = np.arange(len(r)) % 2
    return np.where(np.arange(len(r)) < 4, 0, out) if len(r) == 16 else out

  before = rollout.trace_count()
  _, stats = rl.collect(m, tok, rl.PromptStream(recs), c, jax.random.key(4),
                        reward_fn=rewards)
  assert calls == [16, 4] and stats['sampled_prompts'] == 5
  assert rollout.trace_count() <= before + 1   # the step's shape, once


def test_packing_is_refused_where_the_loss_is_per_sequence():
  with pytest.raises(ValueError, match='pack_width packs rollouts'):
    rl.RLConfig(algorithm='mopd', pack_width=256)
  with pytest.raises(ValueError, match='pack_width packs rollouts'):
    rl.RLConfig(updates_per_batch=2, pack_width=256)
  with pytest.raises(ValueError, match='pack_width must be >= 0'):
    rl.RLConfig(pack_width=-1)
  with pytest.raises(ValueError, match='only with rl.pack_width'):
    rl.RLConfig(pack_rows=64)
  with pytest.raises(ValueError, match='pack_rows=-1'):
    rl.RLConfig(pack_width=256, pack_rows=-1)


def test_first_update_sizes_the_capacity_with_headroom(setup):
  # The main job's path (capacity dispatch, replayed routing): a stage's
  # first update fits 1 + capacity_headroom times its batch's largest
  # expert load; later updates keep that capacity while their loads fit it
  # (one compile) and add no headroom of their own; a resumed learner
  # (capacity restored from the checkpoint) adds none either.
  tok, recs, agentic = setup
  cfg, m = _policy(tok)
  c = rl.RLConfig(prompts_per_step=8, rollouts_per_prompt=4,
                  max_new_tokens=12, dynamic_filtering=False, overlong='none')
  assert c.capacity_headroom == 0.25
  batch = _batch('grpo', tok, recs, agentic, m, c)
  valid = batch.segment_ids != 0
  exact = model.replay_capacity(batch.expert_idx, valid, 8)
  roomy = model.replay_capacity(batch.expert_idx, valid, 8, headroom=0.25)
  assert roomy > exact
  opt = _optimizer()
  graph, state = train.init_state(m, opt)
  learner = rl.Learner(graph, opt, c)
  state, m1 = learner.step(state, batch)
  assert m1['moe_capacity'] == roomy == learner.capacity
  assert m1['dropped_learner'] == 0.0
  state, m2 = learner.step(state, batch)     # (the step donates its state)
  assert m2['moe_capacity'] == roomy
  resumed = rl.Learner(graph, opt, c, capacity=exact)
  state, m3 = resumed.step(state, batch)
  assert m3['moe_capacity'] == exact
  exact_only = rl.Learner(graph, opt, dataclasses.replace(
      c, capacity_headroom=0.0))
  assert exact_only.step(state, batch)[1]['moe_capacity'] == exact
  with pytest.raises(ValueError, match='capacity_headroom must be >= 0'):
    dataclasses.replace(c, capacity_headroom=-0.1)


def test_micro_batches_must_split_the_batch(setup):
  tok, recs, agentic = setup
  cfg, m = _policy(tok)
  c = rl.RLConfig(prompts_per_step=2, rollouts_per_prompt=3, max_new_tokens=4,
                  dynamic_filtering=False, micro_batches=4)
  batch = _batch('grpo', tok, recs, agentic, m, c)
  graph, state = train.init_state(m, _optimizer())
  with pytest.raises(ValueError, match='micro_batches=4 must split'):
    rl.Learner(graph, _optimizer(), c).step(state, batch)
  # The stage asks before any work, with the step's row count.
  with pytest.raises(ValueError, match='micro_batches=4 must split'):
    rl.Learner(graph, _optimizer(), c).check_rows(6)
  with pytest.raises(ValueError, match="6 rollouts .* over the learner's 4 "
                     'devices on its batch axes: make the rollouts a '
                     'multiple of 4'):
    rl.Learner(graph, _optimizer(), c, rows_multiple=4).check_rows(6)
  packed = dataclasses.replace(c, micro_batches=2, pack_width=64)
  with pytest.raises(ValueError, match=r'2 devices .* x 2 micro-batches '
                     r'\(packed\): make the rollouts a multiple of 4'):
    rl.Learner(graph, _optimizer(), packed, rows_multiple=2).check_rows(6)
  rl.Learner(graph, _optimizer(), dataclasses.replace(c, micro_batches=3),
             rows_multiple=2).check_rows(6)


def test_micro_batch_rows_are_strided():
  # Rows i, i + k, ...: on a batch sharded by rows, each micro-batch stays
  # spread over every device.
  rows = train.micro_batch_rows(8, 2)
  np.testing.assert_array_equal(rows[0], [0, 2, 4, 6])
  x = jnp.arange(8)
  np.testing.assert_array_equal(train.split_micro_batches(x, 2)[1],
                                [1, 3, 5, 7])


@pytest.mark.parametrize('algorithm', ['grpo', pytest.param(
    'mopd', marks=pytest.mark.slow)])
def test_a_step_moves_data_once_each_way(setup, monkeypatch, algorithm):
  # Under a transfer guard that refuses every implicit transfer, one step
  # (collect, then the learner's step with a KL reference or a teacher)
  # makes exactly these explicit ones: the prompts in, the rollouts out,
  # the batch in, the metrics out.
  tok, recs, agentic = setup
  cfg, m = _policy(tok)
  opt = _optimizer()
  graph, state = train.init_state(m, opt)
  c = rl.RLConfig(algorithm=algorithm, prompts_per_step=4,
                  rollouts_per_prompt=4, max_new_tokens=8,
                  dynamic_filtering=False,
                  kl_coef=0.1 if algorithm == 'grpo' else 0.0)
  frozen = rl.freeze(_policy(tok, seed=1)[1])
  learner = rl.Learner(graph, opt, c,
                       reference=frozen if algorithm == 'grpo' else None,
                       teachers={'toy': frozen} if algorithm == 'mopd' else None)
  reward = lambda r, _: np.arange(len(r), dtype=np.float32) % 3
  key = jax.random.key(0)
  for _ in range(2):   # the second step: everything compiled
    policy = nnx.merge(graph, state.params, state.rest)
    moves = []
    put, get = jax.device_put, jax.device_get
    monkeypatch.setattr(jax, 'device_put',
                        lambda x, *a, **kw: moves.append('in') or put(
                            x, *a, **kw))
    monkeypatch.setattr(jax, 'device_get',
                        lambda x: moves.append('out') or get(x))
    with jax.transfer_guard('disallow'):
      batch, _ = rl.collect(policy, tok, rl.PromptStream(recs), c, key,
                            reward_fn=reward)
      state, metrics = learner.step(state, batch)
    monkeypatch.undo()
    assert moves == ['in', 'out', 'in', 'out'], moves
    assert metrics['sampler_mismatch_max'] <= 1e-5


# CI; the default suite runs the correction's own tests (test_losses); the main
# job samples in fp32.
@pytest.mark.slow
def test_weight_sync_bf16_sampler_is_corrected_in_the_loss(setup):
  # rl.sampler_dtype='bfloat16': the sampler runs a bf16 copy of the fp32
  # learner (one jitted cast, shardings kept, the learner's state
  # untouched), so its log-probs differ from the learner's, and GRPO's loss
  # weighs each token by the truncated ratio. With the main job's float32
  # the copy on the CPU only splits the layers (the learner's values
  # exactly), and the loss is the on-policy one, unweighted.
  tok, recs, _ = setup
  _, m = _policy(tok)
  opt = _optimizer()
  graph, state = train.init_state(m, opt)
  kw = dict(prompts_per_step=8, rollouts_per_prompt=4, max_new_tokens=12,
            dynamic_filtering=False, overlong='none')
  same = rl.SamplerWeights(graph, 'float32')
  assert same.copies(state) and model.layered(m.cfg)
  own = nnx.state(same.model(state), nnx.Param)
  assert model.has_layer_arrays(own)
  for a, b in zip(jax.tree.leaves(own),
                  jax.tree.leaves(model.split_layers(state.params)),
                  strict=True):
    assert a.dtype == b.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert rl.Learner(graph, opt, rl.RLConfig(**kw)).correction(state) == 'none'
  # The same weights computed in bf16 (as at scale): the sampler's programs
  # and the learner's round apart (0.0075 mean |d log p| on an H200), so the
  # loss corrects even without a copy.
  g16, s16 = train.init_state(model.Transformer(
      model.small(vocab_size=tok.vocab_size, dtype='bfloat16'),
      rngs=nnx.Rngs(0)), opt)
  assert rl.Learner(g16, opt, rl.RLConfig(**kw)).correction(s16) == 'tis'

  sync = rl.SamplerWeights(graph, 'bfloat16')
  assert sync.copies(state)
  before = jax.tree.map(np.asarray, state.params)
  sampler = sync.model(state)
  sp = jax.tree.leaves(nnx.state(sampler, nnx.Param))
  # The copy holds each layer's weights as arrays of their own.
  assert model.has_layer_arrays(nnx.state(sampler, nnx.Param))
  lp = jax.tree.leaves(model.split_layers(state.params))
  assert len(sp) == len(lp)
  # bf16, but for the router, which the model holds in fp32 at any dtype.
  routers = {id(x) for x in jax.tree.leaves(
      nnx.state(sampler, lambda path, _: 'router_de' in path))}
  assert {x.dtype for x in sp if id(x) not in routers} == {
      jnp.dtype('bfloat16')}
  assert routers and {x.dtype for x in sp if id(x) in routers} == {
      jnp.dtype('float32')}
  assert {x.dtype for x in lp} == {jnp.dtype('float32')}
  for a, b in zip(sp, lp):
    assert a.sharding.is_equivalent_to(b.sharding, a.ndim)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b).astype(a.dtype))
  assert sync.last_sync_s > 0
  c = rl.RLConfig(sampler_dtype='bfloat16', **kw)
  batch = rl.collect(sampler, tok, rl.PromptStream(recs), c,
                     jax.random.key(1),
                     reward_fn=lambda r, _: np.arange(len(r)) % 3)[0]
  out = {}
  for corr in ('tis', 'none'):
    learner = rl.Learner(graph, opt, dataclasses.replace(
        c, behaviour_correction=corr))
    assert learner.correction(state) == corr
    _, s0 = train.init_state(_policy(tok)[1], opt)
    out[corr] = learner.step(s0, batch)[1]
  tis, none = out['tis'], out['none']
  # bf16 weights move the log-probs well beyond float rounding.
  assert tis['sampler_mismatch_max'] > 1e-3
  assert 0 < tis['is_weight_mean'] and tis['is_weight_mean'] != 1.0
  assert 'is_weight_mean' not in none
  assert tis['loss'] != none['loss']
  # The learner's own weights were not touched by the sync.
  jax.tree.map(np.testing.assert_array_equal, before,
               jax.tree.map(np.asarray, state.params))


@pytest.mark.slow   # rl.sample_slots is 0 in the main job; CI runs it
def test_continuous_sample_slots_collect_what_a_key_a_rollout_draws(setup):
  # rl.sample_slots: a single-turn step's rollouts decode a few rows at a
  # time (continuous batching; rl.prefill_rows: 2 rows a prefill), a key a
  # rollout. The batch is the fixed batch's with the same keys
  # (`generate_padded` given a key a row), row for row: tokens, masks,
  # routing, log-probs.
  tok, recs, _ = setup
  _, policy = _policy(tok)
  with pytest.raises(ValueError, match='sample_slots'):
    rl.RLConfig(sample_slots=-1)
  with pytest.raises(ValueError, match='prefill_rows'):
    rl.RLConfig(prefill_rows=-1)
  recs = [dict(r, messages=[{'role': 'user', 'content': c}])
          for r, c in zip(recs, ['write letters', 'a b', 'abc cab bca',
                                 'aaa bbb ccc d e'] * 2)]
  c = rl.RLConfig(prompts_per_step=4, rollouts_per_prompt=4,
                  max_new_tokens=12, dynamic_filtering=False,
                  overlong='none', sample_slots=5, prefill_rows=2)
  key = jax.random.key(4)
  batch, stats = rl.collect(policy, tok, rl.PromptStream(recs), c, key,
                            reward_fn=lambda r, _: np.arange(len(r)) % 3)
  # collect's first round samples with split(key)[1], a key a rollout.
  stream = rl.PromptStream(recs)
  rows = [r for r in stream.take(4) for _ in range(4)]
  ptoks, plens = rollout.pad_prompts(
      [data.encode_prompt(tok, r['messages']) for r in rows], 1, tok.pad_id,
      width=stream.prompt_width(tok))
  sub = jax.random.split(key)[1]
  ro = rollout.generate_padded(policy, ptoks, plens, cfg=c.sample_config,
                               stop_ids=tok.stop_ids, pad_id=tok.pad_id,
                               key=jax.random.split(sub, 16),
                               record_experts=True)
  want = rl.from_rollout(ptoks, plens, sharding.to_host(ro),
                         np.arange(16) % 3)
  lengths = np.asarray(ro.mask).sum(1)
  assert lengths.min() < lengths.max(), lengths   # rows end apart
  for name in ('inputs', 'targets', 'mask', 'segment_ids', 'positions'):
    np.testing.assert_array_equal(getattr(batch, name), getattr(want, name),
                                  err_msg=name)
  # The routing of every position the learner's loss reads: a row's last
  # token (its stop token) is never fed to the continuous sampler (zeros),
  # while the fixed batch feeds it as long as another row runs; no target
  # or later position reads it, and past it is padding (segment 0).
  read = want.segment_ids > 0
  read[np.arange(len(read)), read.shape[1] - 1 - np.argmax(read[:, ::-1], 1)] = False
  np.testing.assert_array_equal(batch.expert_idx[read], want.expert_idx[read])
  np.testing.assert_allclose(batch.sampler_logp, want.sampler_logp, atol=1e-5)
