r"""Multi-domain RL tasks, mixed as in the recipe: multiple choice (55%), tool calls (30%), structured output (15%).

- mcq: four options A-D, answer `\boxed{C}` (a bare final letter also counts).
- tool_call: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
  right tool and right arguments, or nothing.
- structured: a JSON object with the required keys; the reward is the
  fraction of keys with the right value, `passed` needs all and no extras.
Levels raise the number of distractors that are close to the answer.
`kinds` reweights the mix (e.g. {'structured': 0.5, 'tool_call': 0.3,
'mcq': 0.2}); the default is the recipe's.
"""

from __future__ import annotations

import json
import random
import re

from cascade_jax.domains import _base

KIND_WEIGHTS = (('mcq', 0.55), ('tool_call', 0.30), ('structured', 0.15))
LETTERS = 'ABCD'
CATEGORIES = {
    'an animal': ('dog', 'cat', 'horse', 'goat', 'owl', 'frog', 'bear'),
    'a color': ('red', 'blue', 'green', 'pink', 'gray', 'gold', 'teal'),
    'a fruit': ('apple', 'pear', 'plum', 'lime', 'grape', 'mango', 'kiwi'),
    'a tool': ('hammer', 'saw', 'drill', 'wrench', 'file', 'chisel', 'axe'),
}
CITIES = ('Paris', 'Oslo', 'Lima', 'Rome', 'Cairo', 'Tokyo', 'Quito', 'Bern')
PEOPLE = ('Ada', 'Ben', 'Cora', 'Dev', 'Ella', 'Femi', 'Gil', 'Hugo')
TOOLS_TEXT = ('Tools: get_weather(city), add(a, b), '
              'convert(amount, unit_from, unit_to).')
UNITS = (('km', 'mi'), ('kg', 'lb'), ('c', 'f'))


def _mcq(rng: random.Random, level: int):
  kind = rng.choice(('largest', 'smallest', 'category', 'sum'))
  if kind in ('largest', 'smallest'):
    spread = {1: 50, 2: 20, 3: 6}[level]
    base = rng.randint(10, 60)
    opts = rng.sample(range(base, base + spread), 4)
    right = max(opts) if kind == 'largest' else min(opts)
    q = f'Which number is the {kind}?'
    key = f'{kind}:{sorted(opts)}'
  elif kind == 'category':
    cat = rng.choice(sorted(CATEGORIES))
    right = rng.choice(CATEGORIES[cat])
    others = [w for c, ws in CATEGORIES.items() if c != cat for w in ws]
    opts = [right] + rng.sample(others, 3)
    rng.shuffle(opts)
    q = f'Which word is {cat}?'
    key = f'cat:{cat}:{sorted(opts)}'
  else:
    a, b = rng.randint(2, 9 * level), rng.randint(2, 9 * level)
    right = a + b
    wrong = set()
    while len(wrong) < 3:
      d = rng.randint(-level - 1, level + 1)
      if d:
        wrong.add(right + d)
    opts = [right] + sorted(wrong)
    rng.shuffle(opts)
    q = f'What is {a} + {b}?'
    key = f'sum:{a}+{b}:{sorted(opts)}'
  letter = LETTERS[opts.index(right)]
  body = q + '\n' + '\n'.join(f'{l}) {o}' for l, o in zip(LETTERS, opts))
  return key, dict(messages=_base.user(body), kind='mcq', answer=letter,
                   response=f'\\boxed{{{letter}}}')


def _tool_call(rng: random.Random, level: int):
  kind = rng.choice(('weather', 'add', 'convert')[:level])
  if kind == 'weather':
    city = rng.choice(CITIES)
    q, call = f'What is the weather in {city}?', dict(
        name='get_weather', arguments=dict(city=city))
  elif kind == 'add':
    a, b = rng.randint(1, 99), rng.randint(1, 99)
    q, call = f'Add {a} and {b}.', dict(name='add', arguments=dict(a=a, b=b))
  else:
    amount = rng.randint(1, 500)
    frm, to = rng.choice(UNITS)
    if rng.random() < 0.5:
      frm, to = to, frm
    q, call = f'Convert {amount} {frm} to {to}.', dict(
        name='convert', arguments=dict(amount=amount, unit_from=frm,
                                       unit_to=to))
  text = f'{TOOLS_TEXT}\n{q}'
  return json.dumps(call, sort_keys=True), dict(
      messages=_base.user(text), kind='tool_call', answer=call,
      response=f'<tool_call>{json.dumps(call)}</tool_call>')


def _structured(rng: random.Random, level: int):
  person, city = rng.choice(PEOPLE), rng.choice(CITIES)
  age = rng.randint(18, 90)
  facts = dict(name=person, age=age, city=city)
  keys = ['name', 'age', 'city'][:level]
  text = f'{person} is {age} years old and lives in {city}.'
  want = {k: facts[k] for k in keys}
  q = (f'Extract a JSON object with the keys '
       f"{', '.join(repr(k) for k in keys)} from: {text}")
  return json.dumps([text, keys]), dict(
      messages=_base.user(q), kind='structured', answer=want,
      response=json.dumps(want))


