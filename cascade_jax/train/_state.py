"""Train state shared by the SFT and RL learners: model split, optimizer, checkpoint round trip."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from cascade_jax import model as model_lib


def model_config(preset: str, overrides: Mapping[str, Any] | None = None
                 ) -> model_lib.ModelConfig:
  """A preset with field overrides; `moe` and `mamba` overrides are nested mappings."""
  overrides = dict(overrides or {})
  dropped = {k for k in ('moe', 'mamba')
             if k in overrides and overrides[k] is None}
  moe = dict(overrides.pop('moe', {}) or {})
  mamba = dict(overrides.pop('mamba', {}) or {})
  cfg = model_lib.preset(preset)
  fields = {f.name for f in dataclasses.fields(cfg)}
  unknown = set(overrides) - fields
  if unknown:
    raise ValueError(f'model overrides: unknown fields {sorted(unknown)}; '
                     f'known: {sorted(fields)}')
  cfg = cfg.replace(**overrides)
  for name, kw, what in (('moe', moe, 'MoE'), ('mamba', mamba, 'Mamba-2 config')):
    if name in dropped:      # e.g. an imported model without Mamba layers
      cfg = cfg.replace(**{name: None})
    if not kw:
      continue
    sub = getattr(cfg, name)
    if sub is None:
      raise ValueError(f'model overrides: {name} given but the preset has no '
                       f'{what}')
    sfields = {f.name for f in dataclasses.fields(sub)}
    unknown = set(kw) - sfields
    if unknown:
      raise ValueError(f'model overrides: unknown {name} fields '
                       f'{sorted(unknown)}; known: {sorted(sfields)}')
    cfg = cfg.replace(**{name: dataclasses.replace(sub, **kw)})
  return cfg


# The dtypes Adam's moments may be stored in (`OptimConfig.moment_dtype`).
MOMENT_DTYPES = ('float32', 'bfloat16')


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  lr: float = 2e-3
  warmup_steps: int = 50
  decay_steps: int = 1000
  end_lr_frac: float = 0.1
  b1: float = 0.9
  b2: float = 0.98
  weight_decay: float = 0.1
  clip_norm: float = 1.0
  schedule: str = 'cosine'      # 'cosine' | 'constant' (after warm-up)
  warmup_init_frac: float = 0.0
  # The dtype Adam's two moments are stored in: 'float32', or 'bfloat16'
  # (4 bytes a parameter instead of 8, as DeepSeek-V3 trains; each update
  # is still computed in float32 from them).
  moment_dtype: str = 'float32'

  def __post_init__(self):
    if self.moment_dtype not in MOMENT_DTYPES:
      raise ValueError(f'optim.moment_dtype: {self.moment_dtype!r} not in '
                       f'{MOMENT_DTYPES}')


def schedule(c: OptimConfig) -> optax.Schedule:
  init = c.lr * c.warmup_init_frac
  if c.schedule == 'constant':
    return optax.join_schedules(
        [optax.linear_schedule(init, c.lr, max(c.warmup_steps, 1)),
         optax.constant_schedule(c.lr)], [max(c.warmup_steps, 1)])
  if c.schedule != 'cosine':
    raise ValueError(f"optim.schedule must be 'cosine' or 'constant', got "
                     f'{c.schedule!r}')
  return optax.warmup_cosine_decay_schedule(
      init, c.lr, max(c.warmup_steps, 1), max(c.decay_steps, c.warmup_steps + 1),
      c.lr * c.end_lr_frac)


def make_optimizer(c: OptimConfig) -> optax.GradientTransformation:
  """AdamW with warm-up + schedule and global-norm clipping; no decay on
  vectors; the moments stored in `c.moment_dtype`."""
  decay_mask = lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)
  if c.moment_dtype == 'float32':
    adamw = optax.adamw(schedule(c), b1=c.b1, b2=c.b2,
                        weight_decay=c.weight_decay, mask=decay_mask)
  else:   # optax.adamw's chain, its moments stored narrower
    adamw = optax.chain(
        _moments_stored_as(optax.scale_by_adam(b1=c.b1, b2=c.b2),
                           jnp.dtype(c.moment_dtype)),
        optax.add_decayed_weights(c.weight_decay, decay_mask),
        optax.scale_by_learning_rate(schedule(c)))
  return optax.chain(optax.clip_by_global_norm(c.clip_norm), adamw)


def _moments_stored_as(adam: optax.GradientTransformation, dtype
                       ) -> optax.GradientTransformation:
  """`adam` (optax.scale_by_adam) with its moments stored in `dtype`:
  widened to float32 for each update, narrowed again after it."""
  def cast(state, dt):
    to = lambda t: jax.tree.map(lambda x: x.astype(dt), t)
    return state._replace(mu=to(state.mu), nu=to(state.nu))

  def init(params):
    return cast(adam.init(params), dtype)

  def update(updates, state, params=None):
    updates, state = adam.update(updates, cast(state, jnp.float32), params)
    return updates, cast(state, dtype)

  return optax.GradientTransformation(init, update)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
  params: nnx.State        # nnx.Param variables
  rest: nnx.State          # everything else (the MoE expert bias)
  opt_state: Any
  step: jax.Array

  def to_checkpoint(self) -> dict:
    """Plain containers only (dicts of arrays, a list of optimizer leaves),
    so a checkpoint's layout does not depend on NNX or optax classes."""
    return dict(params=self.params.to_pure_dict(),
                rest=self.rest.to_pure_dict(),
                opt_state=jax.tree.leaves(self.opt_state), step=self.step)

  def from_checkpoint(self, ckpt: dict) -> 'TrainState':
    params, rest = self.params, self.rest
    nnx.replace_by_pure_dict(params, ckpt['params'])
    nnx.replace_by_pure_dict(rest, ckpt['rest'])
    opt_state = jax.tree.unflatten(jax.tree.structure(self.opt_state),
                                   list(ckpt['opt_state']))
    return TrainState(params, rest, opt_state, ckpt['step'])


