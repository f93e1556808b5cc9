"""Hybrid (Mamba-2 + attention + MoE) models on every path the attention models have.

Most tests use the hybrid main job's model (`small_hybrid` as the cascade's
`--config.model=hybrid` builds it: vocab 1024, pattern 'ME*E', capacity
dispatch); the SSD itself is held to the token-by-token recurrence.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cascade_jax import data
from cascade_jax import model
from cascade_jax import ops
from cascade_jax import rl
from cascade_jax import rollout
from cascade_jax import sharding
from cascade_jax import train


def _main_job_cfg(**kw):
  return model.small_hybrid(**{'vocab_size': 1024, 'pattern': 'ME*E', **kw})


def _tokens(b, t, seed=1, vocab=1024):
  return jax.random.randint(jax.random.key(seed), (b, t), 1, vocab)


def _jit(m):
  """The model's forward, jitted (array arguments only)."""
  graph, state = nnx.split(m)
  f = jax.jit(lambda state, toks, kw: nnx.merge(graph, state)(toks, **kw))
  return lambda toks, **kw: f(state, toks, kw)


def _cached(m):
  """The one forward over a KV cache (the sampler's), jitted."""
  graph, state = nnx.split(m)

  def fwd(state, toks, pos, seg, cache):
    mm = nnx.merge(graph, state)
    return rollout.forward(mm, toks, positions_bt=pos, segment_ids_bt=seg,
                           cache=cache, layouts=rollout.model_decode_weights(
                               mm, toks.shape[0]))
  f = jax.jit(fwd)
  return lambda toks, pos, seg, cache: f(state, toks, pos, seg, cache)


def _recurrence(x, dt, a, b, c, d, reset, init):
  s, ys = init, []
  for t in range(x.shape[1]):
    y, s = ops.ssd_step(s, x[:, t], dt[:, t], a, b[:, t], c[:, t], d,
                        reset[:, t])
    ys.append(y)
  return jnp.stack(ys, 1), s


@pytest.mark.parametrize('chunk', [
    pytest.param(1, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow),
    7, pytest.param(32, marks=pytest.mark.slow)])
def test_chunked_ssd_equals_the_recurrence_with_resets(chunk):
  k = jax.random.split(jax.random.key(0), 7)
  b, t, h, p, g, n = 2, 21, 4, 3, 2, 5
  x = jax.random.normal(k[0], (b, t, h, p))
  dt = jax.nn.softplus(jax.random.normal(k[1], (b, t, h)))
  a = -jnp.exp(jax.random.normal(k[2], (h,)))
  bm, cm = (jax.random.normal(k[i], (b, t, g, n)) for i in (3, 4))
  d = jax.random.normal(k[5], (h,))
  reset = jnp.zeros((b, t), bool).at[0, 7].set(True).at[1, 0].set(True)
  reset = reset.at[1, 16].set(True)
  init = jax.random.normal(k[6], (b, h, p, n))
  want_y, want_s = _recurrence(x, dt, a, bm, cm, d, reset, init)
  y, s = ops.ssd(x, dt, a, bm, cm, d, chunk=chunk, reset_bt=reset,
                 initial_state=init)
  np.testing.assert_allclose(y, want_y, atol=2e-5)
  np.testing.assert_allclose(s, want_s, atol=2e-5)


def test_long_decays_stay_exact():
  # Large dt * |A| over a long chunk: a cumsum-difference segment sum loses
  # the small decays next to huge ones; the masked form does not.
  b, t, h, p, g, n = 1, 64, 2, 2, 1, 2
  k = jax.random.split(jax.random.key(1), 4)
  x = jax.random.normal(k[0], (b, t, h, p))
  dt = jnp.full((b, t, h), 3.0).at[:, :, 1].set(1e-3)
  a = jnp.array([-20.0, -1.0])
  bm, cm = (jax.random.normal(k[i], (b, t, g, n)) for i in (1, 2))
  d = jnp.zeros((h,))
  reset = jnp.zeros((b, t), bool)
  init = jnp.zeros((b, h, p, n))
  want, _ = _recurrence(x, dt, a, bm, cm, d, reset, init)
  got, _ = ops.ssd(x, dt, a, bm, cm, d, chunk=64)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


