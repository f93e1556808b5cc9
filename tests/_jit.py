"""A module's call as one compiled program, for the tests' reference passes.

Called eagerly, an NNX model runs op by op and every op compiles on its
own: a tiny model's forward is ~130 programs, ~3 s of compiles, at every
new shape (in the default suite such op-by-op compiles were 271 of 767 s of
compiling). Jitted, it is one program, as the library runs it:

  logits, info = call(m, tokens, positions_bt=pos)     # m(tokens, ...)

Array arguments are traced; any other keyword (a flag, a capacity, a
dispatch dict) is static, so it must be hashable or a dict of hashables.
"""

import functools

import jax
import numpy as np
from flax import nnx


def _is_array(x) -> bool:
  return isinstance(x, (jax.Array, np.ndarray))


def _freeze(v):
  return tuple(sorted(v.items())) if isinstance(v, dict) else v


def _thaw(v):
  return dict(v) if isinstance(v, tuple) and v and all(
      isinstance(x, tuple) and len(x) == 2 for x in v) else v


@functools.partial(nnx.jit, static_argnums=(3,))
def _call(module, args, arrays, static):
  return module(*args, **arrays, **{k: _thaw(v) for k, v in static})


def call(module, *args, **kwargs):
  """`module(*args, **kwargs)` under `nnx.jit` (array args traced)."""
  arrays = {k: v for k, v in kwargs.items() if _is_array(v)}
  static = tuple(sorted((k, _freeze(v)) for k, v in kwargs.items()
                        if k not in arrays))
  return _call(module, args, arrays, static)
