"""A generative pairwise judge: the policy's own language model reads a question and two replies and says which is better.

    user:       Question: {question}
                Reply A: {a}
                Reply B: {b}
                Which reply is better? Answer A or B.
    assistant:  A            (or B)

It is trained from the preference domain's pairs as a generation task: the
cross-entropy of the verdict token over the whole vocabulary, each pair in
both orders (the better reply as A, then as B), plus cross-prompt pairs (an
answer to another question is the worse one, as for the Bradley-Terry
model). Its verdict is read, not sampled: P(A) = p(A) / (p(A) + p(B)) at
the verdict position; greedy generation would say whichever is larger.

As the RLHF reward (`JudgeReward`), as in the paper:

  compare='group'      each rollout against every other rollout of its
                       prompt's group;
  compare='reference'  each rollout against the record's reference reply
                       (`chosen`, else `response`);

each pair in both orders, so that a preference for a position cancels:

  win(i, j) = (P_A(i, j) + 1 - P_A(j, i)) / 2
  reward_i  = mean_j win(i, j)                                  in [0, 1]
            - length_penalty * (words_i - mean words) / mean words

(the length adjustment is off by default; a judge that likes long replies
is paid less for length with it on).
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
from cascade_jax import metrics as metrics_lib
from cascade_jax import model as model_lib
from cascade_jax import sharding
from cascade_jax import train
from cascade_jax.reward_model import _model

MARKER = 'judge.json'          # in a judge's run directory: what it is
FORMAT = 'pairwise_ab_v1'
VERDICTS = ('A', 'B')
COMPARE = ('group', 'reference')


def judge_messages(question: str, a: str, b: str) -> list[dict[str, str]]:
  text = (f'Question: {question}\nReply A: {a}\nReply B: {b}\n'
          'Which reply is better? Answer A or B.')
  return [{'role': 'user', 'content': text}]


def question_of(record: dict) -> str:
  return record['messages'][-1]['content']


def verdict_ids(tok: data.Tokenizer) -> tuple[int, int]:
  """The token ids of the verdicts 'A' and 'B' (each one token)."""
  ids = []
  for v in VERDICTS:
    enc = tok.encode(v)
    if len(enc) != 1:
      raise ValueError(f'judge: the tokenizer splits the verdict {v!r} into '
                       f'{len(enc)} tokens; the judge needs one token each')
    ids.append(enc[0])
  return tuple(ids)


def _clip(tok: data.Tokenizer, text: str, max_tokens: int) -> str:
  ids = tok.encode(text)
  return text if len(ids) <= max_tokens else tok.decode(ids[:max_tokens])


def encode_judgements(tok: data.Tokenizer, items: Sequence[tuple[str, str, str]],
                      seq_len: int, max_reply_tokens: int
                      ) -> tuple[np.ndarray, np.ndarray]:
  """(question, reply A, reply B) triples as right-padded judge prompts:
  (tokens [B, T], last [B]: the position whose logits give the verdict).

  Each reply keeps its first `max_reply_tokens` tokens; a prompt longer
  than `seq_len` is an error (the question would be cut).
  """
  toks = np.full((len(items), seq_len), tok.pad_id, np.int32)
  last = np.zeros((len(items),), np.int32)
  for i, (q, a, b) in enumerate(items):
    ids = data.encode_prompt(tok, judge_messages(
        q, _clip(tok, a, max_reply_tokens), _clip(tok, b, max_reply_tokens)))
    if len(ids) > seq_len:
      raise ValueError(f'judge: a prompt of {len(ids)} tokens does not fit '
                       f'seq_len={seq_len}; raise data.seq_len or lower '
                       'data.max_reply_tokens')
    toks[i, :len(ids)] = ids
    last[i] = len(ids) - 1
  return toks, last


def _verdict_logits(model, tokens, last, moe):
  valid = (jnp.arange(tokens.shape[1])[None] <= last[:, None])
  _, info = model(tokens, segment_ids_bt=valid.astype(jnp.int32),
                  return_logits=False, **moe)
  h = jnp.take_along_axis(info['hidden'], last[:, None, None], 1)
  return model.logits(h)[:, 0], info          # [B, V] fp32


@functools.partial(jax.jit, static_argnames=('graph', 'opt'), donate_argnums=0)
def _train_step(state, batch, *, graph, opt):
  def loss_fn(params):
    model = nnx.merge(graph, params, state.rest)
    logits, info = _verdict_logits(model, batch['tokens'], batch['last'], {})
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, batch['target'][:, None], 1)[:, 0]
    loss = nll.mean() + info['aux_loss']
    return loss, dict(nll=nll.mean())

  (loss, m), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  state, grad_norm = train.apply_gradients(state, grads, opt)
  return state, dict(m, loss=loss, grad_norm=grad_norm)


@functools.partial(jax.jit, static_argnames=('graph',))
def _verdicts(graph, params, rest, tokens, last, ab):
  """(P(A) over {A, B} [B], greedy verdict is A / B / neither [B] as 0 / 1 /
  2, dropped fraction): an exact forward (no MoE token dropped)."""
  model = nnx.merge(graph, params, rest)
  moe = model_lib.exact_dispatch(model.cfg)
  logits, info = _verdict_logits(model, tokens, last, moe)
  pair = logits[:, ab]
  p_a = jax.nn.softmax(pair, axis=-1)[:, 0]
  top = jnp.argmax(logits, -1)
  greedy = jnp.where(top == ab[0], 0, jnp.where(top == ab[1], 1, 2))
  return p_a, greedy, model_lib.dropped_fraction(info)


def training_items(records: Sequence[dict], rng: np.random.Generator, *,
                   cross_prompt: bool) -> list[tuple[tuple[str, str, str], int]]:
  """((question, A, B), verdict index) for each pair in both orders, and with
  `cross_prompt`, the chosen reply against the chosen reply to another
  question (the other one worse), in both orders too."""
  out = []
  n = len(records)
  for i, r in enumerate(records):
    q = question_of(r)
    pairs = [(r['chosen'], r['rejected'])]
    if cross_prompt:
      topic = r.get('topic') or q
      other = next((records[(i + j) % n] for j in range(1, n)
                    if (records[(i + j) % n].get('topic') or
                        question_of(records[(i + j) % n])) != topic), None)
      if other is not None:
        pairs.append((r['chosen'], other['chosen']))
    for good, bad in pairs:
      out += [((q, good, bad), 0), ((q, bad, good), 1)]
  order = rng.permutation(len(out))
  return [out[k] for k in order]


class Judge:
  """A trained judge's verdicts (run directory, or a model in memory)."""

  def __init__(self, graph, params, rest, tok, *, seq_len: int,
               max_reply_tokens: int, put=None, rows_multiple: int = 1,
               batch_size: int = 256):
    self._graph, self._params, self._rest = graph, params, rest
    self.tok = tok
    self.seq_len, self.max_reply_tokens = seq_len, max_reply_tokens
    self._ab = jnp.asarray(verdict_ids(tok), jnp.int32)
    self._put = put or (lambda b: jax.tree.map(jnp.asarray, b))
    self._rows_multiple = rows_multiple
    self.batch_size = -(-batch_size // rows_multiple) * rows_multiple
    self.last_dropped = 0.0

  @staticmethod
  def question(record: dict) -> str:
    return question_of(record)

  @classmethod
  def load(cls, run_dir: str, *, setup=None, **kw) -> 'Judge':
    marker = os.path.join(run_dir, MARKER)
    if not os.path.exists(marker):
      raise FileNotFoundError(f'judge: {run_dir!r} is not a judge run (no '
                              f'{MARKER})')
    with open(marker) as f:
      meta = json.load(f)
    if meta.get('format') != FORMAT:
      raise ValueError(f'judge: {run_dir!r} has format {meta.get("format")!r}'
                       f', this code reads {FORMAT!r}')
    ctx = None if setup is None else setup.ctx
    _, model, tok = train.restore_run(
        run_dir, ctx=ctx, memory=None if setup is None else setup.memory)
    graph, params, rest = nnx.split(model, nnx.Param, ...)
    return cls(graph, params, rest, tok, seq_len=meta['seq_len'],
               max_reply_tokens=meta['max_reply_tokens'],
               put=None if setup is None else setup.put,
               rows_multiple=1 if ctx is None else ctx.shards('batch'), **kw)

  def p_first(self, items: Sequence[tuple[str, str, str]]
              ) -> tuple[np.ndarray, np.ndarray]:
    """(P(reply A is better) [N], greedy verdict [N]: 0 A, 1 B, 2 neither)."""
    probs, greedy, dropped = [], [], 0.0
    for i in range(0, len(items), self.batch_size):
      chunk = list(items[i:i + self.batch_size])
      # One shape for every call: pad with copies to the batch size.
      t, last = encode_judgements(self.tok, chunk + [chunk[-1]] * (
          self.batch_size - len(chunk)), self.seq_len, self.max_reply_tokens)
      b = self._put(dict(tokens=t, last=last))
      p, g, d = sharding.to_host(_verdicts(self._graph, self._params,
                                           self._rest, b['tokens'], b['last'],
                                           self._ab))
      probs.append(np.asarray(p)[:len(chunk)])
      greedy.append(np.asarray(g)[:len(chunk)])
      dropped = max(dropped, float(d))
    self.last_dropped = dropped
    return np.concatenate(probs), np.concatenate(greedy)

  def prefers(self, items: Sequence[tuple[str, str, str]]) -> np.ndarray:
    """P(first reply better than second) [N], from both orders."""
    swapped = [(q, b, a) for q, a, b in items]
    p, _ = self.p_first(list(items) + swapped)
    n = len(items)
    return 0.5 * (p[:n] + 1.0 - p[n:])


def agreement(judge: Judge, records: Sequence[dict]) -> dict[str, float]:
  """Held-out agreement with the rule judge on chosen / rejected pairs.

  agreement: the greedy verdict names the chosen reply, over both orders of
  every pair (a verdict that is neither A nor B disagrees);
  both_orders: the fraction of pairs judged right in both orders;
  soft: the order-averaged P(chosen better) > 0.5 (what the reward uses);
  position_bias: the mean P(A) minus 0.5 (0: no preference for a place).
  """
  items = [(question_of(r), r['chosen'], r['rejected']) for r in records]
  swapped = [(q, b, a) for q, a, b in items]
  p, g = judge.p_first(items + swapped)
  n = len(items)
  right = np.concatenate([g[:n] == 0, g[n:] == 1])
  return dict(agreement=float(right.mean()),
              both_orders=float(np.mean(right[:n] & right[n:])),
              soft=float(np.mean(0.5 * (p[:n] + 1 - p[n:]) > 0.5)),
              position_bias=float(p.mean() - 0.5),
              neither=float(np.mean(g == 2)), n=n)


class JudgeReward:
  """The judge as the learner's reward: (records, responses) -> rewards [B].

  Rollouts of one prompt come together (a group: consecutive records with
  the same id); see the module docstring for the comparisons.
  """

  def __init__(self, judge: Judge, *, compare: str = 'group',
               length_penalty: float = 0.0):
    if compare not in COMPARE:
      raise ValueError(f'judge: compare={compare!r} not in {COMPARE}')
    if length_penalty < 0:
      raise ValueError(f'judge: length_penalty must be >= 0, got '
                       f'{length_penalty}')
    self.judge, self.compare = judge, compare
    self.length_penalty = length_penalty

  @property
  def last_dropped(self) -> float:
    return self.judge.last_dropped

  def __call__(self, records, responses) -> np.ndarray:
    groups, start = [], 0
    for i in range(1, len(records) + 1):
      if i == len(records) or records[i]['id'] != records[start]['id']:
        groups.append((start, i))
        start = i
    rewards = np.zeros(len(records))
    ref_items, ref_index, pair_items, pair_index = [], [], [], []
    for lo, hi in groups:
      q = question_of(records[lo])
      if self.compare == 'reference' or hi - lo == 1:
        ref = records[lo].get('chosen') or records[lo].get('response')
        if ref is None:
          raise ValueError(f"judge: record {records[lo]['id']} has no "
                           "reference reply ('chosen' or 'response')")
        ref_items += [(q, responses[i], ref) for i in range(lo, hi)]
        ref_index += list(range(lo, hi))
      else:   # every ordered pair once: (i, j) and (j, i) are both orders
        for i in range(lo, hi):
          for j in range(lo, hi):
            if i != j:
              pair_items.append((q, responses[i], responses[j]))
              pair_index.append((i, j))
    if ref_items:
      rewards[ref_index] = self.judge.prefers(ref_items)
    if pair_items:
      p_a, _ = self.judge.p_first(pair_items)
      first = {ij: p for ij, p in zip(pair_index, p_a)}
      total = np.zeros(len(records))
      count = np.zeros(len(records))
      for (i, j), p in first.items():
        total[i] += 0.5 * (p + 1.0 - first[(j, i)])
        count[i] += 1
      grouped = count > 0
      rewards[grouped] = total[grouped] / count[grouped]
    if self.length_penalty:
      words = np.asarray([len(r.split()) for r in responses], np.float64)
      for lo, hi in groups:
        mean = max(words[lo:hi].mean(), 1.0)
        rewards[lo:hi] -= self.length_penalty * (words[lo:hi] - mean) / mean
    return rewards.astype(np.float32)


def train_run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (or resumes) the judge stage; returns its held-out agreement."""
  setup = train.Setup.create(config, workdir, name='judge')
  _, model, tok = setup.restore(config.init_from, record=True)
  ab = verdict_ids(tok)   # a tokenizer the judge cannot use fails here
  opt = train.make_optimizer(train.OptimConfig(**config.optim.to_dict()))
  graph, state = setup.init_state(model, opt)
  seq_len, max_reply = config.data.seq_len, config.data.max_reply_tokens
  if train.is_main_process():
    with open(os.path.join(workdir, MARKER), 'w') as f:
      json.dump(dict(format=FORMAT, seq_len=seq_len,
                     max_reply_tokens=max_reply), f, indent=2)
  pairs, held_out = _model.preference_splits(config)
  items = training_items(pairs, np.random.default_rng(config.seed),
                         cross_prompt=config.data.cross_prompt_negatives)
  rows_multiple = 1 if setup.ctx is None else setup.ctx.shards('batch')

  def judge_now():
    return Judge(graph, state.params, state.rest, tok, seq_len=seq_len,
                 max_reply_tokens=max_reply, put=setup.put,
                 rows_multiple=rows_multiple)

  state, extra = setup.resume(state)
  start = 0 if extra is None else setup.ckpt.latest_step()
  before = agreement(judge_now(), held_out) if start == 0 else None
  writer = setup.writer()
  progress = metrics_lib.Progress(config.steps, label='judge', start=start)
  def batch_at(lo, hi):
    chunk = items[lo:hi]
    t, last = encode_judgements(tok, [x for x, _ in chunk], seq_len, max_reply)
    return dict(tokens=t, last=last,
                target=np.asarray([ab[v] for _, v in chunk], np.int32))

  state = _model.fit(setup, state, config, start, writer, progress, batch_at,
                     len(items), functools.partial(_train_step, graph=graph,
                                                   opt=opt))
  t0 = time.perf_counter()
  after = agreement(judge_now(), held_out)
  writer.write(config.steps, {f'eval/{k}': v for k, v in after.items()})
  result = dict(after, before=before)
  if before is None:      # resumed after training: the first run's figure
    old = os.path.join(workdir, 'judge_scores.json')
    if os.path.exists(old):
      with open(old) as f:
        result['before'] = json.load(f).get('before')
  print(f"[judge] held-out agreement with the rule judge {after['agreement']:.3f}"
        f" (both orders right {after['both_orders']:.3f}, position bias "
        f"{after['position_bias']:+.3f}; before training "
        + (f"{result['before']['agreement']:.3f}" if result['before'] else '?')
        + f", n={after['n']} pairs x 2 orders, "
        f'{time.perf_counter() - t0:.0f}s)')
  setup.write_json('judge_scores.json', result)
  setup.close()
  writer.close()
  return result


def load(run_dir: str, *, setup=None, compare: str = 'group',
         length_penalty: float = 0.0) -> JudgeReward:
  return JudgeReward(Judge.load(run_dir, setup=setup), compare=compare,
                     length_penalty=length_penalty)


def is_judge(run_dir: str) -> bool:
  return os.path.exists(os.path.join(run_dir, MARKER))
