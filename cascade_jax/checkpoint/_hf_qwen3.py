"""Hugging Face Qwen3-MoE checkpoints (config.json + safetensors) to and from our model."""

from __future__ import annotations

import json
import os
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from cascade_jax.model import ModelConfig
from cascade_jax.model import MoEConfig
from cascade_jax.model import Transformer
from cascade_jax.sharding import shard_model
from cascade_jax.sharding import ShardingCtx

_IGNORED_SUFFIXES = ('rotary_emb.inv_freq',)


def config_from_hf(hf: dict[str, Any], *, dtype: str = 'float32',
                   dispatch: str = 'ragged') -> ModelConfig:
  """Maps a Qwen3-MoE config.json (transformers 4.x or 5.x keys) to ModelConfig."""
  if hf.get('model_type') != 'qwen3_moe':
    raise ValueError(f"config.json: model_type {hf.get('model_type')!r} is not "
                     "'qwen3_moe'")
  rope = hf.get('rope_parameters') or hf.get('rope_scaling') or {}
  rope_type = rope.get('rope_type', rope.get('type', 'default'))
  if rope_type != 'default':
    raise ValueError(f'config.json: rope type {rope_type!r} is not supported '
                     '(only default RoPE)')
  if hf.get('attention_bias'):
    raise ValueError('config.json: attention_bias=True is not supported')
  if hf.get('use_sliding_window'):
    raise ValueError('config.json: sliding-window attention is not supported')
  n_layers = hf['num_hidden_layers']
  num_experts = hf.get('num_experts', hf.get('num_local_experts'))
  step = hf.get('decoder_sparse_step', 1)
  dense_layers = set(hf.get('mlp_only_layers') or [])
  pattern = ''
  for i in range(n_layers):
    sparse = num_experts and i not in dense_layers and (i + 1) % step == 0
    pattern += '*E' if sparse else '*-'
  return ModelConfig(
      vocab_size=hf['vocab_size'], embed_dim=hf['hidden_size'],
      pattern=pattern, num_heads=hf['num_attention_heads'],
      num_kv_heads=hf['num_key_value_heads'],
      head_dim=hf.get('head_dim') or
      hf['hidden_size'] // hf['num_attention_heads'],
      mlp_dim=hf.get('intermediate_size', 0), mlp_activation='swiglu',
      moe=MoEConfig(num_experts=num_experts, top_k=hf['num_experts_per_tok'],
                    expert_dim=hf['moe_intermediate_size'],
                    activation='swiglu', score_fn='softmax',
                    renormalize=bool(hf.get('norm_topk_prob', False)),
                    dispatch=dispatch),
      use_rope=True,
      rope_theta=float(rope.get('rope_theta', hf.get('rope_theta', 10_000.0))),
      qk_norm=True, tie_embeddings=bool(hf.get('tie_word_embeddings', False)),
      norm_eps=hf.get('rms_norm_eps', 1e-6), dtype=dtype, param_dtype=dtype)


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
  index = os.path.join(path, 'model.safetensors.index.json')
  if os.path.exists(index):
    with open(index) as f:
      files = sorted(set(json.load(f)['weight_map'].values()))
  else:
    files = ['model.safetensors']
  out = {}
  for name in files:
    full = os.path.join(path, name)
    if not os.path.exists(full):
      raise FileNotFoundError(f'{path}: missing weights file {name}')
    with safe_open(full, framework='flax') as f:
      for key in f.keys():
        out[key] = np.asarray(f.get_tensor(key).astype(jnp.float32))
  return out


def _weight_map(cfg: ModelConfig, model: Transformer, layers: list):
  """(hf key, our variable, hf -> ours array transform) for every weight.

  `layers`: `model.layer_views()` (the per-layer Blocks the layer weights
  are read from or written into).
  """
  d, n, k, h = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  entries = [('model.embed_tokens.weight', model.embed_vd, lambda w: w),
             ('model.norm.weight', model.final_norm.scale, lambda w: w)]
  if not cfg.tie_embeddings:
    entries.append(('lm_head.weight', model.head_dv, lambda w: w.T))
  for i in range(cfg.num_layers // 2):
    attn, ffn = layers[2 * i], layers[2 * i + 1]
    p = f'model.layers.{i}.'
    a = attn.mixer
    entries += [
        (p + 'input_layernorm.weight', attn.norm.scale, lambda w: w),
        (p + 'post_attention_layernorm.weight', ffn.norm.scale, lambda w: w),
        (p + 'self_attn.q_proj.weight', a.w_q_dnh, lambda w: w.T.reshape(d, n, h)),
        (p + 'self_attn.k_proj.weight', a.w_k_dkh, lambda w: w.T.reshape(d, k, h)),
        (p + 'self_attn.v_proj.weight', a.w_v_dkh, lambda w: w.T.reshape(d, k, h)),
        (p + 'self_attn.o_proj.weight', a.w_o_nhd, lambda w: w.T.reshape(n, h, d)),
        (p + 'self_attn.q_norm.weight', a.q_norm.scale, lambda w: w),
        (p + 'self_attn.k_norm.weight', a.k_norm.scale, lambda w: w),
    ]
    f = ffn.mixer
    if ffn.kind == 'E':
      entries.append((p + 'mlp.gate.weight', f.router_de, lambda w: w.T))
      for name, var in (('gate_proj', f.w_gate_edf), ('up_proj', f.w_up_edf),
                        ('down_proj', f.w_down_efd)):
        keys = [f'{p}mlp.experts.{e}.{name}.weight'
                for e in range(cfg.moe.num_experts)]
        entries.append((keys, var, lambda ws: np.stack([w.T for w in ws])))
    else:
      entries += [(p + 'mlp.gate_proj.weight', f.w_gate_df, lambda w: w.T),
                  (p + 'mlp.up_proj.weight', f.w_up_df, lambda w: w.T),
                  (p + 'mlp.down_proj.weight', f.w_down_fd, lambda w: w.T)]
  return entries


def load_hf_qwen3_moe(path: str, *, dtype: str = 'float32',
                      dispatch: str = 'ragged',
                      ctx: ShardingCtx | None = None
                      ) -> tuple[ModelConfig, Transformer]:
  """Imports a directory written by transformers' `save_pretrained`.

  Every weight the model needs must be present with the right shape, and
  every tensor in the files must be used: a mismatch names the keys.
  """
  with open(os.path.join(path, 'config.json')) as f:
    cfg = config_from_hf(json.load(f), dtype=dtype, dispatch=dispatch)
  tensors = _read_safetensors(path)
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0), ctx=ctx))
  used = set()
  missing = []
  views = model.layer_views()
  for key, var, to_ours in _weight_map(cfg, model, views):
    keys = key if isinstance(key, list) else [key]
    absent = [k_ for k_ in keys if k_ not in tensors]
    if absent:
      missing += absent
      continue
    used.update(keys)
    arrs = [tensors[k_] for k_ in keys]
    try:
      value = to_ours(arrs if isinstance(key, list) else arrs[0])
    except ValueError as e:  # a reshape that cannot fit
      raise ValueError(f'{path}: {keys[0]} has shape {arrs[0].shape}, which '
                       f'does not convert to the model\'s {var.shape}') from e
    if value.shape != var.shape:
      raise ValueError(f'{path}: {keys[0]} has shape {value.shape} after '
                       f'conversion, the model expects {var.shape}')
    var.set_value(jnp.asarray(value, dtype=var.dtype))
  if missing:
    raise ValueError(f'{path}: checkpoint lacks {len(missing)} weights the '
                     f'model needs, e.g. {missing[:5]}')
  unused = sorted(k_ for k_ in tensors if k_ not in used
                  and not k_.endswith(_IGNORED_SUFFIXES))
  if unused:
    raise ValueError(f'{path}: {len(unused)} tensors do not fit the model, '
                     f'e.g. {unused[:5]}')
  model.set_layers(views)
  return cfg, (model if ctx is None else shard_model(model, ctx))


