"""Supervised fine-tuning on packed sequences: the recipe's first stage.

The algorithm: next-token cross-entropy on the assistant tokens (by
default) of chat-formatted examples, packed into fixed-length rows whose
segments never attend to each other; AdamW with warm-up and cosine decay,
global-norm clipping, optional gradient accumulation; the MoE router's
aux-loss-free bias is updated after every step, outside the optimizer.
The run checkpoints (params, optimizer, step, data iterator) with Orbax
and resumes from its latest checkpoint when started again.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from cascade_jax import data
from cascade_jax import domains
from cascade_jax import metrics as metrics_lib
from cascade_jax import rollout
from cascade_jax import sharding
from cascade_jax import train


def loss_fn(params, rest, graph, batch, n_tokens, aux_scale):
  """SFT's loss on (a micro-batch of) packed rows: (loss, (nll, router stats)).

  The masked next-token NLL summed, over `n_tokens` (the whole batch's loss
  tokens, so micro-batches add up to the batch's mean), plus the router's
  aux losses times `aux_scale` (1 / micro-batches: their mean).
  """
  model = nnx.merge(graph, params, rest)
  _, info = model(batch['inputs'], positions_bt=batch['positions'],
                  segment_ids_bt=batch['segment_ids'], return_logits=False)
  logp, _ = train.token_stats(model.logits, info['hidden'], batch['targets'],
                              chunk=model.cfg.logits_chunk)
  nll = -jnp.sum(logp * batch['mask'].astype(jnp.float32))
  loss = nll / n_tokens + aux_scale * info['aux_loss']
  return loss, (nll, info.get('router', {}))


@functools.partial(jax.jit, static_argnames=('graph', 'opt', 'accum',
                                             'bias_rate', 'n_moe'),
                   donate_argnums=0)
def train_step(state: train.TrainState, batch, *, graph, opt, accum: int,
               bias_rate: float, n_moe: int):
  """One optimizer step over `batch`, split into `accum` micro-batches.

  The loss is the token mean over the whole batch: each micro-batch's sum
  is divided by the batch's token count, so accumulation is exact
  (`train.accumulate_gradients`).
  """
  n_tokens = jnp.maximum(jnp.sum(batch['mask']), 1).astype(jnp.float32)

  def micro_loss(params, mb):
    loss, (nll, router) = loss_fn(params, state.rest, graph, mb, n_tokens,
                                  1.0 / accum)
    m = dict(nll=nll)
    if n_moe:   # means over the micro-batches
      m.update(load=router['load'] / accum, dropped=router['dropped'] / accum,
               spilled=router['spilled'] / accum)
    return loss, m

  _, m, grads = train.accumulate_gradients(micro_loss, state.params, batch,
                                           accum)
  state, grad_norm = train.apply_gradients(state, grads, opt)
  if n_moe and bias_rate:
    model = nnx.merge(graph, state.params, state.rest)
    model.update_expert_biases(m['load'], bias_rate)
    state = dataclasses.replace(state, rest=nnx.state(model, nnx.Not(nnx.Param)))
  metrics = dict(loss=m['nll'] / n_tokens, grad_norm=grad_norm,
                 tokens=n_tokens)
  if n_moe:
    load = m['load']
    metrics.update(expert_load_max=jnp.max(load) * load.shape[-1],
                   expert_load_min=jnp.min(load) * load.shape[-1],
                   dropped=jnp.mean(m['dropped']),
                   spilled=jnp.mean(m['spilled']))
  return state, metrics


# ------------------------------------------------------------------ setup


def sources(config) -> dict[str, dict]:
  """The SFT mix: the configured sources (unless data.generated_sources is
  off) and each of data.chat_files ('PATH=WEIGHT,...': chat-messages
  JSONL / Parquet, or their converted .array_record), named after its
  file."""
  out = ({k: v.to_dict() for k, v in config.data.sources.items()}
         if config.data.get('generated_sources', True) else {})
  for item in filter(None, (s.strip() for s in
                            config.data.get('chat_files', '').split(','))):
    path, _, weight = item.rpartition('=')
    if not path:
      path, weight = weight, '1'
    try:
      w = float(weight)
    except ValueError:
      raise ValueError(f'data.chat_files: {item!r} is not PATH=WEIGHT') from None
    name = os.path.splitext(os.path.basename(path))[0]
    if name in out:
      raise ValueError(f'data.chat_files: a source named {name!r} (from '
                       f'{path}) exists already')
    out[name] = dict(weight=w, **{
        'array_record' if path.endswith('.array_record') else 'chat': path})
  if not out:
    raise ValueError('no SFT data: data.generated_sources is off and '
                     'data.chat_files is empty')
  return out


def tokenizer_for(config, workdir: str, vocab_size: int) -> data.Tokenizer:
  """The configured .model file, or one trained on the sources (cached)."""
  path = config.tokenizer.path or os.path.join(workdir, 'tokenizer.model')
  texts = None
  if not os.path.exists(path):
    texts = []
    for name, spec in sorted(sources(config).items()):
      recs, _ = data.source_records(name, spec, seed=config.seed)
      for r in recs[:config.tokenizer.corpus_per_source]:
        texts += [m['content'] for m in r['messages'] + r.get('turns', [])]
        texts.append(r.get('response', ''))
  tok = data.get_tokenizer(path, texts, vocab_size)
  data.check_vocab(tok, vocab_size)
  return tok


def eval_sets(config) -> dict[str, list[dict]]:
  """Each generated source's domain: its eval split (never trained on)."""
  sets = {}
  for name, spec in sorted(sources(config).items()):
    if ({'jsonl', 'chat', 'array_record'} & set(spec)
        or not config.eval_n):
      continue
    dom = spec.get('domain', name)
    sets[dom] = domains.generate(
        dom, split='eval', n=config.eval_n, seed=config.seed,
        levels=tuple(spec.get('levels', (1, 2, 3))),
        **dict(spec.get('options', {})))
  return sets


# ------------------------------------------------------------------- run


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains (or resumes) an SFT run in `workdir`; returns the final scores."""
  setup = train.Setup.create(config, workdir, name='sft')
  init = config.get('init_from', '')
  if init.startswith('hf:'):       # a Hugging Face checkpoint: import first
    run = os.path.join(workdir, 'imported')
    if not os.path.isdir(os.path.join(run, 'checkpoints')):
      train.import_hf(setup.path(init[len('hf:'):]), run, ctx=setup.ctx)
    init = run
  init = setup.path(init)
  if init:
    cfg, model, tok = setup.restore(init, record=True)
  else:
    cfg, model = setup.new_model(config.model.to_dict(), config.seed)
    tok = _main_first(lambda: tokenizer_for(config, workdir, cfg.vocab_size))
  oc = train.OptimConfig(**config.optim.to_dict())
  opt = train.make_optimizer(oc)
  graph, state = setup.init_state(model, opt)

  ds, reports = data.build_dataset(
      tok, sources(config),
      seq_len=config.data.seq_len, batch_size=config.data.batch_size,
      seed=config.seed, loss_on=config.data.loss_on,
      too_long=config.data.too_long,
      empty_response=config.data.empty_response)
  it = iter(ds)
  for r in reports:
    print(f'[sft] source {r.name}: {r.examples} examples, {r.tokens} tokens'
          + (f', skipped {r.skipped_too_long} too long, {r.skipped_empty} '
             f'empty, {r.skipped_rows} malformed rows'
             if r.skipped_too_long + r.skipped_empty + r.skipped_rows else ''))

  state, extra = setup.resume(state)
  start = int(state.step)
  if extra is not None:
    it.set_state(extra['data'])
    print(f'[sft] resumed from step {start} ({setup.ckpt.directory})')

  writer = setup.writer()
  progress = metrics_lib.Progress(config.steps, label='sft', start=start)
  evals = eval_sets(config)
  sched = train.schedule(oc)
  step_fn = functools.partial(train_step, graph=graph, opt=opt,
                              accum=config.accum_steps,
                              bias_rate=config.expert_bias_rate,
                              n_moe=cfg.pattern.count('E'))
  t_last, tok_count = time.perf_counter(), 0.0
  for step in range(start, config.steps):
    batch = next(it)
    eff = data.packing_efficiency(batch)
    state, m = step_fn(state, setup.put(batch))
    tok_count += float((batch['segment_ids'] > 0).sum())
    if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
      m = sharding.to_host(m)
      dt = time.perf_counter() - t_last
      # tokens_per_s: every non-padding token processed (loss tokens are
      # the assistant turns only, `tokens` per step).
      m.update(tokens_per_s=tok_count / dt, lr=float(sched(step)),
               packing_efficiency=eff)
      writer.write(step + 1, m)
      progress.update(step + 1, {k: m[k] for k in ('loss', 'tokens_per_s',
                                                   'lr', 'grad_norm')})
      t_last, tok_count = time.perf_counter(), 0.0
    if config.eval_every and (step + 1) % config.eval_every == 0 and (
        step + 1 < config.steps):
      _evaluate(graph, state, tok, evals, writer, step + 1)
    if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
      setup.save(step + 1, state, {'data': it.get_state()})
  setup.ckpt.wait()
  scores = _evaluate(graph, state, tok, evals, writer, config.steps)
  setup.write_json('sft_scores.json', {k: v.__dict__ for k, v in scores.items()})
  setup.close()
  writer.close()
  return scores


def _main_first(fn):
  """fn() on process 0 first (it may write a file the others then read)."""
  if jax.process_count() == 1:
    return fn()
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  out = fn() if train.is_main_process() else None
  multihost_utils.sync_global_devices('sft: tokenizer written')
  return out if out is not None else fn()


def _evaluate(graph, state, tok, evals, writer, step):
  return rollout.evaluate_and_log(nnx.merge(graph, state.params, state.rest),
                                  tok, evals, writer=writer, step=step,
                                  label='sft')

