"""Scoring a model's responses per domain: mean reward and pass rate."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from cascade_jax.domains import _base


@dataclasses.dataclass(frozen=True)
class DomainScore:
  """A domain's scores; `pass_se` is the pass rate's standard error, with
  the responses to one record (several samples) counted as one cluster."""
  domain: str
  n: int
  mean_reward: float
  pass_rate: float
  pass_se: float = float('nan')


def _clustered_se(records, scores) -> float:
  by_rec = collections.defaultdict(list)
  for i, (r, s) in enumerate(zip(records, scores)):
    by_rec[r.get('id', i)].append(float(s.passed))
  means = [sum(v) / len(v) for v in by_rec.values()]
  if len(means) < 2:
    return float('nan')
  mu = sum(means) / len(means)
  var = sum((m - mu) ** 2 for m in means) / (len(means) - 1)
  return (var / len(means)) ** 0.5


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
  scores = score(records, responses, sandbox=sandbox)
  acc = collections.defaultdict(list)
  for r, s in zip(records, scores):
    acc[r['domain']].append((r, s))
  out = {}
  for d, pairs in sorted(acc.items()):
    recs, ss = zip(*pairs)
    out[d] = DomainScore(d, len(ss), sum(s.reward for s in ss) / len(ss),
                         sum(s.passed for s in ss) / len(ss),
                         _clustered_se(recs, ss))
  return out


def format_scores(scores: dict[str, DomainScore]) -> str:
  from cascade_jax.utils import format_table  # pylint: disable=g-import-not-at-top
  return format_table(
      ['domain', 'n', 'mean reward', 'pass rate'],
      [[s.domain, s.n, s.mean_reward, s.pass_rate] for s in scores.values()])
