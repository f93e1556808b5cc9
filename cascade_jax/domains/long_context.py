r"""Long context: retrieval and aggregation over a long list of records.

Kinds: `lookup` (the value of one key among many), `needle` (a number
hidden among filler sentences), `count` (how many records have a value).
The context length is set by `num_records` (default: 8 / 16 / 32 for
levels 1 / 2 / 3) or, when given, `context_chars`, which adds records until
the context reaches that many characters. Answers go in \boxed{}.
"""

from __future__ import annotations

import random
import string

from cascade_jax.domains import _base

VALUES = ('red', 'blue', 'green', 'gold', 'pink', 'gray', 'teal', 'plum')
FILLER = ('The sky was clear.', 'A bird sang outside.', 'The road was long.',
          'Tea was served at noon.', 'The lamp was on.', 'It rained later.',
          'The door was open.', 'A cat slept nearby.')
_RECORDS = {1: 8, 2: 16, 3: 32}


def _key(rng):
  return ''.join(rng.choice(string.ascii_lowercase) for _ in range(3))


def _make(rng: random.Random, level: int, num_records=None,
          context_chars=None):
  n = num_records or _RECORDS[level]
  kind = rng.choice(('lookup', 'lookup', 'needle', 'count'))
  if kind == 'needle':
    secret = rng.randint(1000, 9999)
    lines = [rng.choice(FILLER) for _ in range(n)]
    while context_chars and sum(map(len, lines)) < context_chars:
      lines.append(rng.choice(FILLER))
    lines.insert(rng.randrange(len(lines) + 1),
                 f'The secret number is {secret}.')
    q = 'What is the secret number?'
    answer = str(secret)
  else:
    pairs, keys = [], set()
    while len(pairs) < n or (context_chars and
                             sum(len(k) + len(v) + 2 for k, v in pairs)
                             < context_chars):
      k = _key(rng)
      if k not in keys:
        keys.add(k)
        pairs.append((k, rng.choice(VALUES)))
    lines = [f'{k}: {v}' for k, v in pairs]
    if kind == 'lookup':
      k, v = rng.choice(pairs)
      q, answer = f'What is the value of {k}?', v
    else:
      v = rng.choice(VALUES)
      q = f'How many records have the value {v}?'
      answer = str(sum(1 for _, x in pairs if x == v))
  prompt = 'Records:\n' + '\n'.join(lines) + f'\n\n{q}'
  return prompt, dict(messages=_base.user(prompt), kind=kind, answer=answer,
                      response=f'\\boxed{{{answer}}}')


def generate(*, split, n, seed, levels=(1, 2, 3), eval_fraction=0.2,
             split_by='problem',
             num_records=None, context_chars=None):
  make = lambda rng, level: _make(rng, level, num_records, context_chars)
  return _base.sample(make, domain='long_context', split=split, n=n,
                      seed=seed, levels=levels, eval_fraction=eval_fraction,
                      split_by=split_by)


def _norm(s: str) -> str:
  return s.strip().strip('.').strip().lower()


def verify(records, responses, *, sandbox=None):
  del sandbox
  out = []
  for rec, resp in zip(records, responses, strict=True):
    text = _base.strip_think(resp)
    boxed = _base.last_boxed(text)
    got = boxed if boxed is not None else text
    out.append(_base.binary(_norm(got) == _norm(str(rec['answer'])),
                            predicted=got[:100]))
  return out


DOMAIN = _base.Domain(
    name='long_context', generate=generate, verify=verify,
    required_fields=('answer',),
    description='key-value lookup, needle, counting over long contexts')
