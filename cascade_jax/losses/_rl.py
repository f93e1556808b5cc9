"""Pure RL losses: group advantages, GRPO, multi-domain on-policy distillation (MOPD).

Arrays in, arrays out: no model, no config objects. Each loss returns the
scalar loss and a dict of metrics, including `loss_sum` and `token_count`,
so a caller accumulating gradients over micro-batches can reproduce the
full-batch token-level loss exactly (sum the sums, divide once).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def group_advantages(rewards: Array, group_size: int, *, scale: str = 'std',
                     leave_one_out: bool = False, eps: float = 1e-6) -> Array:
  """Per-rollout advantages from rewards of G rollouts per prompt.

  Rewards come in contiguous groups: rewards[g * G:(g + 1) * G] are prompt
  g's rollouts. With baseline b_i (the group mean, or with leave_one_out the
  mean of the other G - 1 rewards):

    A_i = (r_i - b_i) / (std(r_group) + eps)     scale='std'  (GRPO)
    A_i =  r_i - b_i                             scale='none' (Dr. GRPO)

  Args:
    rewards: Float[Array, 'n'] with n a multiple of group_size.
    group_size: G.
    scale: 'std' or 'none'.
    leave_one_out: use the other rollouts' mean as the baseline (RLOO).
    eps: added to the std.

  Returns:
    Float[Array, 'n'] advantages.

  >>> group_advantages(jnp.array([1., 0., 0., 0.]), 4, scale='none')
  Array([ 0.75, -0.25, -0.25, -0.25], dtype=float32)
  """
  if rewards.ndim != 1 or rewards.shape[0] % group_size:
    raise ValueError(f'rewards must be [n] with n a multiple of group_size='
                     f'{group_size}, got shape {rewards.shape}')
  if scale not in ('std', 'none'):
    raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
  r = rewards.astype(jnp.float32).reshape(-1, group_size)
  if leave_one_out:
    if group_size < 2:
      raise ValueError('leave_one_out needs group_size >= 2')
    base = (r.sum(-1, keepdims=True) - r) / (group_size - 1)
  else:
    base = r.mean(-1, keepdims=True)
  adv = r - base
  if scale == 'std':
    adv = adv / (r.std(-1, keepdims=True) + eps)
  return adv.reshape(-1)


def _normalise(per_token: Array, mask: Array, how: str,
               num_tokens: Array | None = None,
               num_sequences: Array | None = None):
  """(loss, sum, token count) of per-token values over the mask.

  'token': the sum over every masked token, over their count. 'sequence':
  each row's token mean, averaged over the rows that have tokens. Given the
  whole batch's `num_tokens` / `num_sequences`, a micro-batch of it
  divides by those instead of its own counts: its loss is then its share,
  and the micro-batches' losses add up to the batch's.
  """
  m = mask.astype(jnp.float32)
  total = jnp.sum(per_token * m)
  count = jnp.sum(m)
  if how == 'token':
    denom = count if num_tokens is None else num_tokens
    loss = total / jnp.maximum(denom, 1.0)
  elif how == 'sequence':
    lengths = jnp.maximum(m.sum(-1), 1.0)
    has = (m.sum(-1) > 0).astype(jnp.float32)
    denom = has.sum() if num_sequences is None else num_sequences
    loss = jnp.sum((per_token * m).sum(-1) / lengths * has) / jnp.maximum(
        denom, 1.0)
  else:
    raise ValueError(f"normalize must be 'token' or 'sequence', got {how!r}")
  return loss, total, count


def grpo_loss(logp: Array, advantages: Array, mask: Array, *,
              old_logp: Array | None = None, ref_logp: Array | None = None,
              sampler_logp: Array | None = None, clip_eps_low: float = 0.2,
              clip_eps_high: float = 0.2, kl_coef: float = 0.0,
              tis_cap: float | None = None, sampler_mask: bool = False,
              normalize: str = 'token',
              num_tokens: Array | None = None,
              num_sequences: Array | None = None):
  """The GRPO surrogate with token-level normalisation (the paper's default).

  With ratio rho_t = pi(o_t) / pi_old(o_t) and per-rollout advantage A:

    L = -(1 / sum_i |o_i|) sum_i sum_t [ w_t min(rho_t A_i,
          clip(rho_t, 1 - eps_low, 1 + eps_high) A_i) - beta k3_t ]

  k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1 (unbiased, >= 0) and
  w_t = stopgrad(min(pi_old / pi_sampler, tis_cap)) is the truncated
  importance weight against the sampler (1 when not asked for); with
  `sampler_mask`, w_t is 1 where pi_old / pi_sampler is within
  [1 / tis_cap, tis_cap] and 0 elsewhere (the token is dropped). Without
  `old_logp` the ratio is exactly 1 (strictly on-policy: one update per
  batch) and the gradient is the REINFORCE estimate -A grad log pi / N.
  normalize='sequence' averages per-sequence token means instead.

  On a micro-batch of a larger batch, pass the whole batch's `num_tokens`
  (masked tokens) and `num_sequences` (rows with any): the loss and every
  mean metric are then this micro-batch's share of the batch's, and summing
  the micro-batches' values gives the batch's (gradient accumulation that
  does not change the objective).

  Args:
    logp: Float[Array, 'b t'] log pi(o_t) under the policy being trained.
    advantages: Float[Array, 'b'], or Float[Array, 'b t'] per position (a
      packed batch: several sequences a row).
    mask: Int[Array, 'b t'] 1 on response tokens.
    old_logp, ref_logp, sampler_logp: Float[Array, 'b t'] or None.

  Returns:
    (loss, metrics) with metrics loss_sum, token_count, clip_fraction, kl,
    ratio_mean; with `sampler_logp` also is_weight_mean (w_t's mean) and
    is_cut_fraction (the tokens truncated, or masked).

  >>> logp = jnp.log(jnp.array([[0.5, 0.25]]))
  >>> loss, m = grpo_loss(logp, jnp.array([2.0]), jnp.array([[1, 1]]))
  >>> float(loss), float(m['token_count'])   # -(2 + 2) / 2 at ratio 1
  (-2.0, 2.0)
  """
  logp = logp.astype(jnp.float32)
  adv = advantages.astype(jnp.float32)
  adv = adv if adv.ndim == 2 else adv[:, None]   # per position, or per row
  old = jax.lax.stop_gradient(logp if old_logp is None else old_logp)
  ratio = jnp.exp(logp - old)
  clipped = jnp.clip(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
  surrogate = jnp.minimum(ratio * adv, clipped * adv)
  m = mask.astype(jnp.float32)
  n = jnp.maximum(m.sum() if num_tokens is None else num_tokens, 1.0)
  extra = {}
  if sampler_logp is not None:
    w = jnp.exp(old - sampler_logp)
    if sampler_mask:
      if tis_cap is None:
        raise ValueError('grpo_loss: sampler_mask needs tis_cap (the bound)')
      out = (w > tis_cap) | (w < 1.0 / tis_cap)
      w = jnp.where(out, 0.0, 1.0)
    elif tis_cap is not None:
      out = w > tis_cap
      w = jnp.minimum(w, tis_cap)
    else:
      out = jnp.zeros(w.shape, bool)
    extra = dict(is_weight_mean=jnp.sum(w * m) / n,
                 is_cut_fraction=jnp.sum(out * m) / n)
    surrogate = jax.lax.stop_gradient(w) * surrogate
  per_token = -surrogate
  kl = jnp.zeros_like(logp)
  if ref_logp is not None:
    d = ref_logp - logp
    kl = jnp.exp(d) - d - 1.0
    per_token = per_token + kl_coef * kl
  loss, total, count = _normalise(per_token, mask, normalize, num_tokens,
                                  num_sequences)
  was_clipped = (clipped * adv) < (ratio * adv)   # min took the clipped term
  metrics = dict(loss_sum=total, token_count=count,
                 clip_fraction=jnp.sum(was_clipped * m) / n,
                 kl=jnp.sum(kl * m) / n, ratio_mean=jnp.sum(ratio * m) / n,
                 **extra)
  return loss, metrics


def mopd_loss(logp: Array, teacher_logp: Array, sampler_logp: Array,
              mask: Array, *, trunc_low: float = 0.5, trunc_high: float = 2.0,
              reward_advantages: Array | None = None,
              reward_weight: float = 0.0, num_tokens: Array | None = None,
              num_sequences: Array | None = None):
  """Multi-domain on-policy distillation on the student's own samples.

  Per sampled token t (s_t = prompt + y_<t):

    a_t = log pi_teacher(y_t | s_t) - log pi_train(y_t | s_t)   (stopgrad)
    r_t = pi_train(y_t | s_t) / pi_inf(y_t | s_t)
    w_t = stopgrad(r_t) * 1[trunc_low <= r_t <= trunc_high]
    L   = -mean_seq [ (1 / |V(y)|) sum_{t in V(y)} w_t (a_t + lambda A) log pi_train(y_t | s_t) ]

  a_t is a one-sample estimate of the negative reverse KL to the teacher:
  minimising L moves pi_train towards the teacher on its own samples. An
  optional outcome advantage A (per sequence) is blended in with weight
  lambda (reward_weight; the paper uses 0).

  Args:
    logp: Float[Array, 'b t'] student log-probs (differentiated).
    teacher_logp: Float[Array, 'b t'] the domain teacher's log-probs.
    sampler_logp: Float[Array, 'b t'] log-probs the sampler drew with.
    mask: Int[Array, 'b t'] valid response tokens V(y).
    reward_advantages: Float[Array, 'b'] or None.
    num_tokens, num_sequences: the whole batch's counts when this is a
      micro-batch of it (see `grpo_loss`).

  Returns:
    (loss, metrics): reverse_kl (mean a_t estimate, sign flipped), weight
    mean, truncated fraction, loss_sum, token_count.

  >>> lp = jnp.log(jnp.array([[0.5, 0.5]]))
  >>> loss, m = mopd_loss(lp, jnp.log(jnp.array([[0.25, 1.0]])), lp,
  ...                     jnp.array([[1, 1]]))
  >>> abs(round(float(m['reverse_kl']), 4))   # -(log .5 + log 2) / 2 = 0
  0.0
  """
  logp = logp.astype(jnp.float32)
  m = mask.astype(jnp.float32)
  adv = jax.lax.stop_gradient(teacher_logp - logp)
  ratio = jax.lax.stop_gradient(jnp.exp(logp - sampler_logp))
  keep = (ratio >= trunc_low) & (ratio <= trunc_high)
  w = ratio * keep
  signal = adv
  if reward_advantages is not None and reward_weight:
    signal = signal + reward_weight * reward_advantages[:, None]
  per_token = -(w * signal * logp)
  loss, total, count = _normalise(per_token, mask, 'sequence', num_tokens,
                                  num_sequences)
  n = jnp.maximum(m.sum() if num_tokens is None else num_tokens, 1.0)
  metrics = dict(loss_sum=total, token_count=count,
                 reverse_kl=-jnp.sum(adv * m) / n,
                 weight_mean=jnp.sum(w * m) / n,
                 truncated_fraction=jnp.sum((~keep) * m) / n)
  return loss, metrics
