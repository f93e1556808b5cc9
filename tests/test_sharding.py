"""Sharded model on 8 fake CPU devices equals the single-device model."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from cascade_jax import model
from cascade_jax import ops
from cascade_jax import sharding

MESHES = {
    'data8': dict(data=8),
    'data2_expert4': dict(data=2, expert=4),
    'fsdp2_expert2_tensor2': dict(fsdp=2, expert=2, tensor=2),
}


def _cfg(dispatch):
  # 4 experts, top-2, capacity factor E / k = 2: nothing can be dropped, so
  # every path and mesh must give the single-device numbers.
  return model.tiny(pattern='*E*-', moe=model.MoEConfig(
      num_experts=4, top_k=2, expert_dim=16, dispatch=dispatch,
      capacity_factor=2.0, score_fn='sigmoid', use_expert_bias=True,
      seq_aux_loss_coef=0.01, z_loss_coef=1e-3, num_shared_experts=1,
      shared_expert_dim=8))


def _loss_and_grads(cfg, ctx, **call_kw):
  m = model.Transformer(cfg, rngs=nnx.Rngs(0), ctx=ctx)
  if ctx is not None:
    sharding.shard_model(m, ctx)
  toks = jax.random.randint(jax.random.key(1), (8, 6), 0, cfg.vocab_size)
  graph, params, rest = nnx.split(m, nnx.Param, ...)

  @jax.jit
  def f(params, toks):
    def loss(params):
      logits, info = nnx.merge(graph, params, rest)(toks, **call_kw)
      nll = -jnp.mean(jnp.take_along_axis(
          jax.nn.log_softmax(logits[:, :-1]), toks[:, 1:, None], -1))
      return nll + info['aux_loss'], logits
    out, grads = jax.value_and_grad(loss, has_aux=True)(params)
    if ctx is not None:  # as a train step does: grads sharded like params
      grads = jax.lax.with_sharding_constraint(
          grads, sharding.state_shardings(ctx, params))
    return out, grads

  (l, logits), g = f(params, toks)
  return l, logits, g, params


_REFERENCE = {}


def _reference(dispatch):
  if dispatch not in _REFERENCE:
    _REFERENCE[dispatch] = _loss_and_grads(_cfg(dispatch), None)
  return _REFERENCE[dispatch]


def _dispatch_meshes():
  # By default: the main job's dispatch (capacity) on every mesh; CI runs
  # every pair (dense, the reference, everywhere; dropless on the expert
  # mesh, whose fallback runs by default in
  # test_sharded_dropless_falls_back_to_dense_together).
  # (ragged's exchange on the expert mesh by default:
  # test_ragged_all_to_all_dispatch_equals_single_device.)
  for d in ('dense', 'ragged', 'capacity', 'dropless'):
    for m in sorted(MESHES):
      default = d == 'capacity'
      yield pytest.param(m, d, id=f'{d}-{m}',
                         marks=() if default else pytest.mark.slow)


@pytest.mark.parametrize('mesh_name,dispatch', _dispatch_meshes())
def test_sharded_forward_and_grads_equal_single_device(mesh_name, dispatch):
  assert jax.device_count() == 8
  ctx = sharding.ShardingCtx(sharding.make_mesh(MESHES[mesh_name]))
  l0, logits0, g0, _ = _reference(dispatch)
  l1, logits1, g1, params = _loss_and_grads(_cfg(dispatch), ctx)
  np.testing.assert_allclose(l1, l0, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(logits1, logits0, rtol=1e-5, atol=1e-5)
  chex.assert_trees_all_close(g1, g0, rtol=1e-5, atol=1e-5)
  # Gradients can be laid out exactly like their parameters.
  same = jax.tree.map(
      lambda g, p: g.sharding.is_equivalent_to(p.sharding, p.ndim), g1, params)
  assert all(jax.tree.leaves(same)), same


@pytest.mark.parametrize('mesh_name', [
    'data2_expert4',
    pytest.param('fsdp2_expert2_tensor2', marks=pytest.mark.slow)])
def test_ragged_all_to_all_dispatch_equals_single_device(mesh_name):
  # The GPU / TPU expert-parallel path of `ragged` (each pair to its
  # expert's shard and back), with the collective emulated: CPU has no
  # ragged_all_to_all. Forward and gradients equal the single device.
  ctx = sharding.ShardingCtx(sharding.make_mesh(MESHES[mesh_name]))
  l0, logits0, g0, _ = _reference('ragged')
  ops.reset_selected()
  with ops.forced(expert_exchange='ragged_all_to_all_emulated'):
    l1, logits1, g1, _ = _loss_and_grads(_cfg('ragged'), ctx)
  assert ops.selected()['expert_exchange'] == [
      'ragged_all_to_all_emulated (cpu, float32)']
  np.testing.assert_allclose(l1, l0, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(logits1, logits0, rtol=1e-5, atol=1e-5)
  chex.assert_trees_all_close(g1, g0, rtol=1e-5, atol=1e-5)


def _routed_forward(cfg, ctx, expert_idx):
  """Logits, router info and gradients of a forward with a replayed routing."""
  m = model.Transformer(cfg, rngs=nnx.Rngs(0), ctx=ctx)
  if ctx is not None:
    sharding.shard_model(m, ctx)
  toks = jax.random.randint(jax.random.key(1), expert_idx.shape[:2], 0,
                            cfg.vocab_size)
  graph, params, rest = nnx.split(m, nnx.Param, ...)

  @jax.jit
  def f(params):
    def loss(params):
      logits, info = nnx.merge(graph, params, rest)(toks, expert_idx=expert_idx)
      return jnp.mean(jnp.square(logits)), (logits, info['router'])
    return jax.value_and_grad(loss, has_aux=True)(params)

  (_, (logits, router)), grads = f(params)
  return logits, router, grads


@pytest.mark.parametrize('routing', [  # balanced: CI
    'one_shard', pytest.param('balanced', marks=pytest.mark.slow)])
def test_bounded_expert_buffer_stays_exact_when_a_shard_overflows(routing):
  # `ragged` (the 30B presets' dispatch) under expert parallelism with the
  # GPU / TPU exchange (emulated here), a receive buffer of the mean load
  # (factor 1). At ep 4 (one expert a shard), every token to experts 0 and
  # 1 sends every pair to two shards: twice their buffer. The layer must
  # see it on every shard alike, take the chunked exchange and give the
  # single device's numbers; a balanced routing stays in the one pass.
  cfg = model.tiny(pattern='*E*E', moe=model.MoEConfig(
      num_experts=4, top_k=2, expert_dim=16, dispatch='ragged',
      ragged_buffer_factor=1.0))
  b, t = 8, 6
  if routing == 'one_shard':
    idx = np.broadcast_to(np.array([0, 1]), (b, t, 2, 2))
  else:  # pair j of token n to expert (n + j) mod 4: the same load everywhere
    n = np.arange(b * t).reshape(b, t, 1, 1)
    idx = (n + np.arange(2)) % 4 * np.ones((1, 1, 2, 1), int)
  idx = jnp.asarray(idx, jnp.int32)
  ref = _routed_forward(dataclasses.replace(cfg, moe=dataclasses.replace(
      cfg.moe, dispatch='dense')), None, idx)
  ctx = sharding.ShardingCtx(sharding.make_mesh(MESHES['data2_expert4']))
  with ops.forced(expert_exchange='ragged_all_to_all_emulated'):
    logits, router, grads = _routed_forward(cfg, ctx, idx)
  np.testing.assert_allclose(logits, ref[0], rtol=1e-5, atol=1e-5)
  chex.assert_trees_all_close(grads, ref[2], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(router['dropped'], 0.0)
  np.testing.assert_array_equal(router['spilled'],
                                1.0 if routing == 'one_shard' else 0.0)


def test_receive_buffer_does_not_grow_with_the_expert_axis():
  pairs = 8192 * 8
  rows = {ep: model.receive_rows(pairs, ep, 2.0) for ep in (8, 16, 64)}
  assert rows == {8: 2 * pairs, 16: 2 * pairs, 64: 2 * pairs}
  assert model.receive_rows(pairs, 8, 0.0) == 8 * pairs     # the worst case
  assert model.receive_rows(100, 4, 2.0) == 200             # no tile on CPU
  # Chunks small enough that even every pair to one shard fits.
  for ep in (2, 8, 16):
    rows = model.receive_rows(1000 * 8, ep, 2.0)
    c = model.overflow_chunks(1000, 8, ep, rows)
    assert ep * -(-1000 // c) * 8 <= rows


@pytest.mark.parametrize('mesh_name', [  # data2_expert4: CI
    pytest.param('data2_expert4', marks=pytest.mark.slow),
    'fsdp2_expert2_tensor2'])
def test_sharded_dropless_falls_back_to_dense_together(mesh_name):
  # One slot per expert: every expert overflows on some shard, so the
  # layer runs dense, on every shard of the all_to_all group at once (a
  # shard taking the other branch would wait forever in its collective).
  ctx = sharding.ShardingCtx(sharding.make_mesh(MESHES[mesh_name]))
  l0, logits0, g0, _ = _reference('dense')
  l1, logits1, g1, _ = _loss_and_grads(_cfg('dropless'), ctx, moe_capacity=1)
  np.testing.assert_allclose(l1, l0, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(logits1, logits0, rtol=1e-5, atol=1e-5)
  chex.assert_trees_all_close(g1, g0, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('mesh_name, want', [
    ('data8', dict(experts=P(None, None, None), wq=P(None, None, None),
                   embed=P(None, None))),
    ('data2_expert4', dict(experts=P('expert', None, None),
                           wq=P(None, None, None), embed=P(None, None))),
    ('fsdp2_expert2_tensor2', dict(experts=P('expert', 'fsdp', 'tensor'),
                                   wq=P('fsdp', 'tensor', None),
                                   embed=P('tensor', 'fsdp'))),
])
def test_parameters_carry_expected_shardings(mesh_name, want):
  ctx = sharding.ShardingCtx(sharding.make_mesh(MESHES[mesh_name]))
  m = sharding.shard_model(
      model.Transformer(_cfg('capacity'), rngs=nnx.Rngs(0), ctx=ctx), ctx)
  # Layers are stacked per unit position: a leading 'layers' axis, unsharded.
  moe = m.layers[0].blocks[1].mixer
  assert moe.w_gate_edf[...].sharding.spec == P(None, *want['experts'])
  assert m.layers[0].blocks[0].mixer.w_q_dnh[...].sharding.spec == P(
      None, *want['wq'])
  assert m.embed_vd[...].sharding.spec == want['embed']
  assert moe.expert_bias[...].sharding.spec == P(None, None)
  assert moe.router_de[...].sharding.spec[2] is None  # router: every expert


def test_indivisible_dimension_stays_replicated():
  # 2 KV heads on a 4-way tensor axis cannot split: replicate, don't fail.
  ctx = sharding.ShardingCtx(sharding.make_mesh(dict(data=2, tensor=4)))
  assert ctx.spec(('embed', 'kv_heads', 'head_dim'), (16, 2, 8)) == P(
      None, None, None)
  assert ctx.spec(('embed', 'heads', 'head_dim'), (16, 4, 8)) == P(
      None, 'tensor', None)


def test_expert_parallelism_needs_tokens_split_over_expert_axis():
  rules = tuple((k, ('data',) if k == 'batch' else v)
                for k, v in sharding.DEFAULT_RULES)
  ctx = sharding.ShardingCtx(sharding.make_mesh(dict(data=2, expert=4)), rules)
  m = model.Transformer(_cfg('capacity'), rngs=nnx.Rngs(0), ctx=ctx)
  with pytest.raises(ValueError, match="add it to the 'batch' rule"):
    m(jnp.zeros((8, 4), jnp.int32))


def test_sharded_sampler_equals_single_device():
  # The sampler on an expert-parallel mesh (its MoE layers decode with the
  # `ragged` exchange in shard_map) draws what the single-device sampler
  # draws.
  from cascade_jax import rollout  # pylint: disable=g-import-not-at-top
  cfg = _cfg('dense')
  prompts = [[5, 6, 7][: 1 + i % 3] + [9] * (i % 2) for i in range(8)]
  sc = rollout.SampleConfig(max_new_tokens=6, temperature=1.0, prompt_bucket=4)
  ref = rollout.generate(model.Transformer(cfg, rngs=nnx.Rngs(0)), prompts,
                         cfg=sc, stop_ids=-1, key=jax.random.key(3))
  ctx = sharding.ShardingCtx(sharding.make_mesh(MESHES['data2_expert4']))
  m = sharding.shard_model(model.Transformer(cfg, rngs=nnx.Rngs(0), ctx=ctx),
                           ctx)
  out = rollout.generate(m, prompts, cfg=sc, stop_ids=-1, key=jax.random.key(3))
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)


def test_inference_layout_rules():
  rules = sharding.inference_rules(sharding.DEFAULT_RULES)
  table = dict(rules)
  assert table['embed'] is None                     # no FSDP on weights
  assert table['exp'] == ('fsdp', 'expert')         # experts split wider
  assert table['batch'] == dict(sharding.DEFAULT_RULES)['batch']
  assert table['heads'] == 'tensor'
  # The FSDP axis joins only where the experts still divide ...
  shape = dict(fsdp=3, expert=2)
  assert dict(sharding.inference_rules(sharding.DEFAULT_RULES, shape, 8))[
      'exp'] == 'expert'
  assert dict(sharding.inference_rules(sharding.DEFAULT_RULES, shape, 12))[
      'exp'] == ('fsdp', 'expert')
  # ... and where tokens are split over it (expert parallelism needs that).
  no_fsdp_batch = sharding.rules_from_config({'batch': 'data,expert'})
  assert dict(sharding.inference_rules(no_fsdp_batch))['exp'] == 'expert'


_DT_BYTES = {'f32': 4, 'bf16': 2, 's32': 4, 'u32': 4, 'pred': 1}


def _all_gathers(m, sc, prompt_len):
  """(dtype, shape) of every all-gather in the compiled generation."""
  import re  # pylint: disable=g-import-not-at-top
  from cascade_jax.rollout import _sampler  # pylint: disable=g-import-not-at-top
  graph, state = nnx.split(m)
  toks = jnp.ones((8, prompt_len), jnp.int32)
  lens = jnp.full((8,), prompt_len, jnp.int32)
  text = _sampler._generate.lower(  # pylint: disable=protected-access
      graph, state, toks, lens, jax.random.key(0), None, cfg=sc,
      stop_ids=(1,), pad_id=0, record_experts=False).compile().as_text()
  return {(g[0], tuple(int(x) for x in g[1].split(',') if x))
          for g in re.findall(r'= (\w+)\[([\d,]*)\][^ ]* all-gather', text)}


def _gathered_shapes(params):
  """Every shape a parameter takes gathered over some of its sharded dims."""
  import itertools  # pylint: disable=g-import-not-at-top
  out = set()
  for x in jax.tree.leaves(params):
    local = x.sharding.shard_shape(x.shape)
    for full in itertools.product(*[(a, b) for a, b in zip(x.shape, local)]):
      if full != tuple(local):
        out.add(tuple(d for d in full if d != 1))
  return out


@pytest.mark.parametrize('dtype', [  # float32: CI
    pytest.param('float32', marks=pytest.mark.slow), 'bfloat16'])
def test_weight_sync_to_the_inference_layout_gathers_no_weight(dtype):
  # The learner holds FSDP x expert-sharded fp32 weights; the sampler's copy
  # (rl.SamplerWeights, one jitted cast + reshard) holds whole experts over
  # fsdp x expert and no FSDP split, so the compiled generation all-gathers
  # tokens only, never a weight, and draws what one device draws.
  import optax  # pylint: disable=g-import-not-at-top
  from cascade_jax import rl  # pylint: disable=g-import-not-at-top
  from cascade_jax import rollout  # pylint: disable=g-import-not-at-top
  from cascade_jax import train  # pylint: disable=g-import-not-at-top
  cfg = dataclasses.replace(_cfg('capacity'), moe=dataclasses.replace(
      _cfg('capacity').moe, num_experts=8))
  sc = rollout.SampleConfig(max_new_tokens=6, temperature=1.0,
                            prompt_bucket=3)
  prompts = [[5, 6, 7][: 1 + i % 3] + [9] * (i % 2) for i in range(8)]
  one = model.Transformer(cfg, rngs=nnx.Rngs(0))
  ref = rollout.generate(
      rl.SamplerWeights(*nnx.split(one, nnx.Param, ...)[:1], dtype).model(
          train.TrainState(*nnx.split(one, nnx.Param, ...)[1:], None, None)),
      prompts, cfg=sc, stop_ids=-1, key=jax.random.key(3))
  ctx = sharding.ShardingCtx(sharding.make_mesh(dict(fsdp=2, expert=4)))
  m = sharding.shard_model(model.Transformer(cfg, rngs=nnx.Rngs(0), ctx=ctx),
                           ctx)
  graph, state = train.init_state(m, optax.adam(1e-3))
  before = jax.tree.map(lambda x: x.sharding, state.params)
  train_layout = rl.SamplerWeights(graph, dtype, ctx=ctx, layout='train')
  sampler = rl.SamplerWeights(graph, dtype, ctx=ctx)
  assert sampler.copies(state)
  sm = sampler.model(state)
  assert sampler.last_sync_s > 0
  params = nnx.state(sm, nnx.Param)
  # The model at `dtype` (its router pinned to fp32), in the inference
  # rules, each layer's weights an array of their own.
  want = model.split_layers(rl.sampler_state(cfg, dtype,
                                             ctx.for_inference(8))[1])
  assert model.has_layer_arrays(params)
  assert len(jax.tree.leaves(params)) == len(jax.tree.leaves(want))
  for got, w in zip(jax.tree.leaves(params), jax.tree.leaves(want),
                    strict=True):
    assert got.sharding.is_equivalent_to(w.sharding, got.ndim)
    assert got.dtype == w.dtype
  assert sm.moe_layers()[0].w_up_edf[...].dtype == jnp.dtype(dtype)
  w_gate = sm.moe_layers()[0].w_gate_edf[...]
  assert w_gate.sharding.shard_shape(w_gate.shape) == (1, 16, 16)
  # The learner's state is untouched.
  for got, w in zip(jax.tree.leaves(state.params), jax.tree.leaves(before)):
    assert got.sharding == w and got.dtype == jnp.float32

  out = rollout.generate(sm, prompts, cfg=sc, stop_ids=-1,
                         key=jax.random.key(3))
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_allclose(out.logprobs, ref.logprobs,
                             atol=1e-5 if dtype == 'float32' else 2e-2)
  weights = _gathered_shapes(params)
  inference = {s for _, s in _all_gathers(sm, sc, 3)}
  assert inference and not {tuple(d for d in s if d != 1)
                            for s in inference} & weights, inference
  # The learner's layout (the test can fail): decode gathers weights.
  trained = {s for _, s in _all_gathers(train_layout.model(state), sc, 3)}
  assert {tuple(d for d in s if d != 1) for s in trained} & (
      _gathered_shapes(state.params))



# The main job's (no mesh) by default; on a mesh in CI (the inference
# layout's sync on a mesh, by default:
# test_weight_sync_to_the_inference_layout_gathers_no_weight).
@pytest.mark.parametrize('mesh', [None, pytest.param(
    dict(fsdp=2, expert=4), marks=pytest.mark.slow)])
def test_weight_sync_decode_weight_layout_samples_what_the_default_samples(mesh):
  # rl.sampler_weight_layout='decode' (TPU's 'auto'): the weight sync writes
  # the attention's input projections with the embed axis minor, every
  # other weight as before, and the sampler reads them in that layout (jit
  # takes a committed array's layout): the same draws, on one device (fp32:
  # a copy that changes the layout alone) and in the inference layout.
  import optax  # pylint: disable=g-import-not-at-top
  from cascade_jax import rl  # pylint: disable=g-import-not-at-top
  from cascade_jax import rollout  # pylint: disable=g-import-not-at-top
  from cascade_jax import train  # pylint: disable=g-import-not-at-top
  assert rl.resolve_weight_layout('auto', 'tpu') == 'decode'
  assert rl.resolve_weight_layout('auto', 'cpu') == 'default'
  with pytest.raises(ValueError, match='sampler_weight_layout'):
    rl.resolve_weight_layout('transposed', 'cpu')
  with pytest.raises(ValueError, match='sampler_weight_layout'):
    rl.RLConfig(sampler_weight_layout='transposed')
  cfg = dataclasses.replace(_cfg('capacity'), moe=dataclasses.replace(
      _cfg('capacity').moe, num_experts=8))
  sc = rollout.SampleConfig(max_new_tokens=6, temperature=1.0,
                            prompt_bucket=3)
  prompts = [[5, 6, 7][: 1 + i % 3] + [9] * (i % 2) for i in range(8)]
  ctx = (None if mesh is None else
         sharding.ShardingCtx(sharding.make_mesh(mesh)))
  m = model.Transformer(cfg, rngs=nnx.Rngs(0), ctx=ctx)
  if ctx is not None:
    m = sharding.shard_model(m, ctx)
  graph, state = train.init_state(m, optax.adam(1e-3))
  if ctx is None:   # as a restored stage holds them: host arrays
    state = train.TrainState(jax.device_get(state.params), state.rest,
                             state.opt_state, state.step)
  draws = {}
  for layout in ('default', 'decode'):
    sampler = rl.SamplerWeights(graph, 'float32', ctx=ctx,
                                weight_layout=layout)
    assert sampler.weight_layout == layout
    sm = sampler.model(state)
    if layout == 'decode':
      assert sampler.copies(state)
      # The stacked weights as the sampler's model holds them.
      leaves = jax.tree_util.tree_flatten_with_path(nnx.state(sm, nnx.Param))[0]
      names = {jax.tree_util.keystr(p).split("['")[-1].split("']")[0]: x
               for p, x in leaves}
      for name in ('w_q_dnh', 'w_k_dkh', 'w_v_dkh'):
        got = names[name].format.layout.major_to_minor
        assert got == rl.embed_minor(names[name].ndim).major_to_minor, got
      w_o = names['w_o_nhd']
      assert w_o.format.layout.major_to_minor == tuple(range(w_o.ndim))
      # The learner's arrays keep theirs.
      for p, x in jax.tree_util.tree_flatten_with_path(state.params)[0]:
        assert not hasattr(x, 'format') or (
            x.format.layout.major_to_minor == tuple(range(x.ndim))), p
    else:
      assert not sampler.copies(state) or ctx is not None
    draws[layout] = rollout.generate(sm, prompts, cfg=sc, stop_ids=-1,
                                     key=jax.random.key(3))
  np.testing.assert_array_equal(draws['decode'].tokens,
                                draws['default'].tokens)
  np.testing.assert_allclose(draws['decode'].logprobs,
                             draws['default'].logprobs, atol=1e-5)

# CI (the default suite: the Pallas kernel in the sampler off a mesh,
# tests/test_decode_attention.py; the inference layout, above).
@pytest.mark.slow
@pytest.mark.parametrize('mesh', [
    dict(fsdp=2, expert=4), dict(fsdp=2, expert=2, tensor=2)])
def test_inference_layout_pallas_cache_attention_samples_what_xla_samples(mesh):
  # The TPU sampler's cache attention (`cache_attention='pallas'`, here in
  # Pallas' interpreter) on a mesh: the sampler's weights in the inference
  # layout (the weight sync's), the kernel per (batch, kv-head) shard in
  # shard_map; the same draws as XLA's einsums on the same model.
  import optax  # pylint: disable=g-import-not-at-top
  from cascade_jax import rl  # pylint: disable=g-import-not-at-top
  from cascade_jax import rollout  # pylint: disable=g-import-not-at-top
  from cascade_jax import train  # pylint: disable=g-import-not-at-top
  cfg = _cfg('capacity')
  ctx = sharding.ShardingCtx(sharding.make_mesh(mesh))
  m = sharding.shard_model(model.Transformer(cfg, rngs=nnx.Rngs(0), ctx=ctx),
                           ctx)
  graph, state = train.init_state(m, optax.adam(1e-3))
  sm = rl.SamplerWeights(graph, 'float32', ctx=ctx).model(state)
  sc = rollout.SampleConfig(max_new_tokens=6, temperature=1.0,
                            prompt_bucket=3)
  prompts = [[5, 6, 7][: 1 + i % 3] + [9] * (i % 2) for i in range(8)]
  draws = {}
  for impl in ('xla', 'pallas'):
    ops.reset_selected()
    jax.clear_caches()    # a choice takes effect at the next trace
    with ops.forced(cache_attention=impl):
      draws[impl] = rollout.generate(sm, prompts, cfg=sc, stop_ids=-1,
                                     key=jax.random.key(3))
    assert ops.selected()['cache_attention'] == [f'{impl} (cpu, float32)']
  np.testing.assert_array_equal(draws['pallas'].tokens, draws['xla'].tokens)
  np.testing.assert_allclose(draws['pallas'].logprobs, draws['xla'].logprobs,
                             atol=1e-5)


def test_vocab_parallel_embedding_never_gathers_the_table():
  # Vocab split over `tensor` (4 ways): the lookup runs in each vocab shard
  # and sums [B, T, D] over `tensor`; the gathering lookup it replaces
  # all-gathered the [V, D] table at every step. Values and the table's
  # gradient equal one device's, tokens from every shard (and its edges).
  cfg = model.tiny(pattern='*-')
  ctx = sharding.ShardingCtx(sharding.make_mesh(dict(data=2, tensor=4)))
  m = sharding.shard_model(model.Transformer(cfg, rngs=nnx.Rngs(0), ctx=ctx),
                           ctx)
  ref = model.Transformer(cfg, rngs=nnx.Rngs(0))
  v = cfg.vocab_size
  toks = jnp.asarray([[0, v // 4 - 1, v // 4, v // 2, v - 1, 3]] * 4)
  assert m.embed_vd[...].sharding.spec[0] == 'tensor'
  graph, params, rest = nnx.split(m, nnx.Param, ...)

  def embed(params, toks):
    return nnx.merge(graph, params, rest).embed(toks)

  f = jax.jit(embed)
  np.testing.assert_array_equal(f(params, toks), ref.embed(toks))
  hlo = f.lower(params, toks).compile().as_text()
  assert 'all-gather' not in hlo and 'all-reduce' in hlo
  w = jax.random.normal(jax.random.key(0), (4, 6, cfg.embed_dim))
  loss = lambda e: jnp.sum(e * w)
  g = jax.jit(jax.grad(lambda p: loss(embed(p, toks))))(params)
  g_ref = jax.grad(lambda t: loss(jnp.take(t, toks, axis=0)))(
      ref.embed_vd[...])
  np.testing.assert_allclose(g['embed_vd'][...], g_ref, rtol=1e-6, atol=1e-6)


def test_constrain_rows_splits_rows_and_leaves_other_axes_to_the_compiler():
  ctx = sharding.ShardingCtx(sharding.make_mesh(dict(data=2, expert=2,
                                                     tensor=2)))
  tree = dict(cache=jnp.zeros((8, 4, 6)), odd=jnp.zeros((6, 3)),
              scalar=jnp.zeros(()))
  assert sharding.constrain_rows(None, tree) is tree

  @jax.jit
  def f(t):
    # A cache written with its heads split over 'tensor' (as the
    # attention writes it) keeps that split: only the rows are pinned.
    heads = ctx.constrain(t['cache'] + 1, ('batch', 'kv_heads', None))
    return sharding.constrain_rows(ctx, dict(t, cache=heads))

  out = jax.jit(lambda t: sharding.constrain_rows(ctx, t))(tree)
  assert out['cache'].sharding.shard_shape((8, 4, 6))[0] == 2   # 4 row shards
  assert out['odd'].sharding.is_fully_replicated       # 6 rows on 4: whole
  got = f(tree)['cache'].sharding
  assert got.shard_shape((8, 4, 6)) == (2, 2, 6), got
