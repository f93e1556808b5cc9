"""The sampler's weights one array per layer (`model.LayerArrays`, written by the weight sync).

The main job's model ('*E*E': a group of two repeats, stacked [2, ...]),
with the weight sync's bf16 copy (the path that copies, as at scale): the
layer arrays must compute exactly what the stacked copy computes, in every
program that reads the sampler's weights.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from cascade_jax import model
from cascade_jax import rl
from cascade_jax import rollout
from cascade_jax import sharding
from cascade_jax import train

_PROMPTS = [[5, 6, 7, 8][: 1 + i % 4] + [9] * (i % 3) for i in range(6)]


def _main_job_model(**kw):
  """The main job's model (configs/sft.py: small, vocab 1024, '*E*E')."""
  cfg = model.small(**{'vocab_size': 1024, 'pattern': '*E*E', **kw})
  assert cfg.layer_groups == (('*E', 2),)
  return model.Transformer(cfg, rngs=nnx.Rngs(0))


def _copies(m, dtype='bfloat16'):
  """The weight sync's copy of `m` with and without layer arrays."""
  graph, state = train.init_state(m, optax.adam(1e-3))
  sampler = rl.SamplerWeights(graph, dtype)
  assert sampler.copies(state)
  split = sampler.model(state)
  target = rl.sampler_state(m.cfg, dtype, None)[1:]
  target = jax.tree.map(lambda t: jax.ShapeDtypeStruct(t.shape, t.dtype),
                        target)
  params, rest = rl.sync_fn(target, layer_arrays=False)(
      (state.params, state.rest))
  return split, nnx.merge(graph, params, rest)


def test_weight_sync_writes_each_layers_weights_as_arrays_of_their_own():
  split, stacked = _copies(_main_job_model())
  params = nnx.state(split, nnx.Param)
  assert model.has_layer_arrays(params)
  assert not model.has_layer_arrays(nnx.state(stacked, nnx.Param))
  w = split.layers[0].blocks[1].mixer.w_gate_edf.get_value()
  assert isinstance(w, model.LayerArrays) and len(w) == 2
  assert w.shape == stacked.layers[0].blocks[1].mixer.w_gate_edf.shape
  assert w.dtype == jnp.bfloat16 and w[1].shape == w.shape[1:]
  # Separate buffers with the stacked copy's values, and back again.
  back = model.stack_layers(params)
  for a, b in zip(jax.tree.leaves(back),
                  jax.tree.leaves(nnx.state(stacked, nnx.Param)), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(TypeError, match='a layer at a time'):
    w[...]  # pylint: disable=pointless-statement


@pytest.mark.parametrize('scan', [False, True])
def test_layer_arrays_training_forward_equals_the_stacked_forward(scan):
  # The learner's forward on the sampler's copy (scoring with it): unrolled,
  # each layer reads its own array; scanned, they are stacked once.
  split, stacked = _copies(_main_job_model(scan_layers=scan))
  toks = jax.random.randint(jax.random.key(1), (3, 9), 0, 1024)

  @jax.jit
  def fwd(m):
    logits, info = m(toks)
    return logits, info['expert_idx']

  (la, ea), (lb, eb) = fwd(split), fwd(stacked)
  np.testing.assert_array_equal(np.asarray(ea), np.asarray(eb))
  np.testing.assert_allclose(np.asarray(la), np.asarray(lb), atol=1e-6)


# CI: the main job's sampler reads the learner's stacked weights (no copy);
# a layer-array copy's forward: the training test above.
@pytest.mark.slow
@pytest.mark.parametrize('hybrid', [False, True])
def test_weight_sync_layer_arrays_sample_what_the_stacked_copy_samples(hybrid):
  # The sampler's programs (plain, continuous batching) on the layer arrays
  # draw the stacked copy's tokens with its log-probs and experts; also
  # the Nemotron-H-style hybrid ('ME*E' twice: Mamba states in the cache).
  m = (model.Transformer(model.small_hybrid(vocab_size=1024),
                         rngs=nnx.Rngs(0)) if hybrid else _main_job_model())
  split, stacked = _copies(m)
  sc = rollout.SampleConfig(max_new_tokens=8, temperature=1.0,
                            prompt_bucket=4)
  keys = jax.random.split(jax.random.key(3), len(_PROMPTS))
  out = {}
  for name, m in (('split', split), ('stacked', stacked)):
    out[name] = rollout.generate(m, _PROMPTS, cfg=sc, stop_ids=-1, key=keys,
                                 record_experts=True)
    out[name + '_continuous'] = rollout.generate_continuous(
        m, _PROMPTS, cfg=sc, stop_ids=-1, slots=4, keys=keys,
        record_experts=True)
  for kind in ('', '_continuous'):
    a, b = out['split' + kind], out['stacked' + kind]
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.expert_idx, b.expert_idx)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)


def test_layer_arrays_split_a_sharding_per_layer_and_refuse_a_split_layers_axis():
  mesh = sharding.make_mesh(dict(fsdp=2, expert=4))
  spec = jax.sharding.PartitionSpec(None, 'expert', None)
  s = jax.sharding.NamedSharding(mesh, spec)
  part = model.layer_part(jax.ShapeDtypeStruct((2, 8, 4), jnp.float32,
                                               sharding=s), 1, 3)
  assert part.shape == (8, 4)
  assert part.sharding.spec == jax.sharding.PartitionSpec('expert', None)
  bad = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('fsdp'))
  with pytest.raises(ValueError, match='layers axis'):
    model.layer_part(bad, 0, 3, 'w')