def init_state(model: nnx.Module, opt: optax.GradientTransformation
               ) -> tuple[nnx.GraphDef, TrainState]:
  """(graph, state): the model's weights and a fresh optimizer state.

  On a mesh the optimizer state is sharded like the parameters it tracks
  (FSDP: Adam's two moments cost 8 bytes per parameter, split over the
  same devices as the parameter), its counters replicated. Left to
  propagation, `opt.init`'s zeros would land on one device.
  """
  graph, params, rest = nnx.split(model, nnx.Param, ...)
  shardings = opt_state_shardings(opt, params)
  opt_state = jax.jit(opt.init, out_shardings=shardings)(params)
  step = jnp.zeros((), jnp.int32)
  if shardings is not None:   # replicated on the mesh, as restored
    mesh = jax.tree.leaves(shardings)[0].mesh
    step = jax.jit(lambda: jnp.zeros((), jnp.int32), out_shardings=(
        NamedSharding(mesh, PartitionSpec())))()
  return graph, TrainState(params, rest, opt_state, step)


def opt_state_shardings(opt: optax.GradientTransformation, params):
  """Shardings of `opt.init(params)`: each parameter's own for the state
  that tracks it, replicated for the rest; None off a mesh.

  `params` may hold arrays or `jax.ShapeDtypeStruct`s with shardings.
  """
  shardings = [getattr(x, 'sharding', None) for x in jax.tree.leaves(params)]
  if not any(isinstance(s, NamedSharding) for s in shardings):
    return None
  mesh = next(s.mesh for s in shardings if isinstance(s, NamedSharding))
  replicated = NamedSharding(mesh, PartitionSpec())
  return optax.tree_map_params(
      opt, lambda _, x: getattr(x, 'sharding', replicated),
      jax.eval_shape(opt.init, params), params,
      transform_non_params=lambda _: replicated)


def resume(ckpt, state: TrainState) -> tuple[TrainState, dict | None]:
  """The latest checkpoint of `ckpt` restored into `state`'s layout, with its
  JSON side data; (state, None) when the run has no checkpoint yet."""
  if ckpt.latest_step() is None:
    return state, None
  restored, extra = ckpt.restore(state.to_checkpoint())
  return state.from_checkpoint(restored), extra
