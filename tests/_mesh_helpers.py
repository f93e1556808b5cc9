"""Helpers for tests on a mesh of the 8 fake CPU devices."""

from flax import nnx

from cascade_jax import model
from cascade_jax import sharding


def inference_layout_sampler(m, mesh):
  """`m`'s weights as the RL sampler holds them on `mesh`: the learner's
  sharded state through `rl.SamplerWeights` (the inference layout: experts
  split over fsdp x expert, rows over every batch axis)."""
  import optax  # pylint: disable=g-import-not-at-top
  from cascade_jax import rl  # pylint: disable=g-import-not-at-top
  from cascade_jax import train  # pylint: disable=g-import-not-at-top
  ctx = sharding.ShardingCtx(sharding.make_mesh(mesh))
  learner = model.Transformer(m.cfg, rngs=nnx.Rngs(0), ctx=ctx)
  nnx.update(learner, nnx.state(m))
  graph, state = train.init_state(sharding.shard_model(learner, ctx),
                                  optax.adam(1e-3))
  return rl.SamplerWeights(graph, 'float32', ctx=ctx).model(state)


def tiny_moe(vocab_size: int) -> model.ModelConfig:
  """`tiny` with the main job's MoE (capacity dispatch, sigmoid router,
  shared expert) and 8 experts, to split over an expert axis; a capacity
  of every token (factor E / k): nothing dropped on any mesh."""
  return model.tiny(vocab_size=vocab_size, pattern='*E*E',
                    moe=model.MoEConfig(num_experts=8, top_k=2,
                                        expert_dim=16, dispatch='capacity',
                                        capacity_factor=4.0,
                                        score_fn='sigmoid',
                                        num_shared_experts=1,
                                        shared_expert_dim=8))
