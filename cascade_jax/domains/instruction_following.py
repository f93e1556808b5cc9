"""Instruction following (IFEval style): responses under checkable constraints.

The reward is the fraction of constraints met; `passed` means all of them.
Every prompt also asks to write about a topic: a generated record keeps it
(`topic`), and the response must use at least one of the topic's words,
counted as one more constraint (without it, "do not use X" or "at most 3
words" rewards any short generic reply, and RL finds that in a few steps).
Levels: 1, 2 or 3 constraints per prompt. Constraint kinds: word counts
(exactly / at most / at least), all lowercase, all capitals, required and
forbidden words, first and last word, bullet lists, JSON objects with keys.
"""

from __future__ import annotations

import json
import random
import re

from cascade_jax.domains import _base

TOPICS = {
    'cats': ('soft', 'paws', 'purr', 'nap', 'fur', 'whiskers', 'mouse'),
    'rain': ('wet', 'clouds', 'drops', 'gray', 'puddle', 'storm', 'cool'),
    'space': ('stars', 'moon', 'dark', 'orbit', 'rocket', 'vast', 'comet'),
    'food': ('bread', 'soup', 'salt', 'warm', 'spoon', 'rice', 'sweet'),
    'music': ('song', 'drum', 'beat', 'loud', 'tune', 'piano', 'choir'),
    'trees': ('leaf', 'root', 'green', 'bark', 'shade', 'branch', 'tall'),
    'sea': ('waves', 'salt', 'blue', 'fish', 'tide', 'shore', 'deep'),
    'winter': ('snow', 'cold', 'ice', 'coat', 'white', 'frost', 'scarf'),
}
EXTRA_WORDS = ('yes', 'now', 'here', 'so', 'well', 'fine', 'ok', 'true')
JSON_KEYS = ('name', 'color', 'size', 'mood', 'place', 'time')
_WORD = re.compile(r"[A-Za-z']+")


def words(text: str) -> list[str]:
  return _WORD.findall(text)


# ------------------------------------------------------------ checking


def _bullets(text: str) -> list[str]:
  return [ln for ln in text.splitlines() if ln.strip()]


def check(c: dict, text: str) -> bool:
  """Whether `text` meets constraint `c` (see the module docstring)."""
  kind = c['type']
  ws = [w.lower() for w in words(text)]
  if kind == 'word_count':
    n = len(ws)
    return {'exactly': n == c['n'], 'at_most': n <= c['n'],
            'at_least': n >= c['n']}[c['relation']]
  if kind == 'lowercase':
    return bool(ws) and text == text.lower()
  if kind == 'uppercase':
    return bool(ws) and text == text.upper()
  if kind == 'include':
    return c['word'].lower() in ws
  if kind == 'exclude':
    return c['word'].lower() not in ws
  if kind == 'start_with':
    return bool(ws) and ws[0] == c['word'].lower()
  if kind == 'end_with':
    return bool(ws) and ws[-1] == c['word'].lower()
  if kind == 'bullets':
    lines = _bullets(text)
    return len(lines) == c['n'] and all(
        ln.startswith('- ') and words(ln) for ln in lines)
  if kind == 'json_keys':
    try:
      obj = json.loads(text)
    except ValueError:
      return False
    return isinstance(obj, dict) and set(c['keys']) <= set(obj)
  raise ValueError(f'unknown constraint type {kind!r}')


def on_topic(topic: str, text: str) -> bool:
  """The response uses at least one of the topic's words."""
  return bool(set(TOPICS[topic]) & {w.lower() for w in words(text)})


def describe(c: dict) -> str:
  kind = c['type']
  if kind == 'word_count':
    return f"Use {c['relation'].replace('_', ' ')} {c['n']} words."
  if kind == 'lowercase':
    return 'Use only lowercase letters.'
  if kind == 'uppercase':
    return 'Use only capital letters.'
  if kind == 'include':
    return f"Include the word '{c['word']}'."
  if kind == 'exclude':
    return f"Do not use the word '{c['word']}'."
  if kind == 'start_with':
    return f"Start with the word '{c['word']}'."
  if kind == 'end_with':
    return f"End with the word '{c['word']}'."
  if kind == 'bullets':
    return f"Answer as a list of {c['n']} bullet points starting with '- '."
  if kind == 'json_keys':
    keys = ' and '.join(f"'{k}'" for k in c['keys'])
    return f'Answer as a JSON object with the keys {keys}.'
  raise ValueError(f'unknown constraint type {kind!r}')


# ---------------------------------------------------------- generating


