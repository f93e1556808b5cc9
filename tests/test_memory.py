"""Memory features, each equal to the plain path: scanned layers, remat,
chunked log-probs, bf16 compute over fp32 master weights, FSDP optimizer state."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cascade_jax import model
from cascade_jax import rl
from cascade_jax import rollout
from cascade_jax import sharding
from cascade_jax import train


def _main_job_cfg(**kw):
  """The main job's model (configs/sft.py: small, vocab 1024, '*E*E',
  capacity dispatch): '*E' repeats twice, so it scans."""
  return model.small(**{'vocab_size': 1024, 'pattern': '*E*E', **kw})


def _tokens(b=4, t=24, vocab=1024, seed=1):
  return jax.random.randint(jax.random.key(seed), (b, t), 0, vocab)


def _loss_and_grads(cfg, toks, seed=0):
  m = model.Transformer(cfg, rngs=nnx.Rngs(seed))
  graph, params, rest = nnx.split(m, nnx.Param, ...)

  def loss(params):
    logits, info = nnx.merge(graph, params, rest)(toks)
    lp = jax.nn.log_softmax(logits[:, :-1])
    nll = -jnp.mean(jnp.take_along_axis(lp, toks[:, 1:, None], -1))
    return nll + info['aux_loss'], (logits, info['expert_idx'])

  (v, aux), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return v, aux, g


@functools.cache
def _plain():
  return _loss_and_grads(_main_job_cfg(), _tokens())


def test_layer_groups_of_patterns():
  cfg = _main_job_cfg()
  assert cfg.layer_groups == (('*E', cfg.num_layers // 2),)
  assert model.qwen3_30b_a3b().layer_groups == (('*E', 48),)
  assert model.tiny().layer_groups == (('*E*-', 1),)  # no repeat: no scan
  assert model.tiny(pattern='EEEE').layer_groups == (('E', 4),)
  # Nemotron-3-Nano: 35 of 52 layers are 5 x MEMEM*E, the rest run unrolled.
  assert model.nemotron3_nano_30b_a3b().layer_groups == (
      ('MEMEM*E', 5), ('MEMEMEM*EMEMEMEME', 1))
  assert model.tiny(pattern='*E*E*-').layer_groups == (('*E', 2), ('*-', 1))
  slots = model.tiny(pattern='*E*E*-').layer_slots
  assert slots == ((0, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1), (1, 0, 0),
                   (1, 1, 0))
  with pytest.raises(ValueError, match='remat'):
    model.tiny(remat='some')
  with pytest.raises(ValueError, match='logits_chunk'):
    model.tiny(logits_chunk=-1)


_SLOW = pytest.mark.slow


# CI: the main job neither scans nor rematerialises (the 30B plans compile
# scan + full remat by default: tests/test_scale.py).
@_SLOW
@pytest.mark.parametrize('scan,remat', [
    (True, 'full'), (True, 'none'), (False, 'full'), (True, 'save_dots'),
    (False, 'save_dots_no_batch')])
def test_scan_and_remat_equal_the_plain_forward_and_grads(scan, remat):
  toks = _tokens()
  v0, (l0, e0), g0 = _plain()
  v1, (l1, e1), g1 = _loss_and_grads(
      _main_job_cfg(scan_layers=scan, remat=remat), toks)
  np.testing.assert_allclose(v1, v0, rtol=1e-6)
  np.testing.assert_allclose(l1, l0, atol=2e-5)
  np.testing.assert_array_equal(e1, e0)    # the same experts, layer by layer
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g1),
                          jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-4,
                               err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
def test_scanned_layers_replay_routing_layer_by_layer():
  cfg = _main_job_cfg(pattern='*E' * 3)
  toks = _tokens(2, 10)
  m = model.Transformer(cfg, rngs=nnx.Rngs(0))
  replay = jax.random.randint(jax.random.key(3), (2, 10, 3, 2), 0, 8)
  want, info = m(toks, expert_idx=replay)
  ms = model.Transformer(cfg.replace(scan_layers=True), rngs=nnx.Rngs(0))
  got, info_s = ms(toks, expert_idx=replay)
  np.testing.assert_array_equal(info_s['expert_idx'], replay)
  np.testing.assert_allclose(got, want, atol=2e-5)
  np.testing.assert_allclose(info_s['router']['load'], info['router']['load'],
                             atol=1e-6)


@pytest.mark.parametrize('chunk', [5, pytest.param(0, marks=_SLOW),
                                   pytest.param(8, marks=_SLOW),
                                   pytest.param(64, marks=_SLOW)])
def test_chunked_token_stats_equal_full_logits(chunk):
  # Top-p as the learner scores it (the sampler's kept-set sizes), entropy,
  # and the gradient through the head: a chunk that does not divide T (5)
  # pads, one larger than T is one chunk.
  b, t, d, v = 3, 16, 8, 50
  ks = jax.random.split(jax.random.key(0), 4)
  hidden = jax.random.normal(ks[0], (b, t, d))
  head = jax.random.normal(ks[1], (d, v))
  targets = jax.random.randint(ks[2], (b, t), 0, v)
  kept = jax.random.randint(ks[3], (b, t), 1, v + 1)
  process = lambda lg, ax: rollout.keep_top_n(lg / 0.7, ax['kept'])

  def f(head, hidden, chunk):
    lp, ent = train.token_stats(lambda h: h @ head, hidden, targets,
                                chunk=chunk, process=process,
                                aux=dict(kept=kept), entropy=True)
    return jnp.sum(lp) + 0.1 * jnp.sum(ent), (lp, ent)

  logits = rollout.keep_top_n((hidden @ head) / 0.7, kept)
  want_lp = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None],
                                -1)[..., 0]
  (_, (lp, ent)), g = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(
      head, hidden, chunk)
  (_, (lp0, ent0)), g0 = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(
      head, hidden, 0)
  np.testing.assert_allclose(lp, want_lp, atol=1e-5)
  np.testing.assert_allclose(ent, ent0, atol=1e-5)
  np.testing.assert_allclose(ent, train.token_entropy(logits), atol=1e-5)
  for a, b_ in zip(g, g0):
    np.testing.assert_allclose(a, b_, atol=1e-5)
  np.testing.assert_allclose(lp, lp0, atol=1e-6)


def test_chunked_logits_never_build_the_full_tensor():
  # The compiled chunked loss+grad holds no [B, T, V] fp32 buffer: its
  # temporaries (about three chunk-sized logits buffers) shrink with the
  # chunk, while the unchunked one needs about three full ones.
  b, t, d, v = 2, 512, 16, 4096
  hidden = jnp.zeros((b, t, d))
  head = jnp.zeros((d, v))
  targets = jnp.zeros((b, t), jnp.int32)

  def temp_bytes(chunk):
    f = jax.jit(jax.grad(lambda h: jnp.sum(train.token_stats(
        lambda x: x @ h, hidden, targets, chunk=chunk, entropy=True)[0])))
    return f.lower(head).compile().memory_analysis().temp_size_in_bytes

  full = b * t * v * 4
  assert temp_bytes(0) >= 2 * full
  assert temp_bytes(64) < full / 2, (temp_bytes(64), full)
  assert temp_bytes(32) < 0.6 * temp_bytes(64)


def _collect_batch(cfg, tok_vocab, seed=0):
  """A rollout batch from the main job's model, with routing replay."""
  from cascade_jax import data   # pylint: disable=g-import-outside-toplevel
  tok = data.train_tokenizer(['aaa bbb ccc', 'abc cab bca', 'write letters',
                              'a b c d e'] * 20, tok_vocab)
  recs = [dict(id=str(i), domain='toy',
               messages=[{'role': 'user', 'content': 'write letters'}])
          for i in range(8)]
  m = model.Transformer(cfg.replace(vocab_size=tok.vocab_size),
                        rngs=nnx.Rngs(seed))
  c = rl.RLConfig(prompts_per_step=4, rollouts_per_prompt=4,
                  max_new_tokens=12, top_p=0.95, dynamic_filtering=False,
                  overlong='none')
  batch, _ = rl.collect(m, tok, rl.PromptStream(recs), c, jax.random.key(0),
                        reward_fn=lambda r, _: np.arange(len(r)) % 3)
  return tok, c, batch


