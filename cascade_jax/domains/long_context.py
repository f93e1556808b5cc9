r"""Long context: retrieval and aggregation over a long list of records.

Kinds: `lookup` (the value of one key among many), `needle` (a number
hidden among filler sentences), `count` (how many records have a value),
`has` (whether a key is among the records: yes / no). `kinds` picks them,
uniformly over the tuple (repeat one to weight it; default: half lookups).
The context length is set by `num_records` (default: 8 / 16 / 32 for
levels 1 / 2 / 3) or, when given, `context_chars`, which adds records until
the context reaches that many characters. Keys are animal names (`keys=
'words'`, 3-letter strings once those run out) or random 3-letter strings
(`keys='random'`). Answers go in \boxed{}.
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


# Record keys are words by default (`keys='words'`): each is one token once
# the tokenizer has seen them, so a lookup is associative recall over tokens,
# which a small model learns; `keys='random'` draws 3-letter strings
# (several tokens each: much harder at that size).
KEY_WORDS = (
    'ant', 'bee', 'cow', 'dog', 'eel', 'fox', 'gnu', 'hen', 'ibis', 'jay',
    'kiwi', 'lark', 'mole', 'newt', 'owl', 'pig', 'quail', 'rat', 'seal',
    'toad', 'urchin', 'vole', 'wasp', 'yak', 'zebra', 'bat', 'cat', 'duck',
    'elk', 'frog', 'goat', 'hare', 'lion', 'mink', 'moth', 'mouse', 'crab',
    'crow', 'deer', 'dove', 'fish', 'gull', 'hawk', 'lamb', 'mule', 'puma',
    'swan', 'wolf', 'wren', 'bear', 'boar', 'clam', 'colt', 'flea', 'gnat',
    'ape', 'asp', 'emu', 'koi', 'orca', 'pony', 'ram', 'slug', 'tick')


def _key(rng, keys='words', used=()):
  if keys == 'words' and len(used) < len(KEY_WORDS):
    return rng.choice(KEY_WORDS)
  return ''.join(rng.choice(string.ascii_lowercase) for _ in range(3))


KINDS = ('lookup', 'needle', 'count', 'has')
DEFAULT_KINDS = ('lookup', 'lookup', 'needle', 'count')


def _make(rng: random.Random, level: int, num_records=None,
          context_chars=None, keys='words', kinds=DEFAULT_KINDS):
  n = num_records or _RECORDS[level]
  kind = rng.choice(kinds)
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
    pairs, seen = [], set()
    while len(pairs) < n or (context_chars and
                             sum(len(k) + len(v) + 2 for k, v in pairs)
                             < context_chars):
      k = _key(rng, keys, seen)
      if k not in seen:
        seen.add(k)
        pairs.append((k, rng.choice(VALUES)))
    lines = [f'{k}: {v}' for k, v in pairs]
    if kind == 'lookup':
      k, v = rng.choice(pairs)
      q, answer = f'What is the value of {k}?', v
    elif kind == 'has':
      present = rng.random() < 0.5 or len(seen) >= len(KEY_WORDS)
      k = (rng.choice(pairs)[0] if present else
           rng.choice([w for w in KEY_WORDS if w not in seen]))
      q, answer = f'Is there a record for {k}? Answer yes or no.', (
          'yes' if present else 'no')
    else:
      v = rng.choice(VALUES)
      q = f'How many records have the value {v}?'
      answer = str(sum(1 for _, x in pairs if x == v))
  prompt = 'Records:\n' + '\n'.join(lines) + f'\n\n{q}'
  return prompt, dict(messages=_base.user(prompt), kind=kind, answer=answer,
                      response=f'\\boxed{{{answer}}}')


def _flaw(rng: random.Random, rec: dict) -> str:
  """Another record's value, a near-miss number, or a count off by one."""
  answer = rec['answer']
  if rec['kind'] == 'lookup':
    wrong = rng.choice([v for v in VALUES if v != answer])
  elif rec['kind'] == 'needle':
    wrong = str(int(answer) + rng.choice((-10, -1, 1, 10)))
  elif rec['kind'] == 'has':
    wrong = 'no' if answer == 'yes' else 'yes'
  else:
    wrong = str(int(answer) + (1 if answer == '0' else rng.choice((-1, 1))))
  return f'\\boxed{{{wrong}}}'


def generate(*, split, n, seed, levels=(1, 2, 3), eval_fraction=0.2,
             split_by='problem', response_quality=1.0,
             num_records=None, context_chars=None, keys='words',
             kinds=DEFAULT_KINDS):
  if keys not in ('words', 'random'):
    raise ValueError(f"long_context: keys must be 'words' or 'random', got "
                     f'{keys!r}')
  bad = sorted(set(kinds) - set(KINDS))
  if not kinds or bad:
    raise ValueError(f'long_context: kinds must be drawn from {KINDS}, got '
                     f'{tuple(kinds)}')
  make = lambda rng, level: _make(rng, level, num_records, context_chars, keys,
                                  tuple(kinds))
  return _base.sample(make, domain='long_context', split=split, n=n,
                      seed=seed, levels=levels, eval_fraction=eval_fraction,
                      split_by=split_by, response_quality=response_quality,
                      flaw=_flaw)


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
