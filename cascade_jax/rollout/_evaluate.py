"""Per-domain evaluation of a model: generate on each eval split, score with the verifiers."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Mapping, Sequence

import jax
from flax import nnx

from cascade_jax import data
from cascade_jax import domains
from cascade_jax import model as model_lib
from cascade_jax import sharding
from cascade_jax.rollout._episode import EpisodeConfig
from cascade_jax.rollout._episodes import run_episodes
from cascade_jax.rollout._sampler import generate
from cascade_jax.rollout._sampler import SampleConfig


def responses_for(model, tok: data.Tokenizer, records: Sequence[dict], *,
                  cfg: SampleConfig, batch_size: int = 128,
                  key: jax.Array | None = None) -> list[str]:
  """Decoded responses, one per record.

  Batches are padded with repeats: to `batch_size` when there are several
  (one shape, one compile), and always to a multiple of the device count
  (a sharded model splits the batch over its devices).
  """
  prompts = [data.encode_prompt(tok, r['messages']) for r in records]
  key = jax.random.key(0) if key is None else key
  n_dev = jax.device_count()
  out = []
  for i in range(0, len(prompts), batch_size):
    chunk = prompts[i:i + batch_size]
    size = batch_size if len(prompts) > batch_size else len(chunk)
    pad = -(-size // n_dev) * n_dev - len(chunk)
    key, sub = jax.random.split(key)
    ro = generate(model, chunk + [chunk[-1]] * pad, cfg=cfg,
                  stop_ids=tok.stop_ids, pad_id=tok.pad_id, key=sub)
    toks, mask = sharding.to_host((ro.tokens, ro.mask))
    for row, m in zip(toks[:len(chunk)], mask[:len(chunk)]):
      ids = [int(t) for t, keep in zip(row, m)
             if keep and t not in tok.stop_ids]
      out.append(tok.decode(ids))
  return out


def max_new_tokens_for(tok: data.Tokenizer, records: Sequence[dict],
                       slack: int = 8, bucket: int = 8) -> int:
  """A generation budget from the reference responses' lengths."""
  longest = max(len(tok.encode(r.get('response', ''))) for r in records)
  return -(-(longest + 1 + slack) // bucket) * bucket


def _platform(model) -> str:
  leaf = jax.tree.leaves(nnx.state(model, nnx.Param))[0]
  devices = getattr(leaf, 'devices', None)
  return (next(iter(devices())) if devices else jax.devices()[0]).platform


def evaluate_model(model, tok: data.Tokenizer,
                   eval_sets: Mapping[str, Sequence[dict]], *,
                   temperature: float = 0.0, samples: int = 1,
                   batch_size: int = 128, sandbox=None,
                   seed: int = 0, episodes: Mapping[str, int] | None = None
                   ) -> dict[str, domains.DomainScore]:
  """Generation on each domain's eval records, scored.

  Greedy by default. With temperature > 0, `samples` responses per record
  (a fixed `seed`): the pass rate is then pass@1 averaged over the samples,
  as the paper reports it. Multi-turn domains play episodes within their
  domain's limits, `episodes`' nonzero fields in their place (see
  `episode_config`).
  """
  if samples < 1 or (samples > 1 and temperature == 0.0):
    raise ValueError(f'evaluate_model: samples={samples} needs samples >= 1 '
                     'and, above 1, a temperature > 0')
  if _platform(model) == 'cpu':   # as the RL sampler reads it on the CPU
    model = model_lib.split_model(model)
  # Domains whose verifier runs programs first: their sandbox scoring (on a
  # scoring thread; the sandbox's processes do the work) then overlaps the
  # generation of the domains after them.
  # A domain's sampling key follows its place in name order, whatever the
  # order of generation.
  index = {d: i for i, d in enumerate(sorted(eval_sets))}
  with concurrent.futures.ThreadPoolExecutor(1) as scoring:
    pending = {}
    for name in sorted(index, key=lambda d: (not _needs_sandbox(d), d)):
      recs = eval_sets[name]
      key = jax.random.fold_in(jax.random.key(seed), index[name])
      if _is_multi_turn(name):   # episodes: scored as they run
        recs = list(recs) * samples
        pending[name] = _done(domains.summarize(recs, episode_scores(
            model, tok, recs, temperature=temperature, batch_size=batch_size,
            key=key, episodes=episode_config(name, episodes))))
        continue
      cfg = SampleConfig(max_new_tokens=max_new_tokens_for(tok, recs),
                         temperature=temperature)
      recs = list(recs) * samples
      resp = responses_for(model, tok, recs, cfg=cfg, batch_size=batch_size,
                           key=key)
      pending[name] = scoring.submit(domains.evaluate, recs, resp,
                                     sandbox=sandbox)
    scores = {}
    for name in sorted(pending):
      scores.update(pending[name].result())
  return scores


def episode_config(domain: str, overrides: Mapping[str, int] | None = None
                   ) -> EpisodeConfig:
  """`domain`'s episode limits, with the nonzero `overrides` in their place.

  The domains' limits count the tiny job's sentencepiece tokens; another
  tokenizer and its chat template (a checkpoint's own) may need more.
  """
  overrides = dict(overrides or {})
  known = {f.name for f in dataclasses.fields(EpisodeConfig)}
  if set(overrides) - known:
    raise ValueError(f'episode limits: unknown fields '
                     f'{sorted(set(overrides) - known)} (known: {sorted(known)})')
  limits = dict(domains.get(domain).episode_limits)
  limits.update({k: int(v) for k, v in overrides.items() if v})
  return EpisodeConfig(**limits)


def episode_scores(model, tok: data.Tokenizer, records: Sequence[dict], *,
                   temperature: float = 0.0, batch_size: int = 128,
                   key: jax.Array | None = None,
                   episodes: EpisodeConfig | None = None
                   ) -> list[domains.Score]:
  """Each record played as an episode (its domain's limits unless
  `episodes`), scored by its environment; batches padded as in
  `responses_for`."""
  key = jax.random.key(0) if key is None else key
  n_dev = jax.device_count()
  out = []
  for i in range(0, len(records), batch_size):
    chunk = list(records[i:i + batch_size])
    size = batch_size if len(records) > batch_size else len(chunk)
    pad = -(-size // n_dev) * n_dev - len(chunk)
    cfg = episodes or EpisodeConfig(**domains.get(
        chunk[0]['domain']).episode_limits)
    key, sub = jax.random.split(key)
    eps = run_episodes(model, tok, chunk + [chunk[-1]] * pad, cfg=cfg,
                       sample=SampleConfig(temperature=temperature), key=sub)
    out += [domains.Score(e.reward, e.passed, dict(end=e.end, turns=e.turns))
            for e in eps[:len(chunk)]]
  return out


def _done(value) -> concurrent.futures.Future:
  f = concurrent.futures.Future()
  f.set_result(value)
  return f


def _is_multi_turn(domain: str) -> bool:
  try:
    return domains.get(domain).env is not None
  except ValueError:
    return False


def _needs_sandbox(domain: str) -> bool:
  try:
    return domains.get(domain).needs_sandbox
  except ValueError:       # not a registered domain: scored like any other
    return False


def evaluate_and_log(model, tok: data.Tokenizer,
                     eval_sets: Mapping[str, Sequence[dict]], *, writer,
                     step: int, label: str, temperature: float = 0.0,
                     samples: int = 1, seed: int = 0
                     ) -> dict[str, domains.DomainScore]:
  """evaluate_model, written to a metrics writer and printed as a table."""
  if not eval_sets:
    return {}
  t0 = time.perf_counter()
  scores = evaluate_model(model, tok, eval_sets, temperature=temperature,
                          samples=samples, seed=seed)
  writer.write(step, {f'eval/{d}/pass_rate': s.pass_rate
                      for d, s in scores.items()} |
               {f'eval/{d}/pass_se': s.pass_se for d, s in scores.items()} |
               {f'eval/{d}/mean_reward': s.mean_reward
                for d, s in scores.items()})
  how = ('greedy' if not temperature else
         f'T={temperature:g}, {samples} samples a prompt')
  print(f'[{label}] eval at step {step} ({time.perf_counter() - t0:.0f}s, '
        f'{how}):')
  print(domains.format_scores(scores))
  return scores