def _make(rng: random.Random, level: int):
  topic = rng.choice(sorted(TOPICS))
  vocab = list(TOPICS[topic])
  fmt = rng.choice(('plain', 'plain', 'bullets', 'json')) if level > 1 else 'plain'
  cons: list[dict] = []
  case = rng.choice((None, 'lowercase', 'uppercase'))
  if fmt == 'plain':
    n = rng.randint(2, 5)
    pool = ['word_count', 'include', 'exclude', 'start_with', 'end_with',
            'case']
    picks = rng.sample(pool, level) if level > 1 else [rng.choice(pool)]
    if 'start_with' in picks and 'end_with' in picks:
      n = max(n, 3)   # a topic word between the first and the last
    body = rng.sample(vocab, n)
    if 'word_count' in picks:
      relation = rng.choice(('exactly', 'at_most', 'at_least'))
      cons.append(dict(type='word_count', relation=relation, n=n))
    if 'start_with' in picks:
      w = rng.choice(EXTRA_WORDS)
      body[0] = w
      cons.append(dict(type='start_with', word=w))
    if 'end_with' in picks:
      w = rng.choice([e for e in EXTRA_WORDS if e != body[0]])
      body[-1] = w
      cons.append(dict(type='end_with', word=w))
    if 'include' in picks:  # after the first / last words are settled
      cons.append(dict(type='include', word=body[rng.randrange(n)]))
    if 'exclude' in picks:
      cons.append(dict(type='exclude',
                       word=rng.choice([w for w in vocab if w not in body])))
    if 'case' in picks:
      case = case or 'lowercase'
      cons.append(dict(type=case))
    response = ' '.join(body)
  elif fmt == 'bullets':
    n = rng.randint(2, 4)
    cons.append(dict(type='bullets', n=n))
    items = rng.sample(vocab, n)
    if level == 3:
      w = rng.choice(items)
      cons.append(dict(type='include', word=w))
    if case:
      cons.append(dict(type=case))
    response = '\n'.join(f'- {w}' for w in items)
  else:
    keys = rng.sample(JSON_KEYS, rng.randint(1, 2 if level == 2 else 3))
    cons.append(dict(type='json_keys', keys=keys))
    response = json.dumps({k: rng.choice(vocab) for k in keys})
  if case in ('lowercase', 'uppercase') and dict(type=case) in cons:
    response = response.upper() if case == 'uppercase' else response.lower()
  prompt = f'Write about {topic}. ' + ' '.join(describe(c) for c in cons)
  key = json.dumps([topic, sorted(json.dumps(c, sort_keys=True) for c in cons)])
  return key, dict(messages=_base.user(prompt), constraints=cons,
                   response=response, topic=topic)


def _break(c: dict, text: str, topic: str, rng: random.Random) -> str:
  """`text` changed so that it misses constraint `c`."""
  kind = c['type']
  ws = text.split(' ')
  if kind == 'word_count':
    if c['relation'] == 'at_least':   # one word short
      return ' '.join(ws[:c['n'] - 1])
    # 'exactly': one word more; 'at_most': up to n + 1 words.
    extra = c['n'] + 1 - len(ws) if c['relation'] == 'at_most' else 1
    return ' '.join(ws + [rng.choice(TOPICS[topic])] * extra)
  if kind == 'lowercase':
    return text[:1].upper() + text[1:]
  if kind == 'uppercase':
    return text.lower()
  if kind == 'include':   # another topic word in its place
    other = rng.choice([w for w in TOPICS[topic] if w != c['word'].lower()])
    return re.sub(rf"\b{re.escape(c['word'])}\b",
                  lambda m: other.upper() if m.group(0).isupper() else other,
                  text, flags=re.I)
  if kind == 'exclude':
    return f"{text} {c['word']}"
  if kind in ('start_with', 'end_with'):
    return ' '.join(ws[1:] if kind == 'start_with' else ws[:-1])
  if kind == 'bullets':
    return '\n'.join(text.split('\n')[:-1])
  if kind == 'json_keys':
    obj = json.loads(text)
    obj.pop(c['keys'][-1], None)
    return json.dumps(obj)
  raise ValueError(f'unknown constraint type {kind!r}')


def _flaw(rng: random.Random, rec: dict) -> str:
  """The reference response with one constraint ignored."""
  cons = list(rec['constraints'])
  rng.shuffle(cons)
  for c in cons:
    text = _break(c, rec['response'], rec['topic'], rng)
    if not verify([rec], [text])[0].passed:
      return text
  return f'{rng.choice(EXTRA_WORDS)}.'   # off topic


def generate(*, split, n, seed, levels=(1, 2, 3), eval_fraction=0.2,
             split_by='problem', response_quality=1.0):
  return _base.sample(_make, domain='instruction_following', split=split, n=n,
                      seed=seed, levels=levels, eval_fraction=eval_fraction,
                      split_by=split_by, response_quality=response_quality,
                      flaw=_flaw)


def verify(records, responses, *, sandbox=None):
  del sandbox
  out = []
  for rec, resp in zip(records, responses, strict=True):
    text = _base.strip_think(resp)
    # Every prompt asks for writing: saying nothing meets no constraint
    # (else "at most 3 words" or "do not use X" would reward silence).
    met = [bool(words(text)) and check(c, text) for c in rec['constraints']]
    names = [check_name(c) for c in rec['constraints']]
    if rec.get('topic') in TOPICS:
      met.append(on_topic(rec['topic'], text))
      names.append('topic')
    out.append(_base.Score(sum(met) / max(len(met), 1), all(met),
                           {'met': met, 'checks': list(zip(names, met))}))
  return out


def check_name(c: dict) -> str:
  """A constraint's kind, for per-constraint breakdowns ('word_count:at_most')."""
  return c['type'] + (f":{c['relation']}" if 'relation' in c else '')


DOMAIN = _base.Domain(
    name='instruction_following', generate=generate, verify=verify,
    required_fields=('constraints',),
    description='IFEval-style constraints; reward = fraction met')
