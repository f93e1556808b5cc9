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
from flax import nnx

from cascade_jax import data
from cascade_jax import domains
from cascade_jax import losses
from cascade_jax import metrics as metrics_lib
from cascade_jax import model as model_lib
from cascade_jax import sharding
from cascade_jax import train


class RewardModel(nnx.Module):
  """Transformer backbone + scalar head on the last token's hidden state."""

  def __init__(self, backbone: model_lib.Transformer, *, rngs: nnx.Rngs):
    self.backbone = backbone
    d = backbone.cfg.embed_dim
    self.head_d = nnx.Param(jax.random.normal(rngs.params(), (d,)) * d ** -0.5,
                            logical_axes=('norm',))
    self.bias = nnx.Param(jnp.zeros(()), logical_axes=())

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
                            return_logits=False, **moe)
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
  state, grad_norm = train.apply_gradients(state, grads, opt)
  return state, dict(m, loss=loss, grad_norm=grad_norm)


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


def accuracy(graph, state, tok, records, seq_len, batch_size=128,
             put=None) -> float:
  """Held-out pairwise accuracy: chosen scored above rejected."""
  put = put or (lambda b: jax.tree.map(jnp.asarray, b))
  hits = []
  for i in range(0, len(records), batch_size):
    recs = list(records[i:i + batch_size])
    b = put(_pair_batch(tok, recs, seq_len))
    s = sharding.to_host(_scores(graph, state.params, state.rest, b['tokens'],
                                 b['last'])[0])
    hits.extend((s[:len(recs)] > s[len(recs):]).tolist())
  return float(np.mean(hits))


def preference_splits(config) -> tuple[list[dict], list[dict]]:
  """A preference stage's training pairs and held-out pairs."""
  gen = dict(levels=tuple(config.data.levels))
  pairs = domains.generate('preference', split='train', n=config.data.n_train,
                           seed=config.seed, **gen)
  held_out = domains.generate('preference', split='eval', n=config.eval_n,
                              seed=config.seed, **gen)
  return pairs, held_out


def fit(setup, state, config, start: int, writer, progress, batch_at,
        n_items: int, step_fn):
  """The preference stages' loop (reward model, judge): from `start` to
  config.steps, batch `batch_at(lo, hi)` of items [lo, hi) taken in order
  (wrapping), a `step_fn(state, batch) -> (state, metrics)` each, logged,
  checkpointed with the data position. Returns the final state."""
  bs = config.batch_size
  for step in range(start, config.steps):
    lo = (step * bs) % max(n_items - bs, 1)
    state, m = step_fn(state, setup.put(batch_at(lo, lo + bs)))
    m = {k: float(v) for k, v in sharding.to_host(m).items()}
    writer.write(step + 1, m)
    if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
      progress.update(step + 1, m)
    if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
      setup.save(step + 1, state, {'data_position': step + 1})
  setup.ckpt.wait()
  return state


def train_run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (or resumes) the reward model stage; returns {'accuracy', ...}."""
  setup = train.Setup.create(config, workdir, name='rm')
  _, backbone, tok = setup.restore(config.init_from, record=True)
  rm = RewardModel(backbone, rngs=nnx.Rngs(config.seed))
  if setup.ctx is not None:
    sharding.shard_model(rm, setup.ctx)
  opt = train.make_optimizer(train.OptimConfig(**config.optim.to_dict()))
  graph, state = setup.init_state(rm, opt)
  pairs, held_out = preference_splits(config)
  state, extra = setup.resume(state)
  start = 0 if extra is None else setup.ckpt.latest_step()
  writer = setup.writer()
  progress = metrics_lib.Progress(config.steps, label='reward_model',
                                  start=start)
  acc0 = accuracy(graph, state, tok, held_out, config.data.seq_len,
                  put=setup.put)
  cross = config.data.get('cross_prompt_negatives', False)
  state = fit(setup, state, config, start, writer, progress,
              lambda lo, hi: _pair_batch(tok, list(pairs[lo:hi]),
                                         config.data.seq_len,
                                         cross_prompt=cross),
              len(pairs), functools.partial(_train_step, graph=graph, opt=opt))
  t0 = time.perf_counter()
  acc = accuracy(graph, state, tok, held_out, config.data.seq_len,
                 put=setup.put)
  writer.write(config.steps, {'eval/heldout_accuracy': acc})
  result = dict(accuracy=acc, accuracy_before=acc0, n=len(held_out))
  print(f'[reward_model] held-out pairwise accuracy {acc:.3f} '
        f'(before training {acc0:.3f}, n={len(held_out)}, '
        f'{time.perf_counter() - t0:.0f}s)')
  setup.write_json('rm_scores.json', result)
  setup.close()
  writer.close()
  return result


class RewardFunction:
  """A trained reward model as a learner reward: (records, responses) -> [B].

  With a stage's `setup`, its weights are restored onto that stage's mesh
  and each batch of responses is split over it.
  """

  def __init__(self, run_dir: str, *, setup=None):
    if not os.path.isdir(os.path.join(run_dir, 'checkpoints')):
      raise FileNotFoundError(f'reward model: no checkpoint at {run_dir!r}')
    with open(os.path.join(run_dir, 'config.json')) as f:
      cfg = json.load(f)
    ctx = None if setup is None else setup.ctx
    # Shapes only: the checkpoint holds every weight, backbone included.
    mcfg, _, self.tok = train.model_shell(
        run_dir, memory=None if setup is None else setup.memory)
    rm = nnx.eval_shape(lambda: RewardModel(
        model_lib.Transformer(mcfg, rngs=nnx.Rngs(0), ctx=ctx),
        rngs=nnx.Rngs(0)))
    nnx.update(rm, sharding.abstract_state(ctx, nnx.state(rm)))
    self._graph, self._params, self._rest = train.restore_latest(rm, run_dir)
    self._put = (lambda b: jax.tree.map(jnp.asarray, b)) if setup is None \
        else setup.put
    self._rows_multiple = 1 if ctx is None else ctx.shards('batch')
    self.seq_len = int(cfg['data']['seq_len'])
    self.last_dropped = 0.0   # of the last call: 0 unless a path drops

  def __call__(self, records, responses) -> np.ndarray:
    t, last = encode_pairs(self.tok, records, responses, self.seq_len)
    # Scores are per row (no token dropped): padding rows change none.
    rows, n = sharding.pad_rows(dict(tokens=t, last=last), self._rows_multiple)
    b = self._put(rows)
    s, dropped = sharding.to_host(_scores(self._graph, self._params,
                                          self._rest, b['tokens'], b['last']))
    self.last_dropped = float(dropped)
    return np.asarray(s, np.float32)[:n]


def load(run_dir: str, *, setup=None) -> RewardFunction:
  return RewardFunction(run_dir, setup=setup)