# CI; the default suite runs packing on the main job's model (test_model).
@pytest.mark.slow
def test_packed_equals_unpacked():
  cfg = _main_job_cfg().replace_moe(dispatch='dropless')
  m = _jit(model.Transformer(cfg, rngs=nnx.Rngs(0)))
  a, b = _tokens(1, 37, seed=2)[0], _tokens(1, 30, seed=3)[0]
  packed = jnp.concatenate([a, b, jnp.zeros(3, jnp.int32)])[None]
  seg = jnp.asarray([[1] * 37 + [2] * 30 + [0] * 3])
  pos = jnp.asarray([list(range(37)) + list(range(30)) + [0] * 3])
  lp, _ = m(packed, positions_bt=pos, segment_ids_bt=seg)
  la, _ = m(a[None])
  lb, _ = m(b[None])
  np.testing.assert_allclose(lp[0, :37], la[0], atol=1e-5)
  np.testing.assert_allclose(lp[0, 37:67], lb[0], atol=1e-5)
  assert np.isfinite(np.asarray(lp)).all()


def test_left_padded_prefill_then_decode_equals_each_row_alone():
  cfg = _main_job_cfg().replace_moe(dispatch='dropless')
  plain = model.Transformer(cfg, rngs=nnx.Rngs(0))
  m, cached = _jit(plain), _cached(plain)
  toks = _tokens(2, 45)
  # Row 0: a 30-token prompt left-padded to 40; row 1: 40 tokens.
  seg = jnp.asarray([[0] * 10 + [1] * 30, [1] * 40])
  pos = jnp.asarray([[0] * 10 + list(range(30)), list(range(40))])
  cache = model.init_cache(cfg, 2, 48)
  _, cache, _ = cached(toks[:, :40], pos, seg, cache)
  got = []
  for i in range(40, 45):
    lg, cache, _ = cached(toks[:, i:i + 1], jnp.asarray([[i - 10], [i]]),
                          jnp.ones((2, 1), jnp.int32), cache)
    got.append(lg[:, 0])
  got = jnp.stack(got, 1)
  alone0, _ = m(toks[:1, 10:45])
  alone1, _ = m(toks[1:, :45])
  np.testing.assert_allclose(got[0], alone0[0, -5:], atol=1e-5)
  np.testing.assert_allclose(got[1], alone1[0, -5:], atol=1e-5)


@pytest.mark.slow   # the RL-loop test below covers it in the default suite
def test_sampler_logprobs_equal_a_full_forward_pass():
  cfg = _main_job_cfg()
  m = model.Transformer(cfg, rngs=nnx.Rngs(0))
  prompts = [list(range(5, 5 + n)) for n in (3, 40, 17, 9)]
  sc = rollout.SampleConfig(max_new_tokens=20, temperature=1.0,
                            prompt_bucket=16)
  out = rollout.generate(m, prompts, cfg=sc, stop_ids=-1,
                         key=jax.random.key(0), record_experts=True)
  fwd = _jit(model.Transformer(cfg.replace_moe(dispatch='dropless'),
                               rngs=nnx.Rngs(0)))
  for i, p in enumerate(prompts):
    seq = jnp.asarray([p + list(np.asarray(out.tokens[i]))])
    logits, _ = fwd(seq)
    lp = jax.nn.log_softmax(logits[0, len(p) - 1:-1])
    want = jnp.take_along_axis(lp, seq[0, len(p):, None], -1)[:, 0]
    np.testing.assert_allclose(out.logprobs[i], want, atol=2e-5)


@pytest.fixture(scope='module')
def setup():
  tok = data.train_tokenizer(['aaa bbb ccc', 'abc cab bca', 'write letters',
                              'a b c d e'] * 20, 160)
  recs = [dict(id=str(i), domain='toy',
               messages=[{'role': 'user', 'content': 'write letters'}])
          for i in range(8)]
  return tok, recs


