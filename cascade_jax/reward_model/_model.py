"""A Bradley-Terry reward model: the policy's backbone with a scalar head, trained on preference pairs.

    r(x, y)    = w . h_last(x, y) + b      h_last: final hidden state at the
                                           response's closing <|im_end|>
    loss       = -mean log sigmoid(r(x, y_chosen) - r(x, y_rejected))
    accuracy   = mean [r(x, y_chosen) > r(x, y_rejected)]     (held out)

The stage (`train`) starts from a run's checkpoint (SFT), trains backbone and
head together, saves with Orbax, and reports held-out pairwise accuracy.
`load` turns the run directory into a reward function with the learner's
`RewardFn` interface: (records, responses) -> rewards [B].
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from cascade_jax import checkpoint
from cascade_jax import data
from cascade_jax import domains
from cascade_jax import losses
from cascade_jax import metrics as metrics_lib
from cascade_jax import model as model_lib
from cascade_jax import train


class RewardModel(nnx.Module):
  """Transformer backbone + scalar head on the last token's hidden state."""

  def __init__(self, backbone: model_lib.Transformer, *, rngs: nnx.Rngs):
    self.backbone = backbone
    d = backbone.cfg.embed_dim
    self.head_d = nnx.Param(jax.random.normal(rngs.params(), (d,)) * d ** -0.5)
    self.bias = nnx.Param(jnp.zeros(()))

  def __call__(self, tokens_bt: jax.Array, last_b: jax.Array, *,
               exact: bool = False, with_info: bool = False):
    """Scores [B] of right-padded sequences; last_b: index of each one's last token.

    `exact`: no MoE token dropped (`model.exact_dispatch`), so that a score
    does not depend on the rest of the batch: how the RM scores rollouts
    and held-out pairs. Training keeps the configured dispatch.
    `with_info`: (scores, the backbone's info).
    """
    valid = (jnp.arange(tokens_bt.shape[1])[None] <= last_b[:, None])
    moe = model_lib.exact_dispatch(self.backbone.cfg) if exact else {}
    _, info = self.backbone(tokens_bt, segment_ids_bt=valid.astype(jnp.int32),
                            return_hidden=True, **moe)
    h = jnp.take_along_axis(info['hidden'], last_b[:, None, None], 1)[:, 0]
    s = h.astype(jnp.float32) @ self.head_d[...] + self.bias[...]
    return (s, info) if with_info else s


def encode_pairs(tok: data.Tokenizer, records: Sequence[dict],
                 responses: Sequence[str], seq_len: int
                 ) -> tuple[np.ndarray, np.ndarray]:
  """Conversations (prompt + response + <|im_end|>) right-padded: ([B, T], last [B]).

  A longer conversation keeps its last `seq_len` tokens (the response end
  is what the head reads).
  """
  toks = np.full((len(records), seq_len), tok.pad_id, np.int32)
  last = np.zeros((len(records),), np.int32)
  for i, (r, y) in enumerate(zip(records, responses, strict=True)):
    ids = (data.encode_prompt(tok, r['messages']) + tok.encode(y) +
           [tok.im_end])[-seq_len:]
    toks[i, :len(ids)] = ids
    last[i] = len(ids) - 1
  return toks, last


@functools.partial(jax.jit, static_argnames=('graph', 'opt'), donate_argnums=0)
def _train_step(state, batch, *, graph, opt):
  def loss_fn(params):
    rm = nnx.merge(graph, params, state.rest)
    s = rm(batch['tokens'], batch['last'])
    n = s.shape[0] // 2
    return losses.bradley_terry_loss(s[:n], s[n:])

  (loss, m), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = opt.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return train.TrainState(params, state.rest, opt_state, state.step + 1), dict(
      m, loss=loss, grad_norm=optax.global_norm(grads))


@functools.partial(jax.jit, static_argnames=('graph',))
def _scores(graph, params, rest, tokens, last):
  """Exact scores [B] (no dropped token) and the dropped fraction (0)."""
  s, info = nnx.merge(graph, params, rest)(tokens, last, exact=True,
                                           with_info=True)
  return s, model_lib.dropped_fraction(info)


def _pair_batch(tok, recs, seq_len, cross_prompt=False):
  """Chosen then rejected responses of each pair, [2B, T].

  With `cross_prompt`, B more pairs rank each prompt's chosen response above
  the chosen response of the next record on another question: an answer to
  a different question is worse. Without them the model only ever compares
  two answers to the same question, and RL finds off-topic answers it
  scores highly.
  """
  chosen = [r['chosen'] for r in recs]
  rejected = [r['rejected'] for r in recs]
  if cross_prompt:
    n = len(recs)
    # The question a record asks: its topic when it has one (two phrasings
    # of one topic accept the same answers), else its prompt.
    prompt = lambda r: r.get('topic') or r['messages'][-1]['content']
    other = [next((recs[(i + j) % n] for j in range(1, n)
                   if prompt(recs[(i + j) % n]) != prompt(recs[i])), recs[i])
             for i in range(n)]
    recs = recs + recs
    chosen, rejected = chosen + chosen, rejected + [o['chosen'] for o in other]
  t, last = encode_pairs(tok, recs + recs, chosen + rejected, seq_len)
  return dict(tokens=t, last=last)


