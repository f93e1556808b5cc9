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
from flax import nnx
from safetensors.numpy import save_file

from cascade_jax.checkpoint._hf_qwen3 import _read_safetensors
from cascade_jax.model import ATTENTION
from cascade_jax.model import MambaConfig
from cascade_jax.model import MAMBA
from cascade_jax.model import MLP
from cascade_jax.model import ModelConfig
from cascade_jax.model import MOE
from cascade_jax.model import MoEConfig
from cascade_jax.model import Transformer
from cascade_jax.sharding import shard_model
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
        dt_min=float(hf.get('time_step_min', 0.001)),
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


def _linear_in(w, *shape):   # torch [out, in] -> ours [in, *out]
  return w.T.reshape(w.shape[1], *shape)


def _from_hf(cfg: ModelConfig, tensors: dict[str, np.ndarray], path: str):
  """{our variable path: array} from the HF tensors; missing keys are collected."""
  d = cfg.embed_dim
  out: dict[tuple, np.ndarray] = {}
  used, missing = set(), []

  def get(key):
    if key not in tensors:
      missing.append(key)
      return None
    used.add(key)
    return tensors[key]

  def put(ours, key, fn=lambda w: w):
    w = get(key)
    if w is not None:
      try:
        out[ours] = fn(w)
      except ValueError as e:
        raise ValueError(f'{path}: {key} has shape {w.shape}, which does not '
                         f'fit the config') from e

  put(('embed_vd',), 'backbone.embeddings.weight')
  put(('final_norm', 'scale'), 'backbone.norm_f.weight')
  put(('head_dv',), 'lm_head.weight', lambda w: w.T)
  for i, kind in enumerate(cfg.pattern):
    p = f'backbone.layers.{i}.'
    blk = ('blocks', i)
    put(blk + ('norm', 'scale'), p + 'norm.weight')
    mx = blk + ('mixer',)
    if kind == MAMBA:
      m = cfg.mamba
      h, hp, g, n = m.num_heads, m.num_heads * m.head_dim, m.num_groups, m.state_dim
      w = get(p + 'mixer.in_proj.weight')
      if w is not None:
        sizes = [hp, hp, g * n, g * n, h]
        if w.shape != (sum(sizes), d):
          raise ValueError(f'{path}: {p}mixer.in_proj.weight has shape '
                           f'{w.shape}, the config needs {(sum(sizes), d)} '
                           '(z, x, B, C, dt)')
        z, x, bb, cc, dt = np.split(w, np.cumsum(sizes)[:-1])
        out[mx + ('w_z_dhp',)] = _linear_in(z, h, m.head_dim)
        out[mx + ('w_x_dhp',)] = _linear_in(x, h, m.head_dim)
        out[mx + ('w_b_dgn',)] = _linear_in(bb, g, n)
        out[mx + ('w_c_dgn',)] = _linear_in(cc, g, n)
        out[mx + ('w_dt_dh',)] = dt.T
      conv_sizes = [hp, g * n, g * n]
      w = get(p + 'mixer.conv1d.weight')
      if w is not None:
        if w.shape != (sum(conv_sizes), 1, m.conv_kernel):
          raise ValueError(f'{path}: {p}mixer.conv1d.weight has shape '
                           f'{w.shape}, the config needs '
                           f'{(sum(conv_sizes), 1, m.conv_kernel)}')
        x, bb, cc = np.split(w[:, 0, :], np.cumsum(conv_sizes)[:-1])
        out[mx + ('conv_x_khp',)] = x.T.reshape(-1, h, m.head_dim)
        out[mx + ('conv_b_kgn',)] = bb.T.reshape(-1, g, n)
        out[mx + ('conv_c_kgn',)] = cc.T.reshape(-1, g, n)
      if m.conv_bias:
        w = get(p + 'mixer.conv1d.bias')
        if w is not None:
          x, bb, cc = np.split(w, np.cumsum(conv_sizes)[:-1])
          out[mx + ('conv_bias_x_hp',)] = x.reshape(h, m.head_dim)
          out[mx + ('conv_bias_b_gn',)] = bb.reshape(g, n)
          out[mx + ('conv_bias_c_gn',)] = cc.reshape(g, n)
      put(mx + ('dt_bias_h',), p + 'mixer.dt_bias')
      put(mx + ('a_log_h',), p + 'mixer.A_log')
      put(mx + ('d_h',), p + 'mixer.D')
      put(mx + ('norm_hp',), p + 'mixer.norm.weight',
          lambda w: w.reshape(h, m.head_dim))
      put(mx + ('w_out_hpd',), p + 'mixer.out_proj.weight',
          lambda w: w.T.reshape(h, m.head_dim, d))
    elif kind == ATTENTION:
      n_, k_, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
      put(mx + ('w_q_dnh',), p + 'mixer.q_proj.weight', lambda w: _linear_in(w, n_, hd))
      put(mx + ('w_k_dkh',), p + 'mixer.k_proj.weight', lambda w: _linear_in(w, k_, hd))
      put(mx + ('w_v_dkh',), p + 'mixer.v_proj.weight', lambda w: _linear_in(w, k_, hd))
      put(mx + ('w_o_nhd',), p + 'mixer.o_proj.weight',
          lambda w: w.T.reshape(n_, hd, d))
    elif kind == MOE:
      e = cfg.moe.num_experts
      put(mx + ('router_de',), p + 'mixer.gate.weight', lambda w: w.T)
      put(mx + ('expert_bias',), p + 'mixer.gate.e_score_correction_bias')
      for name, ours in (('up_proj', 'w_gate_edf'), ('down_proj', 'w_down_efd')):
        fused = p + f'mixer.experts.{name}'
        if fused in tensors:      # transformers' in-memory [E, out, in] layout
          put(mx + (ours,), fused, lambda w: w.transpose(0, 2, 1))
          continue
        ws = [get(p + f'mixer.experts.{j}.{name}.weight') for j in range(e)]
        if all(w_ is not None for w_ in ws):
          out[mx + (ours,)] = np.stack([w_.T for w_ in ws])
      put(mx + ('shared', 'w_gate_df'), p + 'mixer.shared_experts.up_proj.weight',
          lambda w: w.T)
      put(mx + ('shared', 'w_down_fd'),
          p + 'mixer.shared_experts.down_proj.weight', lambda w: w.T)
    else:
      put(mx + ('w_gate_df',), p + 'mixer.up_proj.weight', lambda w: w.T)
      put(mx + ('w_down_fd',), p + 'mixer.down_proj.weight', lambda w: w.T)
  return out, used, missing