# CI (the main job's model: tests/test_rl.py).
@pytest.mark.slow
@pytest.mark.parametrize('top_p', [1.0, 0.95])
def test_learner_equals_sampler_in_the_rl_loop(setup, top_p):
  # The on-policy property on the hybrid main job's model, capacity
  # dispatch, routing replayed: the RL loop's own collect and update.
  tok, recs = setup
  cfg = model.small_hybrid(vocab_size=tok.vocab_size, pattern='ME*E')
  assert cfg.moe.dispatch == 'capacity'
  m = model.Transformer(cfg, rngs=nnx.Rngs(0))
  opt = train.make_optimizer(train.OptimConfig(
      lr=1e-3, warmup_steps=1, schedule='constant', weight_decay=0.0))
  graph, state = train.init_state(m, opt)
  c = rl.RLConfig(prompts_per_step=8, rollouts_per_prompt=8,
                  max_new_tokens=16, top_p=top_p, dynamic_filtering=False,
                  overlong='none')
  batch, _ = rl.collect(
      nnx.merge(graph, state.params, state.rest), tok, rl.PromptStream(recs),
      c, jax.random.key(0), reward_fn=lambda r, _: np.arange(len(r)) % 2)
  _, metrics = rl.Learner(graph, opt, c).step(state, batch)
  assert metrics['sampler_mismatch_max'] <= 1e-5, metrics
  assert metrics['dropped_learner'] == 0.0


@pytest.mark.parametrize('scan,remat', [
    pytest.param(True, 'full', marks=pytest.mark.slow), pytest.param(False, 'save_dots', marks=pytest.mark.slow)])
def test_scan_and_remat_equal_the_plain_forward_and_grads(scan, remat):
  toks = _tokens(2, 40)

  def run(cfg):
    m = model.Transformer(cfg, rngs=nnx.Rngs(0))
    graph, params, rest = nnx.split(m, nnx.Param, ...)

    def loss(params):
      logits, info = nnx.merge(graph, params, rest)(toks)
      lp = jax.nn.log_softmax(logits[:, :-1])
      return -jnp.mean(jnp.take_along_axis(lp, toks[:, 1:, None], -1)), logits
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

  cfg = _main_job_cfg(pattern='ME*E' * 2).replace_moe(dispatch='dropless')
  (v0, l0), g0 = run(cfg)
  (v1, l1), g1 = run(cfg.replace(scan_layers=scan, remat=remat))
  np.testing.assert_allclose(v1, v0, rtol=1e-6)
  np.testing.assert_allclose(l1, l0, atol=2e-5)
  chex.assert_trees_all_close(g1, g0, atol=2e-6, rtol=1e-4)


# CI; the default suite runs bf16 activations on the main job's model
# (test_model).
@pytest.mark.slow
def test_bf16_activations_keep_the_ssm_state_in_fp32():
  cfg = _main_job_cfg().replace_moe(dispatch='dropless')
  m32 = _jit(model.Transformer(cfg, rngs=nnx.Rngs(0)))
  b16 = model.Transformer(cfg.replace(dtype='bfloat16'), rngs=nnx.Rngs(0))
  m16, cached16 = _jit(b16), _cached(b16)
  toks = _tokens(2, 20)
  cache = model.init_cache(cfg.replace(dtype='bfloat16'), 2, 24)
  assert all(s.ssm.dtype == jnp.float32 for s in cache.mamba)
  ones = jnp.ones((2, 20), jnp.int32)
  _, cache, _ = cached16(toks, jnp.cumsum(ones, 1) - 1, ones, cache)
  assert all(s.ssm.dtype == jnp.float32 for s in cache.mamba)
  assert all(s.conv_x.dtype == jnp.bfloat16 for s in cache.mamba)
  l32, info32 = m32(toks)
  # The fp32 routing replayed (as the learner replays the sampler's): bf16
  # flips ~3% of near-tied choices of this random model otherwise.
  l16, _ = m16(toks, expert_idx=info32['expert_idx'])
  rel = jnp.linalg.norm(l16 - l32) / jnp.linalg.norm(l32)
  assert rel < 0.03, rel


def test_chunk_size_does_not_change_the_function():
  toks = _tokens(2, 50)
  cfg = _main_job_cfg().replace_moe(dispatch='dropless')
  a, _ = _jit(model.Transformer(cfg, rngs=nnx.Rngs(0)))(toks)
  b, _ = _jit(model.Transformer(cfg.replace_mamba(chunk_size=7),
                                rngs=nnx.Rngs(0)))(toks)
  np.testing.assert_allclose(a, b, atol=1e-5)


MESHES = {
    'data8': dict(data=8),
    'data2_expert2_tensor2': dict(data=2, expert=2, tensor=2),
    'fsdp2_tensor4': dict(fsdp=2, tensor=4),   # 2 groups on 4: replicated
}