def _check_exportable(cfg: ModelConfig) -> None:
  m = cfg.moe
  problems = []
  pairs = [cfg.pattern[i:i + 2] for i in range(0, len(cfg.pattern), 2)]
  if len(cfg.pattern) % 2 or any(p not in ('*E', '*-') for p in pairs):
    problems.append(f"pattern {cfg.pattern!r} is not a sequence of '*E' / '*-'")
  if not (cfg.use_rope and cfg.qk_norm):
    problems.append('Qwen3 needs use_rope and qk_norm')
  if cfg.mlp_activation != 'swiglu':
    problems.append('dense layers must be SwiGLU')
  if m is not None and (m.score_fn != 'softmax' or m.activation != 'swiglu'
                        or m.routed_scale != 1.0 or m.use_expert_bias
                        or m.num_shared_experts):
    problems.append('MoE must be softmax-routed SwiGLU experts with no '
                    'scale, bias or shared expert')
  if problems:
    raise ValueError('model cannot be exported as Qwen3-MoE: ' +
                     '; '.join(problems))


def save_hf_qwen3_moe(cfg: ModelConfig, model: Transformer, path: str) -> None:
  """Writes config.json + model.safetensors that transformers can load."""
  _check_exportable(cfg)
  os.makedirs(path, exist_ok=True)
  m = cfg.moe
  dense = [i for i in range(cfg.num_layers // 2) if cfg.pattern[2 * i + 1] == '-']
  hf = dict(
      architectures=['Qwen3MoeForCausalLM'], model_type='qwen3_moe',
      vocab_size=cfg.vocab_size, hidden_size=cfg.embed_dim,
      num_hidden_layers=cfg.num_layers // 2,
      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim, intermediate_size=cfg.mlp_dim or 1,
      moe_intermediate_size=m.expert_dim if m else 1,
      num_experts=m.num_experts if m else 0,
      num_local_experts=m.num_experts if m else 0,
      num_experts_per_tok=m.top_k if m else 1,
      norm_topk_prob=bool(m and m.renormalize), decoder_sparse_step=1,
      mlp_only_layers=dense, rms_norm_eps=cfg.norm_eps,
      rope_theta=cfg.rope_theta,
      rope_parameters={'rope_type': 'default', 'rope_theta': cfg.rope_theta},
      tie_word_embeddings=cfg.tie_embeddings, attention_bias=False,
      hidden_act='silu', max_position_embeddings=32_768,
      dtype=cfg.param_dtype, torch_dtype=cfg.param_dtype)
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(hf, f, indent=2)
  tensors = {}
  for key, var, _ in _weight_map(cfg, model, model.layer_views()):
    w = np.asarray(var[...], dtype=np.float32)
    if isinstance(key, list):  # stacked experts [E, in, out] -> E x [out, in]
      for k_, w_e in zip(key, w):
        tensors[k_] = np.ascontiguousarray(w_e.T)
    elif w.ndim == 3:          # [D, N, H] / [N, H, D] -> torch [out, in]
      tensors[key] = np.ascontiguousarray(
          w.reshape(w.shape[0], -1).T if key.endswith(('q_proj.weight',
                                                        'k_proj.weight',
                                                        'v_proj.weight'))
          else w.reshape(-1, w.shape[-1]).T)
    elif w.ndim == 2 and not key.endswith('embed_tokens.weight'):
      tensors[key] = np.ascontiguousarray(w.T)
    else:
      tensors[key] = w
  save_file(tensors, os.path.join(path, 'model.safetensors'),
            metadata={'format': 'pt'})