def accuracy(graph, state, tok, records, seq_len, batch_size=128) -> float:
  """Held-out pairwise accuracy: chosen scored above rejected."""
  hits = []
  for i in range(0, len(records), batch_size):
    recs = list(records[i:i + batch_size])
    b = _pair_batch(tok, recs, seq_len)
    s = np.asarray(_scores(graph, state.params, state.rest, b['tokens'],
                           b['last'])[0])
    hits.extend((s[:len(recs)] > s[len(recs):]).tolist())
  return float(np.mean(hits))


def _build(run_dir_or_init: str, rngs_seed: int = 0):
  cfg, backbone, tok = train.restore_run(run_dir_or_init)
  return cfg, RewardModel(backbone, rngs=nnx.Rngs(rngs_seed)), tok


def train_run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (or resumes) the reward model stage; returns {'accuracy', ...}."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    f.write(config.to_json_best_effort(indent=2))
  _, rm, tok = _build(config.init_from, config.seed)
  tok_path = os.path.join(workdir, 'tokenizer.model')
  with open(os.path.join(config.init_from, 'tokenizer.model'), 'rb') as src, \
       open(tok_path, 'wb') as dst:
    dst.write(src.read())
  opt = train.make_optimizer(train.OptimConfig(**config.optim.to_dict()))
  graph, state = train.init_state(rm, opt)
  gen = dict(levels=tuple(config.data.levels))
  pairs = domains.generate('preference', split='train', n=config.data.n_train,
                           seed=config.seed, **gen)
  held_out = domains.generate('preference', split='eval', n=config.eval_n,
                              seed=config.seed, **gen)
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, 'checkpoints'),
                                 max_to_keep=config.keep_checkpoints)
  state, extra = train.resume(ckpt, state)
  start = 0 if extra is None else ckpt.latest_step()
  writer = metrics_lib.MetricsWriter(workdir, name='rm')
  progress = metrics_lib.Progress(config.steps, label='reward_model',
                                  start=start)
  acc0 = accuracy(graph, state, tok, held_out, config.data.seq_len)
  bs = config.batch_size
  for step in range(start, config.steps):
    lo = (step * bs) % max(len(pairs) - bs, 1)
    batch = _pair_batch(tok, list(pairs[lo:lo + bs]), config.data.seq_len,
                        cross_prompt=config.data.get('cross_prompt_negatives',
                                                     False))
    state, m = _train_step(state, jax.tree.map(jnp.asarray, batch),
                           graph=graph, opt=opt)
    m = {k: float(v) for k, v in jax.device_get(m).items()}
    writer.write(step + 1, m)
    if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
      progress.update(step + 1, m)
    if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
      ckpt.save(step + 1, state.to_checkpoint(), {'data_position': step + 1})
  ckpt.wait()
  t0 = time.perf_counter()
  acc = accuracy(graph, state, tok, held_out, config.data.seq_len)
  writer.write(config.steps, {'eval/heldout_accuracy': acc})
  result = dict(accuracy=acc, accuracy_before=acc0, n=len(held_out))
  print(f'[reward_model] held-out pairwise accuracy {acc:.3f} '
        f'(before training {acc0:.3f}, n={len(held_out)}, '
        f'{time.perf_counter() - t0:.0f}s)')
  with open(os.path.join(workdir, 'rm_scores.json'), 'w') as f:
    json.dump(result, f, indent=2)
  ckpt.close()
  writer.close()
  return result


class RewardFunction:
  """A trained reward model as a learner reward: (records, responses) -> [B]."""

  def __init__(self, run_dir: str):
    if not os.path.isdir(os.path.join(run_dir, 'checkpoints')):
      raise FileNotFoundError(f'reward model: no checkpoint at {run_dir!r}')
    with open(os.path.join(run_dir, 'config.json')) as f:
      cfg = json.load(f)
    # Shapes only: the checkpoint holds every weight, backbone included.
    mcfg, _, self.tok = train.model_shell(cfg['init_from'])
    rm = nnx.eval_shape(lambda: RewardModel(
        model_lib.Transformer(mcfg, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(0)))
    self._graph, self._params, self._rest = train.restore_latest(rm, run_dir)
    self.seq_len = int(cfg['data']['seq_len'])
    self.last_dropped = 0.0   # of the last call: 0 unless a path drops

  def __call__(self, records, responses) -> np.ndarray:
    t, last = encode_pairs(self.tok, records, responses, self.seq_len)
    s, dropped = _scores(self._graph, self._params, self._rest, t, last)
    self.last_dropped = float(dropped)
    return np.asarray(s, np.float32)


def load(run_dir: str) -> RewardFunction:
  return RewardFunction(run_dir)
