"""Logical axis glossary, rules mapping logical axes to mesh axes, and meshes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

# The mesh axes, outermost first. `expert` is carved out of data parallelism:
# tokens are split over it like over `data`, experts are split over it too.
MESH_AXES = ('data', 'fsdp', 'expert', 'tensor')

# Every array dimension in the model is named by one of these.
LOGICAL_AXES = (
    'batch',     # examples (activations only)
    'seq',       # sequence positions (activations only)
    'embed',     # model width
    'heads',     # query heads
    'kv_heads',  # key/value heads
    'head_dim',  # per-head width
    'mlp',       # hidden width of dense MLPs and experts
    'exp',       # experts
    'vocab',     # vocabulary
    'ssm_heads',   # Mamba-2 heads
    'ssm_groups',  # Mamba-2 B / C groups (H / G heads each)
    'norm',      # norm scales and other small vectors
    'layers',    # a Stack's repeats (the scanned axis): never sharded
)

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

# MaxText-style defaults: FSDP shards weights over `embed`, tensor parallelism
# shards heads / mlp / vocab, expert parallelism shards `exp`.
DEFAULT_RULES: Rules = (
    ('batch', ('data', 'fsdp', 'expert')),
    ('seq', None),
    ('embed', 'fsdp'),
    ('heads', 'tensor'),
    ('kv_heads', 'tensor'),
    ('head_dim', None),
    ('mlp', 'tensor'),
    ('exp', 'expert'),
    ('vocab', 'tensor'),
    # A shard's heads read their own groups: both split over `tensor`, or
    # the groups replicated where the axis does not divide them (`spec`).
    ('ssm_heads', 'tensor'),
    ('ssm_groups', 'tensor'),
    ('norm', None),
    ('layers', None),
)


def rules_from_config(overrides: Mapping[str, str] | None) -> Rules:
  """DEFAULT_RULES with some logical axes remapped, as config data.

  `overrides`: logical axis -> mesh axes as a comma-separated string
  ('' replicates), e.g. {'embed': 'fsdp', 'batch': 'data,fsdp,expert'}.
  """
  overrides = dict(overrides or {})
  unknown = sorted(set(overrides) - set(LOGICAL_AXES))
  if unknown:
    raise ValueError(f'rules: unknown logical axes {unknown}; known: '
                     f'{LOGICAL_AXES}')
  rules = []
  for logical, target in DEFAULT_RULES:
    if logical in overrides:
      axes = tuple(a.strip() for a in str(overrides[logical]).split(',')
                   if a.strip())
      target = None if not axes else axes[0] if len(axes) == 1 else axes
    rules.append((logical, target))
  rules = tuple(rules)
  validate_rules(rules)
  return rules


def _as_tuple(x) -> tuple[str, ...]:
  if x is None:
    return ()
  return (x,) if isinstance(x, str) else tuple(x)


def validate_rules(rules: Rules) -> None:
  for logical, mesh_axes in rules:
    if logical not in LOGICAL_AXES:
      raise ValueError(
          f'sharding rule for unknown logical axis {logical!r}; known: '
          f'{LOGICAL_AXES}')
    for ax in _as_tuple(mesh_axes):
      if ax not in MESH_AXES:
        raise ValueError(
            f'sharding rule {logical!r} -> {ax!r}: unknown mesh axis; known: '
            f'{MESH_AXES}')


def make_mesh(shape: Mapping[str, int],
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Builds a mesh with all of MESH_AXES; absent axes get size 1.

  Args:
    shape: mesh axis -> size, e.g. {'data': 2, 'expert': 4}. One axis may be
      -1, meaning "all remaining devices".
    devices: the devices to use (default: all of jax.devices()).
  """
  devices = list(jax.devices() if devices is None else devices)
  for ax in shape:
    if ax not in MESH_AXES:
      raise ValueError(f'mesh: unknown axis {ax!r}; known: {MESH_AXES}')
  sizes = {ax: int(shape.get(ax, 1)) for ax in MESH_AXES}
  free = [ax for ax, s in sizes.items() if s == -1]
  if len(free) > 1:
    raise ValueError(f'mesh: at most one axis may be -1, got {free}')
  for ax, s in sizes.items():
    if s == 0 or s < -1:
      raise ValueError(f'mesh.{ax}: size must be positive or -1, got {s}')
  fixed = math.prod(s for s in sizes.values() if s != -1)
  if free:
    if len(devices) % fixed:
      raise ValueError(
          f'mesh: fixed axes {dict(shape)} (product {fixed}) do not divide '
          f'the {len(devices)} devices')
    sizes[free[0]] = len(devices) // fixed
  total = math.prod(sizes.values())
  if total != len(devices):
    raise ValueError(
        f'mesh: axes {dict(shape)} need {total} devices, but {len(devices)} '
        'are available')
  arr = np.asarray(devices, dtype=object).reshape(
      [sizes[ax] for ax in MESH_AXES])
  return Mesh(arr, MESH_AXES)


