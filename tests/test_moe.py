"""MoE: routing, the three dispatch paths, capacity drops, aux losses, bias balancing."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cascade_jax import model
from cascade_jax import rollout
from cascade_jax.model import _dispatch
from cascade_jax.model import _moe

from _jit import call


def _moe_cfg(**kw):
  moe = dict(num_experts=4, top_k=2, expert_dim=16, dispatch='dense')
  moe.update(kw)
  return model.tiny(pattern='E', moe=model.MoEConfig(**moe))


def _x(b=2, t=8, d=16, seed=0):
  return jax.random.normal(jax.random.key(seed), (b, t, d))


def _decode_moe(m, x_btd, dw, valid_bt=None, replay=None):
  """The MoE layer as the sampler runs it (`rollout.moe_step`), [B, T, D]."""
  b, t, d = x_btd.shape
  y, _ = rollout.moe_step(
      m, x_btd.reshape(b * t, d), dw,
      None if valid_bt is None else valid_bt.reshape(b * t),
      None if replay is None else replay.reshape(b * t, -1))
  return y.reshape(b, t, d)


def test_route_by_hand_softmax():
  # logits [0, ln 2, ln 3, ln 4] -> softmax [.1, .2, .3, .4]; top-2 = {3, 2};
  # renormalised: [.4, .3] / .7.
  logits = jnp.log(jnp.array([[1.0, 2.0, 3.0, 4.0]]))
  scores, idx, w = model.route(logits, score_fn='softmax', top_k=2,
                               renormalize=True, routed_scale=1.0)
  np.testing.assert_allclose(scores, [[.1, .2, .3, .4]], rtol=1e-6)
  np.testing.assert_array_equal(idx, [[3, 2]])
  np.testing.assert_allclose(w, [[4 / 7, 3 / 7]], rtol=1e-6)


def test_route_bias_changes_choice_not_weights():
  # sigmoid(0) = .5, sigmoid(ln 3) = .75. The bias pushes expert 0 into the
  # top-1, but its gate weight is its unbiased score .5 (x 2.5 scale).
  logits = jnp.array([[0.0, jnp.log(3.0)]])
  _, idx, w = model.route(logits, score_fn='sigmoid', top_k=1,
                          renormalize=False, routed_scale=2.5,
                          bias_e=jnp.array([1.0, 0.0]))
  np.testing.assert_array_equal(idx, [[0]])
  np.testing.assert_allclose(w, [[1.25]], rtol=1e-6)


def test_capacity_slots_by_hand():
  # 3 tokens, top-2, 2 experts, capacity 2. Choice-major priority:
  # first choices t0->e0, t1->e0, t2->e1; then second choices t0->e1,
  # t1->e1 (dropped: e1 is full), t2->e0 (dropped: e0 is full).
  idx = jnp.array([[0, 1], [0, 1], [1, 0]])
  slot, keep = model.capacity_slots(idx, num_experts=2, cap=2)
  np.testing.assert_array_equal(keep, [[1, 1], [1, 0], [1, 0]])
  np.testing.assert_array_equal(slot, [[0, 3], [1, 4], [2, 4]])
  # t0 is padding: it takes no slot, so t1's and t2's second choices fit.
  slot, keep = model.capacity_slots(idx, num_experts=2, cap=2,
                                    valid_n=jnp.array([False, True, True]))
  np.testing.assert_array_equal(keep, [[0, 0], [1, 1], [1, 1]])
  np.testing.assert_array_equal(slot, [[4, 4], [0, 3], [2, 1]])


@pytest.mark.parametrize('score_fn', ['softmax', 'sigmoid'])
@pytest.mark.parametrize('activation', ['swiglu', 'relu2'])
@pytest.mark.parametrize('dispatch', ['ragged', 'capacity', 'dropless'])
def test_dispatch_paths_agree_with_dense_when_nothing_dropped(
    score_fn, activation, dispatch):
  # capacity_factor = E / k makes C = N, so no expert can overflow.
  kw = dict(score_fn=score_fn, activation=activation, capacity_factor=2.0,
            num_shared_experts=1, shared_expert_dim=8)
  ref = model.MoE(_moe_cfg(**kw), rngs=nnx.Rngs(0))
  alt = model.MoE(_moe_cfg(dispatch=dispatch, **kw), rngs=nnx.Rngs(0))
  x = _x()

  def loss(m, x):
    y, info = m(x)
    return jnp.sum(jnp.sin(y)), info

  (l0, i0), (g0, gx0) = nnx.value_and_grad(loss, argnums=(0, 1),
                                           has_aux=True)(ref, x)
  (l1, i1), (g1, gx1) = nnx.value_and_grad(loss, argnums=(0, 1),
                                           has_aux=True)(alt, x)
  assert float(i1['dropped']) == 0.0
  np.testing.assert_allclose(l1, l0, rtol=1e-5)
  np.testing.assert_allclose(gx1, gx0, atol=1e-5)
  chex.assert_trees_all_close(nnx.state(g1, nnx.Param),
                              nnx.state(g0, nnx.Param), atol=1e-5)


@pytest.mark.parametrize('activation', ['swiglu', 'relu2'])
@pytest.mark.parametrize('layout_tokens, tokens', [
    (1, 1), (4, 4),   # per-expert layout: the chosen experts only
    (1, 12),          # per-expert layout for a prefill of 12 tokens
    (5, 5), (5, 16),  # flat layout
])
def test_decode_path_equals_dense(activation, layout_tokens, tokens):
  cfg = _moe_cfg(num_experts=8, activation=activation, num_shared_experts=1,
                 shared_expert_dim=8)
  m = model.MoE(cfg, rngs=nnx.Rngs(0))
  # XLA's layouts here; the CPU kernel's path is in test_kernels.py.
  dw = rollout.decode_weights(m.expert_weights(jnp.float32), layout_tokens, 2,
                              act=activation, use_kernel=False)
  assert (dw.per_expert is not None) == (layout_tokens * 2 <= 8)
  x = _x(b=1, t=tokens, seed=tokens)
  ref, _ = m(x, with_stats=False)
  y = jax.jit(lambda x, dw: _decode_moe(m, x, dw))(x, dw)
  np.testing.assert_allclose(y, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('overflow', [False, True])
def test_decode_path_prefill_blocks_equal_dense(overflow):
  # A prefill's many tokens go through per-expert capacity blocks, or, when
  # some expert gets more than its capacity, the flat dense path: exact
  # either way (padding tokens, valid = False, take no block row).
  cfg = _moe_cfg(num_experts=8)
  m = model.MoE(cfg, rngs=nnx.Rngs(0))
  n = rollout.PREFILL_ROWS_PER_EXPERT * 8 // 2 + 8
  x = _x(b=1, t=n, seed=3)
  valid = jnp.arange(n)[None] >= 5                    # 5 padding tokens
  replay = None
  if overflow:  # expert 0 chosen by every token: past any capacity
    replay = jnp.stack([jnp.zeros((1, n), jnp.int32),
                        1 + jnp.arange(n)[None] % 7], -1)
  ref, _ = m(x, valid_bt=valid, expert_idx_btk=replay, with_stats=False)
  dw = rollout.decode_weights(m.expert_weights(jnp.float32), 16, 2,
                              act='swiglu', use_kernel=False)
  assert dw.flat is not None
  y = jax.jit(lambda x, dw: _decode_moe(m, x, dw, valid, replay))(x, dw)
  np.testing.assert_allclose(y[valid], ref[valid], atol=1e-5, rtol=1e-5)


def test_capacity_drops_are_counted_and_zeroed():
  # Route all 8 tokens to expert 0 by replay: with capacity factor 1,
  # C = N k / E = 8 * 1 / 4 = 2 fit, 6 of 8 are dropped.
  cfg = _moe_cfg(dispatch='capacity', capacity_factor=1.0, top_k=1)
  m = model.MoE(cfg, rngs=nnx.Rngs(0))
  x = _x(b=1, t=8)
  replay = jnp.zeros((1, 8, 1), jnp.int32)
  y, info = m(x, expert_idx_btk=replay)
  assert float(info['dropped']) == pytest.approx(0.75)
  ref, _ = model.MoE(cfg.replace_moe(dispatch='dense'), rngs=nnx.Rngs(0))(
      x, expert_idx_btk=replay)
  np.testing.assert_allclose(y[0, :2], ref[0, :2], atol=1e-5)
  np.testing.assert_array_equal(y[0, 2:], 0.0)  # dropped tokens: no output


@pytest.mark.parametrize('capacity', [None, 1, 3])
def test_dropless_equals_dense_forward_and_grads_even_past_capacity(capacity):
  # 16 tokens, top-2 of 4 experts: a mean load of 8 pairs per expert. With
  # 1 or 3 slots every expert overflows, and `dropless` must fall back to
  # dense (where `capacity` would drop); with None (twice the mean load)
  # it runs the blocks. Either way nothing drops, forward or backward.
  kw = dict(score_fn='sigmoid', use_expert_bias=True, num_shared_experts=1,
            shared_expert_dim=8)
  ref = model.MoE(_moe_cfg(**kw), rngs=nnx.Rngs(0))
  alt = model.MoE(_moe_cfg(dispatch='dropless', **kw), rngs=nnx.Rngs(0))
  x = _x()

  def loss(m, x):
    y, info = m(x, capacity=capacity)
    return jnp.sum(jnp.sin(y)), info

  grad = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)
  (l0, _), (g0, gx0) = grad(ref, x)
  (l1, i1), (g1, gx1) = grad(alt, x)
  assert float(i1['dropped']) == 0.0
  np.testing.assert_allclose(l1, l0, rtol=1e-5)
  np.testing.assert_allclose(gx1, gx0, atol=1e-5)
  chex.assert_trees_all_close(nnx.state(g1, nnx.Param),
                              nnx.state(g0, nnx.Param), atol=1e-5)
  if capacity:   # the same capacity without the fallback drops tokens
    _, info = model.MoE(_moe_cfg(dispatch='capacity', **kw),
                        rngs=nnx.Rngs(0))(x, capacity=capacity)
    assert float(info['dropped']) > 0.3


def test_replay_capacity_by_hand_and_never_drops():
  # Token 3 is padding: its pairs do not count. Layer 0: expert 1 gets 3
  # real pairs; layer 1: expert 2 gets 5 (6 tokens less the padding).
  # Capacity = 5 (no rounding below 8).
  idx = np.zeros((1, 6, 2, 1), np.int32)     # [B, T, L_moe, k]
  idx[0, :, 0, 0] = [1, 1, 1, 1, 0, 3]
  idx[0, :, 1, 0] = 2
  valid = np.array([[True, True, True, False, True, True]])
  assert model.replay_capacity(idx, valid, 4) == 5
  # Rounded up to a quarter of the power of two below: 9 -> 10, 17 -> 20,
  # 100 -> 112 (at most 25 % unused slots, a few shapes per run).
  for load, want in [(9, 10), (16, 16), (17, 20), (100, 112)]:
    e = np.zeros((1, load, 1, 1), np.int32)
    assert model.replay_capacity(e, np.ones((1, load), bool), 4) == want
  # With headroom: the load times 1 + headroom, then rounded: 9 * 1.25 ->
  # 12, 100 * 1.25 -> 125 -> 128, 16 * 1.5 -> 24.
  for load, h, want in [(9, 0.25, 12), (100, 0.25, 128), (16, 0.5, 24)]:
    e = np.zeros((1, load, 1, 1), np.int32)
    assert model.replay_capacity(e, np.ones((1, load), bool), 4,
                                 headroom=h) == want
  # The main job's preset with a skewed expert bias: routing it and
  # replaying it at that capacity drops nothing.
  cfg = model.small(vocab_size=64)
  m = model.Transformer(cfg, rngs=nnx.Rngs(0))
  m.set_expert_biases(np.stack([
      np.random.RandomState(i).uniform(-0.1, 0.1, 8)
      for i in range(m.cfg.pattern.count('E'))]))
  toks = jax.random.randint(jax.random.key(0), (8, 24), 0, 64)
  _, info = call(m, toks)
  assert float(info['router']['dropped'].max()) > 0   # capacity 1.25 drops
  kw = model.exact_dispatch(cfg, np.asarray(info['expert_idx']),
                            np.ones((8, 24), bool))
  assert kw['moe_dispatch'] == 'capacity'
  _, info2 = call(m, toks, expert_idx=info['expert_idx'], **kw)
  assert float(info2['router']['dropped'].max()) == 0.0
  # Not replayed: dropless; dispatch paths that never drop: as they are.
  assert model.exact_dispatch(cfg) == {'moe_dispatch': 'dropless'}
  assert model.exact_dispatch(cfg.replace_moe(dispatch='ragged')) == {}


def test_router_stats_by_hand():
  # One sequence, 2 tokens, 2 experts, top-1: both tokens pick expert 0.
  # scores (already normalised) [[.75, .25], [.5, .5]].
  # f = E / (k T) * counts = 2/2 * [2, 0] = [2, 0]; p = mean scores = [.625, .375]
  # seq_aux = 2 * .625 = 1.25. load = [1, 0].
  scores = jnp.array([[[.75, .25], [.5, .5]]])
  logits = jnp.log(scores)
  idx = jnp.zeros((1, 2, 1), jnp.int32)
  stats = _moe.router_stats(logits, scores, idx, jnp.ones((1, 2), bool),
                            jnp.ones((1, 2, 1), bool), num_experts=2, top_k=1)
  np.testing.assert_allclose(stats['seq_aux'], 1.25, rtol=1e-6)
  np.testing.assert_allclose(stats['load'], [1.0, 0.0])
  # z = logsumexp(log scores) = log 1 = 0 for both tokens.
  np.testing.assert_allclose(stats['z_loss'], 0.0, atol=1e-6)
  assert float(stats['dropped']) == 0.0


def test_aux_losses_are_weighted_into_aux_loss():
  m = model.MoE(_moe_cfg(seq_aux_loss_coef=0.1, z_loss_coef=0.01),
                rngs=nnx.Rngs(0))
  _, info = m(_x())
  np.testing.assert_allclose(
      info['aux_loss'], 0.1 * info['seq_aux'] + 0.01 * info['z_loss'],
      rtol=1e-6)
  assert float(info['seq_aux']) > 0 and float(info['z_loss']) > 0


def test_expert_bias_is_outside_the_optimizer_and_balances_load():
  cfg = model.tiny(pattern='E', moe=model.MoEConfig(
      num_experts=4, top_k=1, expert_dim=8, score_fn='sigmoid',
      use_expert_bias=True, dispatch='dense'))
  m = model.Transformer(cfg, rngs=nnx.Rngs(0))
  moe = m.layers[0].blocks[0].mixer   # the one MoE layer, stacked [1, ...]
  # Skew the router so expert 0 wins most tokens: give every embedding a
  # shared positive direction and point expert 0's router column along it.
  m.embed_vd[...] = m.embed_vd[...] + 0.5
  moe.router_de[...] = moe.router_de[...].at[:, :, 0].add(0.5)
  assert not any(isinstance(v, _moe.ExpertBias)
                 for v in jax.tree.leaves(nnx.state(m, nnx.Param),
                                          is_leaf=lambda x: isinstance(
                                              x, nnx.Variable)))
  toks = jax.random.randint(jax.random.key(0), (4, 32), 0, 32)

  @nnx.jit
  def step(m, toks):
    _, info = m(toks)
    m.update_expert_biases(info['router']['load'], rate=0.02)
    return info['router']['load'][0]

  first = step(m, toks)
  for _ in range(200):
    last = step(m, toks)
  assert float(first.max()) > 0.5
  assert float(last.max()) < float(first.max()) - 0.2
  bias = m.expert_biases()[0]
  assert float(bias[0]) < 0  # the over-loaded expert was pushed down


def test_update_expert_bias_by_hand():
  # mean load .25: expert 0 over (-rate), 1 and 3 under (+rate), 2 equal (0).
  b = model.update_expert_bias(jnp.zeros(4), jnp.array([.5, .1, .25, .15]), 0.1)
  np.testing.assert_allclose(b, [-.1, .1, 0.0, .1])


def test_gather_rows_backward_is_the_scatter_transpose():
  src = jax.random.normal(jax.random.key(0), (3, 2))
  idx = jnp.array([2, 0, 3, 2])              # row 3 = padding (zeros)
  inv = jnp.array([[1, 4], [4, 4], [0, 3]])  # who reads each source row
  f = lambda s: jnp.sum(jnp.sin(_dispatch._gather_rows(s, idx, inv)))
  g_ref = lambda s: jnp.sum(jnp.sin(
      jnp.concatenate([s, jnp.zeros((1, 2))])[idx]))
  np.testing.assert_allclose(jax.grad(f)(src), jax.grad(g_ref)(src), rtol=1e-6)


@pytest.mark.parametrize('dispatch', ['dense', 'ragged', 'capacity'])
def test_no_retrace_across_calls(dispatch):
  # (chex.assert_max_traces counts per code object, i.e. across the
  # parametrisations of one test, so count by hand.)
  m = model.MoE(_moe_cfg(dispatch=dispatch), rngs=nnx.Rngs(0))
  graph, state = nnx.split(m)
  traces = []

  @jax.jit
  def fwd(state, x):
    traces.append(1)
    return nnx.merge(graph, state)(x)[0]

  for seed in range(3):
    fwd(state, _x(seed=seed))
  assert len(traces) == 1
