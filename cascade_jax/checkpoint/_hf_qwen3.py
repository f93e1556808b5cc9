"""Hugging Face Qwen3-MoE checkpoints (config.json + safetensors) to and from our model."""

from __future__ import annotations

import json
import os
from typing import Any

import jax.numpy as jnp


from cascade_jax.checkpoint import _hf_stream
from cascade_jax.checkpoint._hf_stream import linear
from cascade_jax.checkpoint._hf_stream import same
from cascade_jax.checkpoint._safetensors import Files
from cascade_jax.model import abstract_model
from cascade_jax.model import ModelConfig
from cascade_jax.model import MoEConfig
from cascade_jax.model import Transformer
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


def sources(cfg: ModelConfig, files: Files | None = None
            ) -> dict[tuple, _hf_stream.Source]:
  """Where each of our variables comes from in a Qwen3-MoE checkpoint."""
  d, n, k, h = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  v = cfg.vocab_size
  top = {('embed_vd',): same('model.embed_tokens.weight', (v, d)),
         ('final_norm', 'scale'): same('model.norm.weight', (d,))}
  if not cfg.tie_embeddings:
    top[('head_dv',)] = linear('lm_head.weight', (v,), (d,))

  def layer(i: int, kind: str) -> dict[tuple, Any]:
    p = f'model.layers.{i // 2}.'
    if kind == '*':
      a = p + 'self_attn.'
      return {('norm', 'scale'): same(p + 'input_layernorm.weight', (d,)),
              ('mixer', 'w_q_dnh'): linear(a + 'q_proj.weight', (n, h), (d,)),
              ('mixer', 'w_k_dkh'): linear(a + 'k_proj.weight', (k, h), (d,)),
              ('mixer', 'w_v_dkh'): linear(a + 'v_proj.weight', (k, h), (d,)),
              ('mixer', 'w_o_nhd'): linear(a + 'o_proj.weight', (d,), (n, h)),
              ('mixer', 'q_norm', 'scale'): same(a + 'q_norm.weight', (h,)),
              ('mixer', 'k_norm', 'scale'): same(a + 'k_norm.weight', (h,))}
    out = {('norm', 'scale'): same(p + 'post_attention_layernorm.weight', (d,))}
    if kind == 'E':
      m = cfg.moe
      e, f = m.num_experts, m.expert_dim
      out[('mixer', 'router_de')] = linear(p + 'mlp.gate.weight', (e,), (d,))
      for name, ours, (o, i_) in (('gate_proj', 'w_gate_edf', ((f,), (d,))),
                                  ('up_proj', 'w_up_edf', ((f,), (d,))),
                                  ('down_proj', 'w_down_efd', ((d,), (f,)))):
        out[('mixer', ours)] = [
            linear(f'{p}mlp.experts.{j}.{name}.weight', o, i_)
            for j in range(e)]
    else:
      fd = cfg.mlp_dim
      out[('mixer', 'w_gate_df')] = linear(p + 'mlp.gate_proj.weight', (fd,), (d,))
      out[('mixer', 'w_up_df')] = linear(p + 'mlp.up_proj.weight', (fd,), (d,))
      out[('mixer', 'w_down_fd')] = linear(p + 'mlp.down_proj.weight', (d,), (fd,))
    return out

  return _hf_stream.stacked_sources(cfg, top, layer)


def read_config(path: str) -> dict[str, Any]:
  name = os.path.join(path, 'config.json')
  if not os.path.exists(name):
    raise FileNotFoundError(f'{path}: no config.json (not a Hugging Face '
                            'checkpoint directory)')
  with open(name) as f:
    return json.load(f)


def load_hf_qwen3_moe(path: str, *, dtype: str = 'float32',
                      dispatch: str = 'ragged',
                      ctx: ShardingCtx | None = None
                      ) -> tuple[ModelConfig, Transformer]:
  """Imports a directory written by transformers' `save_pretrained`.

  Streamed: every device's slice of every weight is read from the files
  straight into its sharding on `ctx`'s mesh (`_hf_stream.load`). Every
  weight the model needs must be present with the right shape, and every
  tensor in the files must be used: a mismatch names the keys.
  """
  cfg = config_from_hf(read_config(path), dtype=dtype, dispatch=dispatch)
  files = Files(path)
  model = abstract_model(cfg, ctx)
  return cfg, _hf_stream.load(files, sources(cfg, files), model,
                              ignored=lambda k: k.endswith(_IGNORED_SUFFIXES))


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


def hf_config(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
  """config.json of a Qwen3-MoE checkpoint of `cfg` stored in `dtype`."""
  _check_exportable(cfg)
  m = cfg.moe
  dense = [i for i in range(cfg.num_layers // 2) if cfg.pattern[2 * i + 1] == '-']
  return dict(
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
      dtype=dtype, torch_dtype=dtype)


def save_hf_qwen3_moe(cfg: ModelConfig, model: Transformer, path: str, *,
                      dtype: str = '', max_shard_bytes: int = 4 << 30
                      ) -> list[str]:
  """Writes config.json + safetensors shards that transformers can load,
  a tensor at a time (`_hf_stream.save`), in `dtype` ('' keeps the
  model's). Returns the weight files written."""
  dtype = dtype or cfg.param_dtype
  hf = hf_config(cfg, dtype)
  os.makedirs(path, exist_ok=True)
  files = _hf_stream.save(sources(cfg), model, path, dtype=jnp.dtype(dtype),
                          max_shard_bytes=max_shard_bytes)
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(hf, f, indent=2)
  return files