def inference_rules(rules: Rules, mesh_shape: Mapping[str, int] | None = None,
                    num_experts: int | None = None) -> Rules:
  """The sampler's layout of `rules`: no FSDP on weights, experts split wider.

  A decode step reads every weight it uses once per token: FSDP-sharded
  weights would be all-gathered at every step (at 30B, ~58 GB of experts a
  chip). Here `embed` is replicated (the FSDP rule gone), and the FSDP axes
  join the expert axes for `exp` (in mesh order), so each device holds
  E / (fsdp x expert) whole experts and decode moves tokens to them, never
  weights. An FSDP axis joins only where tokens are split over it too (the
  `batch` rule; expert parallelism needs that) and, given `mesh_shape` and
  `num_experts`, where the axes still divide the experts. Everything else
  (batch, tensor) is as in `rules`.
  """
  table = dict(rules)
  batch = set(_as_tuple(table.get('batch')))
  exp = list(_as_tuple(table.get('exp')))
  for ax in _as_tuple(table.get('embed')):
    if ax in exp or ax not in batch:
      continue
    wider = sorted(exp + [ax], key=MESH_AXES.index)
    if mesh_shape is not None and num_experts is not None and num_experts % (
        math.prod(mesh_shape.get(a, 1) for a in wider)):
      continue
    exp = wider
  new = {'embed': None,
         'exp': None if not exp else exp[0] if len(exp) == 1 else tuple(exp)}
  out = tuple((logical, new.get(logical, target)) if logical in new
              else (logical, target) for logical, target in rules)
  validate_rules(out)
  return out


@dataclasses.dataclass(frozen=True)
class ShardingCtx:
  """A mesh plus the rules that map logical axes onto it.

  Layers hold one of these (or None, meaning a single device) and ask it for
  partition specs by logical names, so that switching parallelism is a change
  of rules, not of layer code.
  """
  mesh: Mesh
  rules: Rules = DEFAULT_RULES

  def __post_init__(self):
    validate_rules(self.rules)

  @staticmethod
  def axes_tuple(target) -> tuple[str, ...]:
    """A rule's target (None, an axis, or axes) as a tuple of mesh axes."""
    return _as_tuple(target)

  def axis_size(self, name: str | None) -> int:
    return 1 if name is None else self.mesh.shape[name]

  def mesh_axes(self, logical: str | None) -> tuple[str, ...]:
    """Mesh axes (of size > 1) that a logical axis maps to."""
    if logical is None:
      return ()
    for name, target in self.rules:
      if name == logical:
        return tuple(a for a in _as_tuple(target) if self.mesh.shape[a] > 1)
    return ()

  def shards(self, logical: str) -> int:
    """How many ways a logical axis is split (e.g. 'batch': rows per step
    must be a multiple of it)."""
    return math.prod(self.mesh.shape[a] for a in self.mesh_axes(logical))

  def spec(self, logical_axes: Sequence[str | None],
           shape: Sequence[int] | None = None) -> P:
    """PartitionSpec for an array with the given logical axes.

    A mesh axis is used at most once (first come, first served), and where a
    `shape` is given, a dimension not divisible by its mesh axes stays
    replicated (e.g. 2 KV heads on a 4-way tensor axis).
    """
    used: set[str] = set()
    out = []
    for i, logical in enumerate(logical_axes):
      axes = tuple(a for a in self.mesh_axes(logical) if a not in used)
      if shape is not None and shape[i] % math.prod(
          self.mesh.shape[a] for a in axes):
        axes = ()
      used.update(axes)
      out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return P(*out)

  def for_inference(self, num_experts: int | None = None) -> 'ShardingCtx':
    """This mesh with `inference_rules` (the sampler's layout)."""
    return ShardingCtx(self.mesh, inference_rules(
        self.rules, dict(self.mesh.shape), num_experts))

  def sharding(self, logical_axes, shape=None) -> NamedSharding:
    return NamedSharding(self.mesh, self.spec(logical_axes, shape))

  def constrain(self, x: jax.Array, logical_axes) -> jax.Array:
    return jax.lax.with_sharding_constraint(
        x, self.sharding(logical_axes, x.shape))
