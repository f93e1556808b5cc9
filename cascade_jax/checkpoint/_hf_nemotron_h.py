"""Hugging Face Nemotron-H checkpoints (transformers' `NemotronHForCausalLM`) to and from our model.

The files' layout (`save_pretrained`, and NVIDIA's releases):
`backbone.embeddings.weight`, `backbone.layers.{i}.norm.weight`,
`backbone.layers.{i}.mixer.*` (Mamba-2: `in_proj` fused as
[z | x | B | C | dt], `conv1d` over [x | B | C], `dt_bias`, `A_log`, `D`,
`norm`, `out_proj`; MoE: `gate.weight`, `gate.e_score_correction_bias`,
`experts.{e}.up_proj / down_proj`, `shared_experts.*`; attention `q/k/v/o_proj`;
dense `up_proj / down_proj`), `backbone.norm_f.weight`, `lm_head.weight`.
The layer kinds come from `layers_block_type` (or the older
`hybrid_override_pattern` string).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax.numpy as jnp

import numpy as np

from cascade_jax.checkpoint import _hf_stream
from cascade_jax.checkpoint._hf_qwen3 import read_config
from cascade_jax.checkpoint._hf_stream import linear
from cascade_jax.checkpoint._hf_stream import same
from cascade_jax.checkpoint._safetensors import Files
from cascade_jax.model import abstract_model
from cascade_jax.model import ATTENTION
from cascade_jax.model import MambaConfig
from cascade_jax.model import MAMBA
from cascade_jax.model import MLP
from cascade_jax.model import ModelConfig
from cascade_jax.model import MOE
from cascade_jax.model import MoEConfig
from cascade_jax.model import Transformer
from cascade_jax.sharding import ShardingCtx

_KINDS = {'linear_attention': MAMBA, 'mamba': MAMBA, 'full_attention': ATTENTION,
          'attention': ATTENTION, 'moe': MOE, 'mlp': MLP}
_NAMES = {MAMBA: 'linear_attention', ATTENTION: 'full_attention', MOE: 'moe',
          MLP: 'mlp'}
# Tensors transformers itself skips on load (multi-token prediction heads).
_IGNORED_PREFIXES = ('mtp.',)


def _pattern(hf: dict[str, Any]) -> str:
  kinds = hf.get('layers_block_type') or hf.get('layer_types')
  if kinds:
    bad = sorted({k for k in kinds if k not in _KINDS})
    if bad:
      raise ValueError(f'config.json: layers_block_type has unknown kinds '
                       f'{bad}; known: {sorted(_KINDS)}')
    return ''.join(_KINDS[k] for k in kinds)
  pattern = hf.get('hybrid_override_pattern')
  if not pattern:
    raise ValueError('config.json: neither layers_block_type nor '
                     'hybrid_override_pattern names the layers')
  bad = sorted(set(pattern) - {MAMBA, ATTENTION, MOE, MLP})
  if bad:
    raise ValueError(f'config.json: hybrid_override_pattern has letters {bad} '
                     f"this model cannot build (known: 'M', '*', 'E', '-')")
  return pattern


def _dt_floor(hf: dict) -> float:
  """dt's clamp: `time_step_limit` (NVIDIA's and transformers' >= 5.25
  default (0, inf): no clamp; `time_step_min` only sets dt_bias's init).
  transformers < 5.25 clamped dt at time_step_min instead."""
  # transformers writes a non-finite float as {"__float__": "Infinity"}.
  num = lambda v: float(v['__float__'] if isinstance(v, dict) else v)
  lo, hi = map(num, hf.get('time_step_limit') or (0.0, float('inf')))
  if hi != float('inf'):
    raise ValueError(f'nemotron_h: time_step_limit={[lo, hi]} has an upper '
                     'bound; only [lo, inf] is supported')
  return lo


def config_from_hf_nemotron_h(hf: dict[str, Any], *, dtype: str = 'float32',
                              dispatch: str = 'ragged') -> ModelConfig:
  """Maps a Nemotron-H config.json to ModelConfig; what we cannot build is named."""
  if hf.get('model_type') != 'nemotron_h':
    raise ValueError(f"config.json: model_type {hf.get('model_type')!r} is not "
                     "'nemotron_h'")
  unsupported = []
  if hf.get('moe_latent_size') is not None:
    unsupported.append('moe_latent_size (latent MoE projections)')
  if hf.get('n_group', 1) != hf.get('topk_group', 1):
    unsupported.append(f"group-limited routing (n_group={hf.get('n_group')}, "
                       f"topk_group={hf.get('topk_group')})")
  for key in ('use_bias', 'mamba_proj_bias', 'mlp_bias', 'attention_bias'):
    if hf.get(key):
      unsupported.append(f'{key}=True')
  if hf.get('sliding_window'):
    unsupported.append('sliding_window')
  if hf.get('mamba_hidden_act', 'silu') != 'silu':
    unsupported.append(f"mamba_hidden_act={hf['mamba_hidden_act']!r}")
  if hf.get('mlp_hidden_act', 'relu2') != 'relu2':
    unsupported.append(f"mlp_hidden_act={hf['mlp_hidden_act']!r} (only relu2)")
  if unsupported:
    raise ValueError('config.json: not supported: ' + '; '.join(unsupported))
  pattern = _pattern(hf)
  heads = hf['num_attention_heads']
  moe = None
  if MOE in pattern:
    moe = MoEConfig(
        num_experts=hf['n_routed_experts'], top_k=hf['num_experts_per_tok'],
        expert_dim=hf['moe_intermediate_size'], activation='relu2',
        score_fn='sigmoid', renormalize=bool(hf.get('norm_topk_prob', True)),
        routed_scale=float(hf.get('routed_scaling_factor', 1.0)),
        use_expert_bias=True, num_shared_experts=1,
        shared_expert_dim=hf['moe_shared_expert_intermediate_size'],
        dispatch=dispatch)
  mamba = None
  if MAMBA in pattern:
    mamba = MambaConfig(
        num_heads=hf['mamba_num_heads'], head_dim=hf['mamba_head_dim'],
        state_dim=hf['ssm_state_size'], num_groups=hf['n_groups'],
        conv_kernel=hf.get('conv_kernel', 4),
        chunk_size=hf.get('chunk_size', 128),
        conv_bias=bool(hf.get('use_conv_bias', True)),
        dt_min=_dt_floor(hf),
        dt_init_min=float(hf.get('time_step_min', 0.001)),
        dt_init_max=float(hf.get('time_step_max', 0.1)))
  return ModelConfig(
      vocab_size=hf['vocab_size'], embed_dim=hf['hidden_size'],
      pattern=pattern, num_heads=heads,
      num_kv_heads=hf.get('num_key_value_heads') or heads,
      head_dim=hf.get('head_dim') or hf['hidden_size'] // heads,
      mlp_dim=hf.get('intermediate_size', 0) if MLP in pattern else 0,
      mlp_activation='relu2', moe=moe, mamba=mamba, use_rope=False,
      # transformers' NemotronHForCausalLM never ties (`_tied_weights_keys`
      # is empty): lm_head is its own weight whatever the flag says.
      qk_norm=False, tie_embeddings=False,
      norm_eps=float(hf.get('layer_norm_epsilon', 1e-5)), dtype=dtype,
      param_dtype=dtype)


def sources(cfg: ModelConfig, files: Files | None = None
            ) -> dict[tuple, _hf_stream.Source]:
  """Where each of our variables comes from in a Nemotron-H checkpoint."""
  d, v = cfg.embed_dim, cfg.vocab_size
  top = {('embed_vd',): same('backbone.embeddings.weight', (v, d)),
         ('final_norm', 'scale'): same('backbone.norm_f.weight', (d,))}
  if not cfg.tie_embeddings:
    top[('head_dv',)] = linear('lm_head.weight', (v,), (d,))

  def mamba(p: str) -> dict[tuple, Any]:
    m = cfg.mamba
    h, hd, g, n = m.num_heads, m.head_dim, m.num_groups, m.state_dim
    hp, gn = h * hd, g * n
    # in_proj is fused [z | x | B | C | dt] on its out axis, conv1d
    # [x | B | C] on its channels: each part is a row range.
    sizes = [hp, hp, gn, gn, h]
    at = np.cumsum([0] + sizes)
    rows = lambda i: (int(at[i]), int(at[i + 1]))
    inp = p + 'mixer.in_proj.weight'
    out = {('mixer', name): linear(inp, shape, (d,), rows=rows(i),
                                   total=int(at[-1]))
           for i, (name, shape) in enumerate(
               (('w_z_dhp', (h, hd)), ('w_x_dhp', (h, hd)),
                ('w_b_dgn', (g, n)), ('w_c_dgn', (g, n)), ('w_dt_dh', (h,))))}
    k, conv = m.conv_kernel, p + 'mixer.conv1d.'
    c_at = np.cumsum([0, hp, gn, gn])
    for i, (part, shape, axes) in enumerate((('x', (h, hd), 'hp'),
                                             ('b', (g, n), 'gn'),
                                             ('c', (g, n), 'gn'))):
      r = (int(c_at[i]), int(c_at[i + 1]))
      out[('mixer', f'conv_{part}_k{axes}')] = _hf_stream.Piece(
          conv + 'weight', (int(c_at[-1]), 1, k), (shape, (k,)), (1, 0),
          rows=r, squeeze=1)
      if m.conv_bias:
        out[('mixer', f'conv_bias_{part}_{axes}')] = _hf_stream.Piece(
            conv + 'bias', (int(c_at[-1]),), (shape,), (0,), rows=r)
    out.update({
        ('mixer', 'dt_bias_h'): same(p + 'mixer.dt_bias', (h,)),
        ('mixer', 'a_log_h'): same(p + 'mixer.A_log', (h,)),
        ('mixer', 'd_h'): same(p + 'mixer.D', (h,)),
        ('mixer', 'norm_hp'): same(p + 'mixer.norm.weight', (hp,), (h, hd)),
        ('mixer', 'w_out_hpd'): linear(p + 'mixer.out_proj.weight', (d,),
                                       (h, hd))})
    return out

  def moe(p: str) -> dict[tuple, Any]:
    m = cfg.moe
    e, f = m.num_experts, m.expert_dim
    out = {('mixer', 'router_de'): linear(p + 'mixer.gate.weight', (e,), (d,)),
           ('mixer', 'expert_bias'): same(
               p + 'mixer.gate.e_score_correction_bias', (e,))}
    for name, ours, (o, i_) in (('up_proj', 'w_gate_edf', ((f,), (d,))),
                                ('down_proj', 'w_down_efd', ((d,), (f,)))):
      fused = p + f'mixer.experts.{name}'
      if files is not None and fused in files:   # [E, out, in] in one tensor
        out[('mixer', ours)] = _hf_stream.Piece(
            fused, (e, o[0], i_[0]), ((e,), o, i_), (0, 2, 1))
      else:
        out[('mixer', ours)] = [
            linear(p + f'mixer.experts.{j}.{name}.weight', o, i_)
            for j in range(e)]
    fs = m.num_shared_experts * m.shared_expert_dim
    sh = p + 'mixer.shared_experts.'
    out[('mixer', 'shared', 'w_gate_df')] = linear(sh + 'up_proj.weight',
                                                   (fs,), (d,))
    out[('mixer', 'shared', 'w_down_fd')] = linear(sh + 'down_proj.weight',
                                                   (d,), (fs,))
    return out

  def layer(i: int, kind: str) -> dict[tuple, Any]:
    p = f'backbone.layers.{i}.'
    out = {('norm', 'scale'): same(p + 'norm.weight', (d,))}
    if kind == MAMBA:
      out.update(mamba(p))
    elif kind == ATTENTION:
      n_, k_, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
      out.update({
          ('mixer', 'w_q_dnh'): linear(p + 'mixer.q_proj.weight', (n_, hd), (d,)),
          ('mixer', 'w_k_dkh'): linear(p + 'mixer.k_proj.weight', (k_, hd), (d,)),
          ('mixer', 'w_v_dkh'): linear(p + 'mixer.v_proj.weight', (k_, hd), (d,)),
          ('mixer', 'w_o_nhd'): linear(p + 'mixer.o_proj.weight', (d,),
                                       (n_, hd))})
    elif kind == MOE:
      out.update(moe(p))
    else:
      fd = cfg.mlp_dim
      out[('mixer', 'w_gate_df')] = linear(p + 'mixer.up_proj.weight', (fd,), (d,))
      out[('mixer', 'w_down_fd')] = linear(p + 'mixer.down_proj.weight', (d,),
                                           (fd,))
    return out

  return _hf_stream.stacked_sources(cfg, top, layer)


def load_hf_nemotron_h(path: str, *, dtype: str = 'float32',
                       dispatch: str = 'ragged',
                       ctx: ShardingCtx | None = None
                       ) -> tuple[ModelConfig, Transformer]:
  """Imports a directory written by transformers' `save_pretrained` (NemotronHForCausalLM).

  Streamed: every device's slice of every weight is read from the files
  straight into its sharding on `ctx`'s mesh (`_hf_stream.load`). Every
  weight the model needs must be present with the right shape, and every
  tensor in the files must be used (multi-token-prediction `mtp.*` heads
  aside, as transformers skips them): a mismatch names the keys.
  """
  cfg = config_from_hf_nemotron_h(read_config(path), dtype=dtype,
                                  dispatch=dispatch)
  files = Files(path)
  model = abstract_model(cfg, ctx)
  return cfg, _hf_stream.load(
      files, sources(cfg, files), model,
      ignored=lambda k: k.startswith(_IGNORED_PREFIXES))


def _check_exportable(cfg: ModelConfig) -> None:
  problems = []
  if cfg.use_rope or cfg.qk_norm:
    problems.append('Nemotron-H attention has no RoPE and no QK norm')
  if MLP in cfg.pattern and cfg.mlp_activation != 'relu2':
    problems.append("dense '-' layers must be squared ReLU")
  m = cfg.moe
  if MOE in cfg.pattern and (
      m.score_fn != 'sigmoid' or m.activation != 'relu2'
      or not m.use_expert_bias or m.num_shared_experts != 1):
    problems.append('MoE must be sigmoid-routed squared-ReLU experts with a '
                    'correction bias and one shared expert')
  if problems:
    raise ValueError('model cannot be exported as Nemotron-H: ' +
                     '; '.join(problems))


def hf_config(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
  """config.json of a Nemotron-H checkpoint of `cfg` stored in `dtype`."""
  _check_exportable(cfg)
  m, mb = cfg.moe, cfg.mamba
  hf = dict(
      architectures=['NemotronHForCausalLM'], model_type='nemotron_h',
      vocab_size=cfg.vocab_size, hidden_size=cfg.embed_dim,
      layers_block_type=[_NAMES[k] for k in cfg.pattern],
      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim, intermediate_size=cfg.mlp_dim or 1,
      mlp_hidden_act='relu2', layer_norm_epsilon=cfg.norm_eps,
      tie_word_embeddings=False, dtype=dtype,
      torch_dtype=dtype, use_bias=False, mlp_bias=False,
      attention_bias=False, max_position_embeddings=4096)
  if m is not None:
    hf.update(n_routed_experts=m.num_experts, num_experts_per_tok=m.top_k,
              moe_intermediate_size=m.expert_dim,
              moe_shared_expert_intermediate_size=m.shared_expert_dim,
              n_shared_experts=1, routed_scaling_factor=m.routed_scale,
              norm_topk_prob=m.renormalize, n_group=1, topk_group=1)
  if mb is not None:
    hf.update(mamba_num_heads=mb.num_heads, mamba_head_dim=mb.head_dim,
              ssm_state_size=mb.state_dim, n_groups=mb.num_groups,
              conv_kernel=mb.conv_kernel, chunk_size=mb.chunk_size,
              use_conv_bias=mb.conv_bias, mamba_hidden_act='silu',
              time_step_min=mb.dt_init_min, time_step_max=mb.dt_init_max,
              time_step_limit=[mb.dt_min, float('inf')],
              expand=max(1, mb.num_heads * mb.head_dim // cfg.embed_dim),
              mamba_ssm_cache_dtype='float32')
  return hf


def save_hf_nemotron_h(cfg: ModelConfig, model: Transformer, path: str, *,
                       dtype: str = '', max_shard_bytes: int = 4 << 30
                       ) -> list[str]:
  """Writes config.json + safetensors shards that transformers'
  NemotronHForCausalLM loads, a tensor at a time (`_hf_stream.save`), in
  `dtype` ('' keeps the model's). Returns the weight files written."""
  dtype = dtype or cfg.param_dtype
  hf = hf_config(cfg, dtype)
  os.makedirs(path, exist_ok=True)
  # transformers' NemotronH never ties: a tied model writes its table twice.
  aliases = ({'lm_head.weight': 'backbone.embeddings.weight'}
             if cfg.tie_embeddings else None)
  files = _hf_stream.save(sources(cfg), model, path, dtype=jnp.dtype(dtype),
                          max_shard_bytes=max_shard_bytes, aliases=aliases)
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(hf, f, indent=2)
  return files


__all__ = ['config_from_hf_nemotron_h', 'load_hf_nemotron_h',
           'save_hf_nemotron_h']
