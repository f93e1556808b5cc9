"""The domain interface: scores, the registry, seeded split-disjoint sampling, answer extraction."""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

Record = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Score:
  """A verifier's judgement of one response."""
  reward: float                  # in [0, 1]
  passed: bool                   # fully correct
  details: dict = dataclasses.field(default_factory=dict)


class Generator(Protocol):
  def __call__(self, *, split: str, n: int, seed: int,
               levels: Sequence[int] = (1, 2, 3), **options) -> list[Record]:
    ...


class Verifier(Protocol):
  def __call__(self, records: Sequence[Record], responses: Sequence[str], *,
               sandbox=None) -> list[Score]:
    ...


@dataclasses.dataclass(frozen=True)
class Domain:
  """A domain: generator of CPU-scale tasks, verifier, and what records need."""
  name: str
  generate: Generator
  verify: Verifier
  required_fields: tuple[str, ...] = ()
  needs_sandbox: bool = False
  description: str = ''
  # A multi-turn domain: `env(record, sandbox)` makes the environment that
  # plays one episode (`envs.Environment`); its reward is the verdict, and
  # `verify` (a single reply) does not apply.
  env: Callable[..., Any] | None = None
  # Its episodes' default limits (rollout.EpisodeConfig's fields).
  episode_limits: dict = dataclasses.field(default_factory=dict)
  # Its records come from files the user names (generate's `files`), not
  # from a generator: left out of `names()` unless asked for.
  from_files: bool = False


def episode_only(name: str) -> Verifier:
  """The `verify` of a multi-turn domain: a single reply cannot be scored."""
  def verify(records, responses, *, sandbox=None):
    del records, responses, sandbox
    raise ValueError(f'{name} is a multi-turn domain: its records are scored '
                     'by running episodes (rollout.run_episodes), not by '
                     'verifying one reply')
  return verify


_REGISTRY: dict[str, Domain] = {}


def register(domain: Domain) -> Domain:
  if domain.name in _REGISTRY:
    raise ValueError(f'domain {domain.name!r} is already registered')
  _REGISTRY[domain.name] = domain
  return domain


def get(name: str) -> Domain:
  if name not in _REGISTRY:
    raise ValueError(f'unknown domain {name!r}; known: {sorted(_REGISTRY)}')
  return _REGISTRY[name]


def names(*, from_files: bool = False) -> list[str]:
  """The generated domains' names (and those that read files, if asked)."""
  return sorted(k for k, d in _REGISTRY.items() if from_files or
                not d.from_files)


# -------------------------------------------------------------- sampling

SPLITS = ('train', 'eval')


def split_of(key: str, eval_fraction: float) -> str:
  """Deterministic split of a problem by its canonical key."""
  h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], 'big')
  return 'eval' if (h % 10_000) < eval_fraction * 10_000 else 'train'


def sample(make: Callable[[random.Random, int], tuple[str, Record]], *,
           domain: str, split: str, n: int, seed: int,
           levels: Sequence[int], eval_fraction: float = 0.2,
           split_by: str = 'problem',
           response_quality: float = 1.0,
           flaw: Callable[[random.Random, Record], str] | None = None,
           max_tries_per_item: int = 200) -> list[Record]:
  """Draws `n` distinct records of one split.

  `make(rng, level)` returns (key, record): the key names the underlying
  problem (e.g. '7+5' for every phrasing of 7 + 5). With split_by='problem'
  (the default) the split is a hash of the key, so no problem appears in
  both splits, whatever the seeds; with split_by='prompt' it is a hash of
  the prompt text, so the splits share no prompt but a problem may recur in
  other words (a gentler held-out test for very small models).

  SFT data is rarely all correct. With `response_quality` < 1, each record's
  reference `response` is, with probability 1 - response_quality, replaced by
  `flaw(rng, record)`: a plausible wrong answer that the verifier rejects
  (the record is marked `flawed: True`). For a multi-turn domain `flaw`
  returns a whole failing demonstration, which replaces the record's `turns`. The problems drawn do not depend on
  it (a separate random stream decides), so the eval split is the same. A
  model fine-tuned on such data produces the right answer only part of the
  time, and RL on the domain has that to fix.
  """
  if split_by not in ('problem', 'prompt'):
    raise ValueError(f"split_by must be 'problem' or 'prompt', got {split_by!r}")
  if split not in SPLITS:
    raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
  if not levels:
    raise ValueError('levels must name at least one difficulty level')
  if not 0.0 <= response_quality <= 1.0:
    raise ValueError(f'{domain}: response_quality must be in [0, 1], got '
                     f'{response_quality}')
  if response_quality < 1.0 and flaw is None:
    raise ValueError(f'{domain}: this domain has no flawed responses, so '
                     'response_quality must be 1.0')
  rng = random.Random(f'{domain}/{split}/{seed}')
  flaw_rng = random.Random(f'{domain}/{split}/{seed}/flaw')
  out, seen = [], set()
  tries = 0
  while len(out) < n:
    tries += 1
    if tries > max_tries_per_item * max(n, 10):
      raise ValueError(
          f'{domain}: found only {len(out)} distinct {split} problems at '
          f'levels {tuple(levels)} (asked for {n}); widen the levels')
    level = rng.choice(list(levels))
    key, rec = make(rng, level)
    split_key = key if split_by == 'problem' else rec['messages'][-1]['content']
    if split_of(f'{domain}/{split_key}', eval_fraction) != split:
      continue
    ident = (key, rec['messages'][-1]['content'])
    if ident in seen:
      continue
    seen.add(ident)
    rec = dict(id=f'{domain}-{split}-{len(out):06d}', domain=domain,
               level=level, **rec)
    if response_quality < 1.0 and flaw_rng.random() >= response_quality:
      bad = flaw(flaw_rng, rec)
      rec['turns' if isinstance(bad, list) else 'response'] = bad
      rec['flawed'] = True
    out.append(rec)
  return out


def user(text: str) -> list[dict[str, str]]:
  return [{'role': 'user', 'content': text}]


# ----------------------------------------------------- response helpers



def strip_think(response: str) -> str:
  """The answer part of a response: everything outside <think> blocks.

  A block runs from a <think> to the first </think> after it; after an
  unclosed <think> nothing counts. One pass (linear: a lazy regex over a
  flood of unclosed tags is quadratic, and responses are model-written).
  """
  kept, at = [], 0
  while (start := response.find('<think>', at)) >= 0:
    kept.append(response[at:start])
    end = response.find('</think>', start + len('<think>'))
    if end < 0:
      return ''.join(kept).strip()
    at = end + len('</think>')
  kept.append(response[at:])
  return ''.join(kept).strip()


def last_boxed(text: str) -> str | None:
  r"""Content of the last \boxed{...}, braces balanced; None if absent."""
  start = text.rfind('\\boxed{')
  if start < 0:
    return None
  i = start + len('\\boxed{')
  depth = 1
  for j in range(i, len(text)):
    if text[j] == '{':
      depth += 1
    elif text[j] == '}':
      depth -= 1
      if depth == 0:
        return text[i:j].strip()
  return None


def extract_code(response: str) -> str:
  """The first fenced code block (```python ... ```), else the whole answer."""
  text = strip_think(response)
  m = re.search(r'```[a-zA-Z0-9_+-]*\n(.*?)```', text, re.S)
  return (m.group(1) if m else text).strip('\n') + '\n'


def binary(ok: bool, **details) -> Score:
  return Score(float(ok), bool(ok), details)
