"""Scoring a model's responses per domain: mean reward and pass rate."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from cascade_jax.domains import _base


@dataclasses.dataclass(frozen=True)
class DomainScore:
  """A domain's scores; `pass_se` is the pass rate's standard error, with
  the responses to one record (several samples) counted as one cluster.

  `prompt_pass` holds (record id, pass rate over its samples) per record:
  two evaluations of the same records can then be compared prompt by
  prompt (a paired difference, far less noisy than two independent rates).
  """
  domain: str
  n: int
  mean_reward: float
  pass_rate: float
  pass_se: float = float('nan')
  prompt_pass: tuple[tuple[str, float], ...] = ()
  # (check, fraction of responses meeting it) where the verifier names its
  # checks (Score.details['checks']: instruction following's constraint
  # kinds): which constraints a model meets, beside all of them (passed).
  by_check: tuple[tuple[str, float], ...] = ()


def _prompt_pass(records, scores) -> tuple[tuple[str, float], ...]:
  by_rec = collections.defaultdict(list)
  for i, (r, s) in enumerate(zip(records, scores)):
    by_rec[str(r.get('id', i))].append(float(s.passed))
  return tuple((k, sum(v) / len(v)) for k, v in by_rec.items())


def _se_of_mean(xs: Sequence[float]) -> float:
  """Standard error of the mean of `xs` (NaN for fewer than two)."""
  if len(xs) < 2:
    return float('nan')
  mu = sum(xs) / len(xs)
  var = sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)
  return (var / len(xs)) ** 0.5


def paired_se(a: Sequence[tuple[str, float]],
              b: Sequence[tuple[str, float]]) -> float:
  """Standard error of mean(b) - mean(a) over the records both scored.

  Per-record differences of pass rates (each the mean over its samples):
  the records' difficulty cancels, the sampling noise of both stays. NaN
  unless both scored the same records (at least two).
  """
  da, db = dict(a), dict(b)
  if da.keys() != db.keys():
    return float('nan')
  return _se_of_mean([db[k] - da[k] for k in da])


def score(records: Sequence[_base.Record], responses: Sequence[str], *,
          sandbox=None) -> list[_base.Score]:
  """Each response scored by its record's domain verifier, in input order.

  Records of one domain are verified in one batch (the code domains run
  their programs in parallel on the sandbox pool).
  """
  if len(records) != len(responses):
    raise ValueError(f'{len(records)} records but {len(responses)} responses')
  by_domain = collections.defaultdict(list)
  for i, r in enumerate(records):
    by_domain[r['domain']].append(i)
  out: list[_base.Score | None] = [None] * len(records)
  for name, idx in by_domain.items():
    scores = _base.get(name).verify([records[i] for i in idx],
                                    [responses[i] for i in idx],
                                    sandbox=sandbox)
    for i, s in zip(idx, scores, strict=True):
      out[i] = s
  return out  # type: ignore[return-value]


def evaluate(records: Sequence[_base.Record], responses: Sequence[str], *,
             sandbox=None) -> dict[str, DomainScore]:
  """Per-domain mean reward and pass rate of `responses`."""
  return summarize(records, score(records, responses, sandbox=sandbox))


def summarize(records: Sequence[_base.Record], scores: Sequence[_base.Score]
              ) -> dict[str, DomainScore]:
  """Per-domain mean reward and pass rate of scored records (replies or episodes)."""
  acc = collections.defaultdict(list)
  for r, s in zip(records, scores):
    acc[r['domain']].append((r, s))
  out = {}
  for d, pairs in sorted(acc.items()):
    recs, ss = zip(*pairs)
    pp = _prompt_pass(recs, ss)
    out[d] = DomainScore(d, len(ss), sum(s.reward for s in ss) / len(ss),
                         sum(s.passed for s in ss) / len(ss),
                         _se_of_mean([m for _, m in pp]), pp, _by_check(ss))
  return out


def _by_check(scores: Sequence[_base.Score]) -> tuple[tuple[str, float], ...]:
  met = collections.defaultdict(list)
  for s in scores:
    for name, ok in (s.details or {}).get('checks', ()):
      met[name].append(float(ok))
  return tuple((k, sum(v) / len(v)) for k, v in sorted(met.items()))


def format_scores(scores: dict[str, DomainScore]) -> str:
  from cascade_jax.utils import format_table  # pylint: disable=g-import-not-at-top
  return format_table(
      ['domain', 'n', 'mean reward', 'pass rate'],
      [[s.domain, s.n, s.mean_reward, s.pass_rate] for s in scores.values()])