def _variable(model, path_):
  obj = model
  for key in path_:
    obj = obj[key] if isinstance(key, int) else getattr(obj, key)
  return obj


def load_hf_nemotron_h(path: str, *, dtype: str = 'float32',
                       dispatch: str = 'ragged',
                       ctx: ShardingCtx | None = None
                       ) -> tuple[ModelConfig, Transformer]:
  """Imports a directory written by transformers' `save_pretrained` (NemotronHForCausalLM).

  Every weight the model needs must be present with the right shape, and
  every tensor in the files must be used (multi-token-prediction `mtp.*`
  heads aside, as transformers skips them): a mismatch names the keys.
  """
  with open(os.path.join(path, 'config.json')) as f:
    cfg = config_from_hf_nemotron_h(json.load(f), dtype=dtype,
                                    dispatch=dispatch)
  tensors = _read_safetensors(path)
  arrays, used, missing = _from_hf(cfg, tensors, path)
  if missing:
    raise ValueError(f'{path}: checkpoint lacks {len(missing)} weights the '
                     f'model needs, e.g. {missing[:5]}')
  unused = sorted(k for k in tensors if k not in used
                  and not k.startswith(_IGNORED_PREFIXES))
  if unused:
    raise ValueError(f'{path}: {len(unused)} tensors do not fit the model, '
                     f'e.g. {unused[:5]}')
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0), ctx=ctx))
  # Layer by layer into views of the stacked weights, stacked back at the end.
  views = model.layer_views()
  for ours, value in arrays.items():
    var = (_variable(views[ours[1]], ours[2:]) if ours[0] == 'blocks' else
           _variable(model, ours))
    if value.shape != var.shape:
      raise ValueError(f'{path}: {".".join(map(str, ours))} gets shape '
                       f'{value.shape} from the checkpoint, the model expects '
                       f'{var.shape}')
    var.set_value(jnp.asarray(value, dtype=var.dtype))
  model.set_layers(views)
  return cfg, (model if ctx is None else shard_model(model, ctx))


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