_MAKERS = {'mcq': _mcq, 'tool_call': _tool_call, 'structured': _structured}


def _make(rng: random.Random, level: int, kind_weights=KIND_WEIGHTS):
  kinds, weights = zip(*kind_weights)
  kind = rng.choices(kinds, weights)[0]
  key, rec = _MAKERS[kind](rng, level)
  return f'{kind}/{key}', rec


def _flaw(rng: random.Random, rec: dict) -> str:
  """A wrong letter, a tool call with one wrong argument, or a wrong value."""
  if rec['kind'] == 'mcq':
    wrong = rng.choice([x for x in LETTERS if x != rec['answer']])
    return f'\\boxed{{{wrong}}}'
  want = rec['answer']
  if rec['kind'] == 'tool_call':
    call = json.loads(json.dumps(want))
    args = call['arguments']
    if 'city' in args:
      args['city'] = rng.choice([c for c in CITIES if c != args['city']])
    elif 'unit_to' in args:
      args['unit_from'], args['unit_to'] = args['unit_to'], args['unit_from']
    else:
      args['b'] += rng.choice((-2, -1, 1, 2))
    return f'<tool_call>{json.dumps(call)}</tool_call>'
  obj = dict(want)
  k = rng.choice(sorted(obj))
  if k == 'age':
    obj[k] += rng.choice((-2, -1, 1, 2))
  else:
    obj[k] = rng.choice([x for x in (PEOPLE if k == 'name' else CITIES)
                         if x != obj[k]])
  return json.dumps(obj)


def generate(*, split, n, seed, levels=(1, 2, 3), eval_fraction=0.2,
             split_by='problem', response_quality=1.0, kinds=None):
  weights = KIND_WEIGHTS
  if kinds is not None:
    kinds = dict(kinds)
    bad = sorted(set(kinds) - set(_MAKERS))
    if bad or not kinds or any(w < 0 for w in kinds.values()) or not sum(
        kinds.values()):
      raise ValueError(f'multi_domain: kinds must map some of '
                       f'{sorted(_MAKERS)} to weights >= 0 (not all 0), got '
                       f'{kinds}')
    weights = tuple(sorted(kinds.items()))
  make = lambda rng, level: _make(rng, level, weights)
  return _base.sample(make, domain='multi_domain', split=split, n=n,
                      seed=seed, levels=levels, eval_fraction=eval_fraction,
                      split_by=split_by, response_quality=response_quality,
                      flaw=_flaw)


# ----------------------------------------------------------- verifying

_LETTER_END = re.compile(r'(?:^|[^A-Za-z])([A-D])\W*$')
_TOOL = re.compile(r'<tool_call>(.*?)</tool_call>', re.S)


def _json_object(text: str):
  text = text.strip()
  m = re.fullmatch(r'```(?:json)?\s*(.*?)\s*```', text, re.S)
  if m:
    text = m.group(1)
  try:
    obj = json.loads(text)
  except ValueError:
    return None
  return obj if isinstance(obj, dict) else None


def _same(a, b) -> bool:
  if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not (
      isinstance(a, bool) or isinstance(b, bool)):
    return abs(a - b) < 1e-9
  if isinstance(a, str) and isinstance(b, str):
    return a.strip().lower() == b.strip().lower()
  return a == b


def score_one(rec, response: str) -> _base.Score:
  text = _base.strip_think(response)
  kind = rec.get('kind', 'mcq')
  if kind == 'mcq':
    boxed = _base.last_boxed(text)
    if boxed is not None:
      got = boxed.strip().strip('()').upper()
    else:
      m = _LETTER_END.search(text)
      got = m.group(1) if m else None
    return _base.binary(got == rec['answer'], predicted=got)
  if kind == 'tool_call':
    calls = _TOOL.findall(text)
    call = _json_object(calls[-1]) if calls else None
    if call is None:
      return _base.binary(False, reason='no parsable <tool_call>')
    want = rec['answer']
    args = call.get('arguments')
    ok = (call.get('name') == want['name'] and isinstance(args, dict) and
          set(args) == set(want['arguments']) and
          all(_same(args[k], v) for k, v in want['arguments'].items()))
    return _base.binary(ok, name=call.get('name'))
  if kind == 'structured':
    obj = _json_object(text)
    if obj is None:
      return _base.binary(False, reason='not a JSON object')
    want = rec['answer']
    right = [k for k, v in want.items() if k in obj and _same(obj[k], v)]
    return _base.Score(len(right) / len(want),
                       len(right) == len(want) and set(obj) == set(want),
                       {'right_keys': right})
  raise ValueError(f"record {rec.get('id')}: unknown multi_domain kind {kind!r}")


def verify(records, responses, *, sandbox=None):
  del sandbox
  return [score_one(r, s) for r, s in zip(records, responses, strict=True)]


DOMAIN = _base.Domain(
    name='multi_domain', generate=generate, verify=verify,
    required_fields=('answer',),
    description='MCQ 55% / tool calls 30% / structured JSON 15%')
