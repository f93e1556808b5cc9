"""The sampler's forward pass: the model over a KV cache, its experts laid out for decoding.

`forward` runs a `Transformer`'s layers for generation (a prefill, then one
token a step), with what only the sampler needs: the MoE experts in a
layout chosen once per generation (`decode_weights` / `decode_forward`,
exact: nothing dropped), rotary tables computed outside the decode loop and
the prefill's logits for its last position alone. Training and scoring call
the model itself; both compute the same function (tests/test_rollout.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from cascade_jax import model as model_lib
from cascade_jax import ops


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DecodeWeights:
  """One MoE layer's experts laid out for a generation that decodes N tokens a step.

  One of three layouts, chosen by `decode_weights`:
  - `kernel` (XLA:CPU, fp32, where `ops` picks the CPU kernel): the stacked
    weights themselves (no copy), for the sparse CPU kernel
    (`ops.moe_ffn`), which computes only the chosen (token, expert) pairs;
  - `per_expert` (no more (token, choice) pairs than experts): expert e's
    (gate [D, F], up [D, F] or None, down [F, D]) as separate arrays, so
    that a step reads the chosen experts' weights alone;
  - `flat` (otherwise): (gate [D, E, F], up [D, E, F] or None,
    down [E, F, D]), i.e. `dense`'s two flat matmuls ([N, D] @ [D, E*F]).
  `per_expert` and `flat` are laid out once per generation, so that neither
  the prefill nor any step transposes or copies weights; each is itself a
  copy of the layer's expert weights, held while the generation runs
  (sharded models decode with `MESH_DISPATCH` in `shard_map` and lay out
  nothing).
  """
  kernel: tuple[jax.Array, jax.Array | None, jax.Array] | None = None
  per_expert: tuple[tuple[jax.Array, jax.Array | None, jax.Array], ...] | None = None
  flat: tuple[jax.Array, jax.Array | None, jax.Array] | None = None
  # With `flat`: the stacked [E, D, F] weights themselves (not a copy), for
  # a prefill's many tokens (see `decode_forward`).
  stacked: tuple[jax.Array, jax.Array | None, jax.Array] | None = None


def decode_weights(ws, num_tokens: int, top_k: int, *, act: str,
                   use_kernel: bool = True) -> DecodeWeights:
  """Lays out (w_gate [E, D, F], w_up or None, w_down [E, F, D]) for `decode_forward`.

  The `kernel` layout where `ops.moe_decode_uses_kernel` picks the CPU
  kernel (never where it is slower than XLA here); `use_kernel=False` keeps
  to XLA's ops even then.
  """
  w_gate, w_up, w_down = ws
  if use_kernel and ops.moe_decode_uses_kernel(act, w_gate.dtype):
    return DecodeWeights(kernel=tuple(ws))
  num_experts = w_gate.shape[0]
  if num_tokens * top_k <= num_experts:
    return DecodeWeights(per_expert=tuple(
        (w_gate[e], None if w_up is None else w_up[e], w_down[e])
        for e in range(num_experts)))
  swap = lambda w: w.transpose(1, 0, 2)
  return DecodeWeights(flat=(swap(w_gate),
                             None if w_up is None else swap(w_up), w_down),
                       stacked=tuple(ws))


PREFILL_ROWS_PER_EXPERT = 64

# A sharded model's MoE layers in the sampler: `ragged`, each (token,
# choice) pair sent to its expert's shard and back (`ragged_all_to_all` on
# GPU / TPU, all-gathered tokens on CPU: `ops.expert_exchange`), grouped
# matmuls over the chosen experts' rows; exact (no drops), unlike `dense`,
# which runs every local expert on every token of the expert group.
MESH_DISPATCH = 'ragged'


def decode_forward(x_nd, idx_nk, w_nk, dw: DecodeWeights, *, act: str,
                   valid_n=None):
  """Exact (dropless) weighted expert outputs for N tokens, from `decode_weights`.

  - `kernel`: `ops.moe_ffn`, the CPU kernel, the chosen pairs alone, for
    the prefill and every step (bench_rollout's model, one layer's decode
    step at batch 16: 0.16-0.18 ms against 0.63-0.66 ms with `flat`).
  - `flat` weights: the `dense` path without its weight transpose; for a
    prefill's many tokens (at least PREFILL_ROWS_PER_EXPERT (token, choice)
    pairs per expert) the `capacity` path's per-expert blocks on the stacked
    weights instead, twice the mean load per expert: a quarter to half of
    dense's work (batch 64 x 32 prompt tokens: the fixed cost of a
    generation 158 -> 117 ms). When some expert gets more tokens than
    that, the step falls back to dense (`lax.cond`), so nothing is dropped;
    padding tokens (`valid_n` False) take no block row and get 0.
  - `per_expert` weights: each expert that some token chose runs on all N
    tokens, the others are skipped (`lax.cond`), so only the chosen experts'
    weights are read: at batch 1 with 8 experts top-2, a quarter of them.
    At batch 4 a decode step is still ~1.1x faster than with `flat`; at
    batch 8, where nearly every expert is chosen, no faster, so
    `decode_weights` lays out `flat` there.

  Args:
    x_nd: [N, D] tokens; idx_nk / w_nk: [N, k] chosen experts, gate weights.
    dw: the layer's `decode_weights`.
    valid_n: [N] bool, False for padding; None: every token is real.

  Returns:
    [N, D], the `dense` path's output (up to float rounding) for every real
    token.
  """
  if dw.kernel is not None:
    return ops.moe_ffn(x_nd, idx_nk, w_nk, *dw.kernel, act=act)
  if dw.flat is not None:
    w_gate, w_up, w_down = dw.flat
    d, num_experts, f = w_gate.shape
    flat = lambda w: w.reshape(d, num_experts * f)  # a bitcast, not a copy
    dense = lambda: model_lib.flat_mlp(
        x_nd, model_lib.combine_weights(idx_nk, w_nk, num_experts), flat(w_gate),
        None if w_up is None else flat(w_up),
        w_down.reshape(num_experts * f, d), act)
    n, k = idx_nk.shape
    if n * k < PREFILL_ROWS_PER_EXPERT * num_experts:
      return dense()
    cap = model_lib.expert_capacity(n, k, num_experts,
                                    model_lib.DROPLESS_CAPACITY_FACTOR)
    return model_lib.dropless_experts(x_nd, idx_nk, w_nk, dw.stacked, act,
                                      num_experts, cap, (), (), valid_n,
                                      dense=dense)[0]
  comb = model_lib.combine_weights(idx_nk, w_nk, len(dw.per_expert)).astype(x_nd.dtype)
  chosen = jnp.any(comb != 0, axis=0)
  out = jnp.zeros_like(x_nd)
  for e, (w_gate, w_up, w_down) in enumerate(dw.per_expert):
    def add_expert(y, e=e, w_gate=w_gate, w_up=w_up, w_down=w_down):
      h = model_lib.activation(act, x_nd @ w_gate,
                              None if w_up is None else x_nd @ w_up)
      return y + (h @ w_down) * comb[:, e:e + 1]
    out = jax.lax.cond(chosen[e], add_expert, lambda y: y, out)
  return out


def model_decode_weights(model, num_tokens: int, *, use_kernel: bool = True
                         ) -> list[DecodeWeights | None]:
  """Every MoE layer's experts laid out for decoding `num_tokens` a step.

  Computed once per generation, outside the decode loop. None for a
  sharded model's layers (they decode with `MESH_DISPATCH` inside
  `shard_map`, on the weights as the model holds them: the sampler's copy
  is already in the inference layout, `rl.SamplerWeights`).
  """
  dt = jnp.dtype(model.cfg.dtype)
  return [None if moe.ctx is not None else
          decode_weights(moe.expert_weights(dt), num_tokens, moe.cfg.top_k,
                         act=moe.cfg.activation, use_kernel=use_kernel)
          for moe in model.moe_layers()]


def moe_step(moe, x_nd, layout: DecodeWeights | None, valid_n=None,
             expert_idx_nk=None):
  """One MoE layer as the sampler runs it: router, experts in `layout`, shared expert.

  `layout` None (a sharded model): `MESH_DISPATCH` in `shard_map`.
  `expert_idx_nk` replays a routing instead of the router's.

  Returns:
    (y [N, D], chosen experts [N, k]).
  """
  _, _, idx_nk, w_nk = moe.route_tokens(x_nd, expert_idx_nk)
  if layout is None:
    y_nd = moe.experts(x_nd, idx_nk, w_nk, valid_n,
                       dispatch=MESH_DISPATCH)[0]
  else:
    y_nd = decode_forward(x_nd, idx_nk, w_nk, layout, act=moe.cfg.activation,
                          valid_n=valid_n)
  if moe.shared is not None:
    y_nd = y_nd + moe.shared(x_nd)
  return y_nd, idx_nk


def forward(model, tokens_bt, *, positions_bt, segment_ids_bt,
            cache: model_lib.KVCache,
            layouts: Sequence[DecodeWeights | None],
            rope_cs: tuple[jax.Array, jax.Array] | None = None,
            last_logits_only: bool = False, carry_mamba: bool = False,
            fresh: bool = False
            ) -> tuple[jax.Array, model_lib.KVCache, jax.Array | None]:
  """The model over `cache`: writes the tokens' keys / values (and Mamba states), returns the logits.

  Args:
    model: a `Transformer`.
    tokens_bt, positions_bt, segment_ids_bt: [B, T] (segment 0: padding).
    cache: the KV cache, written at `cache.index`.
    layouts: `model_decode_weights(model, B)`, one per MoE layer.
    rope_cs: `rope_tables` of `positions_bt`, if computed already (the
      decode loop computes every step's outside the loop).
    last_logits_only: the logits of the last position alone (a prefill).
    carry_mamba: one token a row (T = 1) continuing each row's Mamba states
      whatever the cache's last segment: a row fed padding (segment 0)
      keeps its states unchanged, a row fed a token continues them (no
      restart). Multi-turn sampling, where empty slots sit between a row's
      tokens, uses it; the default restarts the states where the segment
      changes (packed prefill).
    fresh: the cache holds nothing yet (a prefill of new prompts): the
      attention layers attend over the tokens themselves
      (`ops.prefill_attention`; on GPU / TPU a fused kernel).

  Returns:
    (logits [B, T or 1, V] fp32, the updated cache, experts chosen
    [B, T, L_moe, k] or None without MoE layers).
  """
  cfg = model.cfg
  b, t = tokens_bt.shape
  x = model.embed(tokens_bt)
  cache_pos, cache_seg = cache.written(positions_bt, segment_ids_bt)
  if rope_cs is None and cfg.use_rope:
    rope_cs = model_lib.rope_tables(positions_bt, cfg.head_dim, cfg.rope_theta)
  mask = model_lib.attention_mask(positions_bt, segment_ids_bt, cache_pos,
                                  cache_seg)
  valid_n = (segment_ids_bt != 0).reshape(b * t)
  reset_bt = None
  if model_lib.MAMBA in cfg.pattern:
    if carry_mamba:
      if t != 1:
        raise ValueError(f'carry_mamba feeds one token a row, got {t}')
      reset_bt = jnp.zeros((b, 1), bool)
    else:
      reset_bt = model_lib.mamba_resets(segment_ids_bt, cache.last_segment())
  new_k, new_v, experts, states = [], [], [], []
  for blk in model.layer_views():
    h = blk.norm(x)
    if blk.kind == model_lib.ATTENTION:
      a = len(new_k)
      h, (kk, vv) = blk.mixer(
          h, positions_bt=positions_bt, segment_ids_bt=segment_ids_bt,
          kv_cache=(cache.k[a], cache.v[a]), cache_index=cache.index,
          cache_positions_bs=cache_pos, cache_segment_ids_bs=cache_seg,
          rope_cs=rope_cs, mask_bts=mask, fresh_cache=fresh)
      new_k.append(kk)
      new_v.append(vv)
    elif blk.kind == model_lib.MOE:
      y_nd, idx_nk = moe_step(blk.mixer, h.reshape(b * t, -1),
                              layouts[len(experts)], valid_n)
      h = y_nd.reshape(b, t, -1)
      experts.append(idx_nk.reshape(b, t, -1))
    elif blk.kind == model_lib.MAMBA:
      old = cache.mamba[len(states)]
      h, st = blk.mixer(h, reset_bt=reset_bt, state=old)
      if carry_mamba:
        fed = segment_ids_bt[:, 0] != 0
        st = jax.tree.map(
            lambda new, prev: jnp.where(
                fed.reshape((b,) + (1,) * (new.ndim - 1)), new, prev),
            st, old)
      states.append(st)
    else:
      h = blk.mixer(h.reshape(b * t, -1)).reshape(b, t, -1)
    x = model.constrain(x + h)
  logits = model.unembed(x[:, -1:] if last_logits_only else x)
  new_cache = model_lib.KVCache(k=tuple(new_k), v=tuple(new_v),
                                positions=cache_pos, segment_ids=cache_seg,
                                index=cache.index + t, mamba=tuple(states))
  return logits, new_cache, jnp.stack(experts, axis=2) if experts else None


__all__ = ['DecodeWeights', 'decode_forward', 'decode_weights', 'forward',
           'MESH_DISPATCH', 'model_decode_weights', 'moe_step',
           'PREFILL_ROWS_PER_EXPERT']
