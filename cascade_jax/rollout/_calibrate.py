"""The sampler's decode step as the CPU kernels' calibration times it (`ops.register_decode_benchmark`)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from cascade_jax import model as model_lib
from cascade_jax import ops
from cascade_jax.rollout import _decode


@functools.cache
def main_job_model() -> model_lib.Transformer:
  """The main job's model (configs/sft.py: `small`, vocab 1024, *E*E)."""
  cfg = model_lib.small(vocab_size=1024, pattern='*E*E')
  return model_lib.Transformer(cfg, rngs=nnx.Rngs(0))


def decode_benchmark(b: int, steps: int, slots: int):
  """A new jitted loop of `steps` decode steps (`_decode.forward` over a
  KV cache of `slots` written up to near its end, then the next token's
  argmax) of the main job's model at batch `b`, and its arguments."""
  model = main_job_model()
  graph, state = nnx.split(model)
  start = slots - steps - 1

  def run(state, cache, tok):   # a new function each call: its own trace
    m = nnx.merge(graph, state)
    layouts = _decode.model_decode_weights(m, b)

    def body(i, c):
      cache, tok = c
      logits, cache, _ = _decode.forward(
          m, tok[:, None], positions_bt=jnp.full((b, 1), start) + i,
          segment_ids_bt=jnp.ones((b, 1), jnp.int32), cache=cache,
          layouts=layouts)
      return cache, ops.argmax(logits[:, -1])
    return jax.lax.fori_loop(0, steps, body, (cache, tok))[1]

  cache = dataclasses.replace(
      model_lib.init_cache(model.cfg, b, slots),
      positions=jnp.broadcast_to(jnp.arange(slots, dtype=jnp.int32),
                                 (b, slots)),
      segment_ids=jnp.ones((b, slots), jnp.int32),
      index=jnp.asarray(start, jnp.int32))
  tok = jnp.arange(b, dtype=jnp.int32) % model.cfg.vocab_size
  return jax.jit(run), (state, cache, tok)


ops.register_decode_benchmark(decode_benchmark)