def _sharded_loss_and_grads(cfg, ctx):
  m = model.Transformer(cfg, rngs=nnx.Rngs(0), ctx=ctx)
  if ctx is not None:
    sharding.shard_model(m, ctx)
  toks = _tokens(8, 20, vocab=cfg.vocab_size)
  graph, params, rest = nnx.split(m, nnx.Param, ...)

  @jax.jit
  def f(params):
    def loss(params):
      logits, _ = nnx.merge(graph, params, rest)(toks)
      lp = jax.nn.log_softmax(logits[:, :-1])
      return -jnp.mean(jnp.take_along_axis(lp, toks[:, 1:, None], -1)), logits
    return jax.value_and_grad(loss, has_aux=True)(params)

  return f(params), params


@pytest.mark.slow   # CI (the main job's model on meshes: test_sharding)
@pytest.mark.parametrize('mesh_name', [
    'data2_expert2_tensor2', 'data8', 'fsdp2_tensor4'])
def test_sharded_forward_and_grads_equal_single_device(mesh_name):
  assert jax.device_count() == 8
  cfg = _main_job_cfg(vocab_size=256).replace_moe(dispatch='dense')
  ((l0, lg0), g0), _ = _sharded_loss_and_grads(cfg, None)
  ctx = sharding.ShardingCtx(sharding.make_mesh(MESHES[mesh_name]))
  ((l1, lg1), g1), params = _sharded_loss_and_grads(cfg, ctx)
  np.testing.assert_allclose(l1, l0, rtol=1e-5)
  np.testing.assert_allclose(lg1, lg0, atol=2e-5)
  chex.assert_trees_all_close(g1, g0, rtol=1e-4, atol=2e-6)
  tensor = MESHES[mesh_name].get('tensor', 1)
  if tensor > 1:  # Mamba heads split over `tensor`; groups only where they divide
    spec = lambda v: v.sharding.spec
    # The first group's first position: Mamba, stacked [repeats, ...].
    layer = params['layers'][0]['blocks'][0]['mixer']
    assert spec(layer['w_x_dhp'])[0] is None    # the 'layers' axis
    assert spec(layer['w_x_dhp'])[2] == 'tensor'
    want_groups = 'tensor' if cfg.mamba.num_groups % tensor == 0 else None
    assert spec(layer['w_b_dgn'])[2] == want_groups


@pytest.mark.slow
def test_sharded_sampler_equals_single_device():
  cfg = _main_job_cfg(vocab_size=256).replace_moe(dispatch='dense')
  prompts = [[5, 6, 7][: 1 + i % 3] + [9] * (i % 2) for i in range(8)]
  sc = rollout.SampleConfig(max_new_tokens=6, temperature=1.0, prompt_bucket=4)
  ref = rollout.generate(model.Transformer(cfg, rngs=nnx.Rngs(0)), prompts,
                         cfg=sc, stop_ids=-1, key=jax.random.key(3))
  ctx = sharding.ShardingCtx(sharding.make_mesh(
      MESHES['data2_expert2_tensor2']))
  m = sharding.shard_model(model.Transformer(cfg, rngs=nnx.Rngs(0), ctx=ctx),
                           ctx)
  out = rollout.generate(m, prompts, cfg=sc, stop_ids=-1, key=jax.random.key(3))
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)


@pytest.mark.parametrize('kw, field', [
    (dict(pattern='M*X'), 'pattern'),
    (dict(mamba=None), 'mamba'),
])
def test_config_errors_name_the_cause(kw, field):
  with pytest.raises(ValueError, match=f'^{field}:'):
    _main_job_cfg(**kw)


@pytest.mark.parametrize('kw, field', [
    (dict(num_heads=6, num_groups=4), 'mamba.num_groups'),
    (dict(chunk_size=0), 'mamba.chunk_size'),
    (dict(conv_kernel=0), 'mamba.conv_kernel'),
])
def test_mamba_config_errors_name_the_field(kw, field):
  with pytest.raises(ValueError, match=f'^{field}:'):
    model.MambaConfig(**{**dict(num_heads=8, head_dim=4, state_dim=4,
                                num_groups=2), **kw})


def test_nemotron3_nano_counts_as_published():
  # 31.6B in total, 3.2B active per token without the input embedding.
  c = model.count_params(model.nemotron3_nano_30b_a3b())
  assert abs(c.total / 31.6e9 - 1) < 0.01, c
  assert abs((c.active - c.embedding) / 3.2e9 - 1) < 0.01, c
  assert model.nemotron3_nano_30b_a3b().pattern.count('M') == 23