def save_hf_nemotron_h(cfg: ModelConfig, model: Transformer, path: str) -> None:
  """Writes config.json + model.safetensors that transformers' NemotronHForCausalLM loads."""
  _check_exportable(cfg)
  os.makedirs(path, exist_ok=True)
  m, mb = cfg.moe, cfg.mamba
  hf = dict(
      architectures=['NemotronHForCausalLM'], model_type='nemotron_h',
      vocab_size=cfg.vocab_size, hidden_size=cfg.embed_dim,
      layers_block_type=[_NAMES[k] for k in cfg.pattern],
      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim, intermediate_size=cfg.mlp_dim or 1,
      mlp_hidden_act='relu2', layer_norm_epsilon=cfg.norm_eps,
      tie_word_embeddings=False, dtype=cfg.param_dtype,
      torch_dtype=cfg.param_dtype, use_bias=False, mlp_bias=False,
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
              time_step_min=mb.dt_min or mb.dt_init_min,
              time_step_max=mb.dt_init_max,
              expand=max(1, mb.num_heads * mb.head_dim // cfg.embed_dim),
              mamba_ssm_cache_dtype='float32')
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(hf, f, indent=2)
  f32 = lambda v: np.asarray(v[...], dtype=np.float32)
  d = cfg.embed_dim
  t = {'backbone.embeddings.weight': f32(model.embed_vd),
       'backbone.norm_f.weight': f32(model.final_norm.scale)}
  t['lm_head.weight'] = (f32(model.embed_vd) if cfg.tie_embeddings else
                         f32(model.head_dv).T)
  out_in = lambda w: w.reshape(w.shape[0], -1).T        # ours [in, *out] -> torch
  for i, blk in enumerate(model.layer_views()):
    p = f'backbone.layers.{i}.'
    t[p + 'norm.weight'] = f32(blk.norm.scale)
    x = blk.mixer
    if blk.kind == MAMBA:
      t[p + 'mixer.in_proj.weight'] = np.concatenate([
          out_in(f32(x.w_z_dhp)), out_in(f32(x.w_x_dhp)),
          out_in(f32(x.w_b_dgn)), out_in(f32(x.w_c_dgn)), f32(x.w_dt_dh).T])
      k = mb.conv_kernel
      t[p + 'mixer.conv1d.weight'] = np.concatenate([
          f32(x.conv_x_khp).reshape(k, -1).T, f32(x.conv_b_kgn).reshape(k, -1).T,
          f32(x.conv_c_kgn).reshape(k, -1).T])[:, None, :]
      if mb.conv_bias:
        t[p + 'mixer.conv1d.bias'] = np.concatenate([
            f32(x.conv_bias_x_hp).ravel(), f32(x.conv_bias_b_gn).ravel(),
            f32(x.conv_bias_c_gn).ravel()])
      t[p + 'mixer.dt_bias'] = f32(x.dt_bias_h)
      t[p + 'mixer.A_log'] = f32(x.a_log_h)
      t[p + 'mixer.D'] = f32(x.d_h)
      t[p + 'mixer.norm.weight'] = f32(x.norm_hp).ravel()
      t[p + 'mixer.out_proj.weight'] = f32(x.w_out_hpd).reshape(-1, d).T
    elif blk.kind == ATTENTION:
      for name, w in (('q_proj', x.w_q_dnh), ('k_proj', x.w_k_dkh),
                      ('v_proj', x.w_v_dkh)):
        t[p + f'mixer.{name}.weight'] = out_in(f32(w))
      t[p + 'mixer.o_proj.weight'] = f32(x.w_o_nhd).reshape(-1, d).T
    elif blk.kind == MOE:
      t[p + 'mixer.gate.weight'] = f32(x.router_de).T
      t[p + 'mixer.gate.e_score_correction_bias'] = f32(x.expert_bias)
      for e in range(m.num_experts):
        t[p + f'mixer.experts.{e}.up_proj.weight'] = f32(x.w_gate_edf)[e].T
        t[p + f'mixer.experts.{e}.down_proj.weight'] = f32(x.w_down_efd)[e].T
      t[p + 'mixer.shared_experts.up_proj.weight'] = f32(x.shared.w_gate_df).T
      t[p + 'mixer.shared_experts.down_proj.weight'] = f32(x.shared.w_down_fd).T
    else:
      t[p + 'mixer.up_proj.weight'] = f32(x.w_gate_df).T
      t[p + 'mixer.down_proj.weight'] = f32(x.w_down_fd).T
  save_file({k: np.ascontiguousarray(v) for k, v in t.items()},
            os.path.join(path, 'model.safetensors'), metadata={'format': 'pt'})


__all__ = ['config_from_hf_nemotron_h', 'load_hf_nemotron_h',
           'save_hf_nemotron_h']