@pytest.mark.slow
def test_rl_update_with_every_memory_feature_equals_the_plain_update():
  cfg = _main_job_cfg()
  tok, c, batch = _collect_batch(cfg, 160)
  opt = train.make_optimizer(train.OptimConfig(
      lr=1e-3, warmup_steps=1, schedule='constant', weight_decay=0.0))
  out = {}
  for name, mcfg in [('plain', cfg), ('memory', cfg.replace(
      scan_layers=True, remat='full', logits_chunk=5))]:
    m = model.Transformer(mcfg.replace(vocab_size=tok.vocab_size),
                          rngs=nnx.Rngs(0))
    graph, state = train.init_state(m, opt)
    out[name] = rl.Learner(graph, opt, c).step(state, batch)
  (s0, m0), (s1, m1) = out['plain'], out['memory']
  assert m0['sampler_mismatch_max'] <= 1e-5 and m1['sampler_mismatch_max'] <= 1e-5
  for k in ('loss', 'entropy', 'grad_norm'):
    np.testing.assert_allclose(m1[k], m0[k], rtol=1e-4, atol=1e-6, err_msg=k)
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s0.params)):
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.slow
def test_bf16_compute_keeps_fp32_master_weights_and_optimizer_state():
  # dtype (activations, matmuls) bf16 over param_dtype fp32: the optimizer
  # updates fp32 weights with fp32 moments; the loss is the fp32 one to
  # bf16 rounding.
  from cascade_jax import sft    # pylint: disable=g-import-outside-toplevel
  toks = np.asarray(_tokens(4, 32))
  batch = dict(inputs=toks[:, :-1], targets=toks[:, 1:],
               positions=np.broadcast_to(np.arange(31), (4, 31)),
               segment_ids=np.ones((4, 31), np.int32),
               mask=np.ones((4, 31), np.int32))
  batch = jax.tree.map(jnp.asarray, batch)
  opt = train.make_optimizer(train.OptimConfig(lr=1e-3, warmup_steps=1))
  res = {}
  for dt in ('float32', 'bfloat16'):
    cfg = _main_job_cfg(dtype=dt, logits_chunk=8, scan_layers=True)
    graph, state = train.init_state(model.Transformer(cfg, rngs=nnx.Rngs(0)),
                                    opt)
    for _ in range(2):
      state, m = sft.train_step(state, batch, graph=graph, opt=opt, accum=1,
                                bias_rate=0.0, n_moe=2)
    res[dt] = (state, m)
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {
        jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(state.opt_state)
            if x.ndim} == {jnp.dtype(jnp.float32)}
  (s32, m32), (s16, m16) = res['float32'], res['bfloat16']
  np.testing.assert_allclose(m16['loss'], m32['loss'], rtol=1e-2)
  for a, b in zip(jax.tree.leaves(s16.params), jax.tree.leaves(s32.params)):
    np.testing.assert_allclose(a, b, atol=5e-3)


