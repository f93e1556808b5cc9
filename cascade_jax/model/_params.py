"""Parameter counts (total / active per token) from a config, without allocating."""

from __future__ import annotations

import dataclasses
import math

import jax
from flax import nnx

from cascade_jax.model._config import ModelConfig
from cascade_jax.model._transformer import Transformer


@dataclasses.dataclass(frozen=True)
class ParamCount:
  total: int        # every parameter
  active: int       # used per token: routed experts count top_k / num_experts
  embedding: int    # input embedding table (counted in total and active)

  def __str__(self):
    g = lambda n: f'{n / 1e9:.2f}B' if n >= 1e8 else f'{n / 1e6:.2f}M'
    return (f'total {g(self.total)}, active {g(self.active)} '
            f'({g(self.active - self.embedding)} without input embedding)')


def mamba2_param_count(cfg: ModelConfig) -> int:
  """Parameters of one Mamba-2 mixer counted from the formula (Nemotron-H
  layout, no biases but the conv's): a check on the built module's count."""
  m = cfg.mamba
  d_inner = m.num_heads * m.head_dim
  conv_dim = d_inner + 2 * m.num_groups * m.state_dim
  in_proj = cfg.embed_dim * (2 * d_inner + 2 * m.num_groups * m.state_dim +
                             m.num_heads)
  conv = conv_dim * m.conv_kernel + conv_dim
  per_head = 3 * m.num_heads          # dt_bias, A_log, D
  gated_norm = d_inner
  out_proj = d_inner * cfg.embed_dim
  return in_proj + conv + per_head + gated_norm + out_proj


def count_params(cfg: ModelConfig) -> ParamCount:
  """Counts parameters with `nnx.eval_shape`: shapes only, nothing allocated."""
  total = active = 0
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  params = nnx.state(model, nnx.Param)
  for _, v in jax.tree_util.tree_leaves_with_path(
      params, is_leaf=lambda x: isinstance(x, nnx.Variable)):
    n = math.prod(v.shape)
    total += n
    axes = v.get_metadata()['logical_axes']
    if 'exp' in axes:
      active += n * cfg.moe.top_k // cfg.moe.num_experts
    else:
      active += n
  return ParamCount(total=total, active=active,
                    embedding=cfg.vocab_size * cfg.embed_dim)
