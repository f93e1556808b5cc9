"""From rollouts to a training batch: sequences, targets, response masks, sampler log-probs."""

from __future__ import annotations

import numpy as np

from cascade_jax import rollout


def training_batch(prompt_bp: np.ndarray, prompt_len_b: np.ndarray,
                   ro: rollout.Rollout) -> dict[str, np.ndarray]:
  """The learner's view of a rollout batch, aligned with the sampler.

  The sequence is the left-padded prompt [B, P] followed by the response
  [B, N]; position t predicts token t + 1. Targets on response positions
  are the sampled tokens, with the response mask and the sampler's
  log-probs at the same places, so `logp[mask]` from a forward pass over
  `inputs` is directly comparable to `sampler_logp[mask]`.

  Returns:
    inputs, positions, segment_ids: [B, P + N - 1] (the last token is never
    an input); targets, mask, sampler_logp: [B, P + N - 1]; and, when the
    sampler recorded them, kept: [B, P + N - 1] the size of the top-k /
    top-p set each response token was drawn from (elsewhere the vocabulary).
  """
  b, p = prompt_bp.shape
  toks = np.asarray(ro.tokens)
  n = toks.shape[1]
  mask_r = np.asarray(ro.mask)
  seq = np.concatenate([prompt_bp, toks], axis=1)            # [B, P + N]
  pos = np.arange(p + n)[None, :] - (p - prompt_len_b[:, None])
  valid = np.concatenate([pos[:, :p] >= 0, mask_r > 0], axis=1)
  inputs, targets = seq[:, :-1], seq[:, 1:]
  mask = np.zeros((b, p + n - 1), np.int32)
  mask[:, p - 1:] = mask_r                                   # response targets
  lp = np.zeros((b, p + n - 1), np.float32)
  lp[:, p - 1:] = np.asarray(ro.logprobs)
  out = dict(inputs=inputs.astype(np.int32), targets=targets.astype(np.int32),
             positions=np.maximum(pos[:, :-1], 0).astype(np.int32),
             segment_ids=valid[:, :-1].astype(np.int32), mask=mask,
             sampler_logp=lp)
  if ro.kept is not None:
    kept_r = np.asarray(ro.kept)
    kept = np.full((b, p + n - 1), kept_r.max(initial=1), np.int32)
    kept[:, p - 1:] = np.where(mask_r > 0, kept_r, kept.max(initial=1))
    out['kept'] = kept
  return out