def test_optimizer_state_is_sharded_like_the_parameters():
  ctx = sharding.ShardingCtx(sharding.make_mesh(dict(fsdp=4, expert=2)))
  m = model.Transformer(_main_job_cfg(), rngs=nnx.Rngs(0), ctx=ctx)
  sharding.shard_model(m, ctx)
  opt = train.make_optimizer(train.OptimConfig())
  _, state = train.init_state(m, opt)
  by_shape = {}
  for p in jax.tree.leaves(state.params):
    by_shape.setdefault(p.shape, set()).add(p.sharding.spec)
  sharded = 0
  for x in jax.tree.leaves(state.opt_state):
    if x.ndim == 0:
      assert x.sharding.is_fully_replicated
      continue
    assert x.sharding.spec in by_shape[x.shape], (x.shape, x.sharding.spec)
    sharded += any(x.sharding.spec)
  assert sharded > 10
  # Per device, Adam's moments take 1/4 of their full size or less (fsdp 4).
  n_param = sum(p.size for p in jax.tree.leaves(state.params))
  per_dev = sum(x.addressable_shards[0].data.nbytes
                for x in jax.tree.leaves(state.opt_state))
  assert per_dev < 0.5 * 8 * n_param, (per_dev, n_param)


def test_memory_settings_change_no_checkpoint_layout():
  a = nnx.state(model.Transformer(_main_job_cfg(), rngs=nnx.Rngs(0)))
  b = nnx.state(model.Transformer(_main_job_cfg(
      scan_layers=True, remat='full', logits_chunk=16, dtype='bfloat16'),
      rngs=nnx.Rngs(0)))
  assert jax.tree.structure(a.to_pure_dict()) == jax.tree.structure(
      b.to_pure_dict())
  assert dataclasses.replace(_main_job_cfg(), scan_layers=True
                             ).layer_groups == _main_job_cfg().layer_groups


@pytest.mark.slow  # ~23 s, an option off by default: CI runs it
def test_bf16_moments_store_adam_in_half_the_bytes_and_follow_fp32(tmp_path):
  # optim.moment_dtype='bfloat16': Adam's moments stored in bf16 (the same
  # leaves, shapes and shardings, half the bytes), each update computed in
  # fp32 from them; three SFT steps of the main job's model land within
  # bf16 rounding of the fp32 moments' run. A checkpoint written with either
  # restores into the other (cast on restore).
  from cascade_jax import checkpoint  # pylint: disable=g-import-outside-toplevel
  from cascade_jax import sft         # pylint: disable=g-import-outside-toplevel
  toks = np.asarray(_tokens(8, 33))   # 8 x 32 tokens: whole shards
  batch = jax.tree.map(jnp.asarray, dict(
      inputs=toks[:, :-1], targets=toks[:, 1:],
      positions=np.broadcast_to(np.arange(32), (8, 32)),
      segment_ids=np.ones((8, 32), np.int32), mask=np.ones((8, 32), np.int32)))
  ctx = sharding.ShardingCtx(sharding.make_mesh(dict(fsdp=4, expert=2)))
  res = {}
  for dt in ('float32', 'bfloat16'):
    opt = train.make_optimizer(train.OptimConfig(lr=1e-3, warmup_steps=1,
                                                 moment_dtype=dt))
    m = model.Transformer(_main_job_cfg(), rngs=nnx.Rngs(0), ctx=ctx)
    sharding.shard_model(m, ctx)
    graph, state = train.init_state(m, opt)
    for _ in range(3):
      state, _ = sft.train_step(state, batch, graph=graph, opt=opt, accum=1,
                                bias_rate=0.0, n_moe=2)
    res[dt] = state
  s32, s16 = res['float32'], res['bfloat16']
  moments = lambda s: [x for x in jax.tree.leaves(s.opt_state) if x.ndim]
  assert {x.dtype for x in moments(s16)} == {jnp.dtype(jnp.bfloat16)}
  assert {x.dtype for x in jax.tree.leaves(s16.params)} == {
      jnp.dtype(jnp.float32)}
  assert [(x.shape, x.sharding.spec) for x in moments(s16)] == [
      (x.shape, x.sharding.spec) for x in moments(s32)]
  nbytes = lambda s: sum(x.addressable_shards[0].data.nbytes
                         for x in moments(s))
  assert nbytes(s16) * 2 == nbytes(s32)
  moved = [np.abs(np.asarray(a) - np.asarray(b)).max() for a, b in zip(
      jax.tree.leaves(s16.params), jax.tree.leaves(s32.params))]
  # Three steps of lr 1e-3 move a weight up to 3e-3; bf16 moments change
  # each step's size by their rounding (~0.4 % a moment).
  assert 0 < max(moved) < 1e-4, max(moved)
  for src, dst in (('float32', 'bfloat16'), ('bfloat16', 'float32'),
                   ('bfloat16', 'bfloat16')):
    ck = checkpoint.Checkpointer(str(tmp_path / f'{src}_{dst}'),
                                 async_save=False)
    ck.save(1, res[src].to_checkpoint())
    restored, _ = ck.restore(res[dst].to_checkpoint())
    ck.close()
    got = [x for x in restored['opt_state'] if x.ndim]
    assert {x.dtype for x in got} == {jnp.dtype(dst)}
    for a, b in zip(got, moments(res[src])):
      np.testing.assert_allclose(np.asarray(a, np.float32),
                                 np.asarray(b, np.float32), rtol=1e-2,
                                 atol=1e-12)
  with pytest.raises(ValueError, match='optim.moment_dtype'):
    train.OptimConfig(moment_dtype='float16')
