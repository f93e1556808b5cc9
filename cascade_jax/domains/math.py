r"""Math: arithmetic and algebra word problems, answers in \boxed{}, checked with math-verify.

Levels 1-3 are built on one small table of facts (results 0-9), so that a
model of a few million parameters part-learns them in minutes of CPU SFT and
RL has right answers to sharpen (CPU_SCALE.md: two-digit arithmetic stays at
~10-20% at this size; here the table of all single-digit sums and differences
stayed at ~0.1 after the main job's SFT):

  1  counting on or back: a + b and a - b with b <= 3 and a result of 0-9,
     bare or as a word problem ("Ann has 6 pens and gets 2 more ...");
     the reference reply counts in its thinking, as a person would:
     "<think>6 + 2: 6, 7, 8</think> \boxed{8}";
  2  fractions with one denominator: p/d + q/d and p/d - q/d (the numerator
     is a level-1 fact, the denominator is copied; 6/4 and 3/2 are equal
     to math-verify, so neither form is required);
  3  one-step equations: x + b = c, b + x = c, x - b = c (b <= 3), in
     several letters and phrasings.

Levels 4-5 are for larger models (a CPU-scale model stays under 0.05):

  4  two-digit sums, single-digit products, two-number word problems;
  5  linear equations ax + b = c and fraction sums with unlike
     denominators (answers such as 3/4; 0.75 and \frac{3}{4} accepted).
"""

from __future__ import annotations

import fractions
import random

from math_verify import parse as mv_parse
from math_verify import verify as mv_verify

from cascade_jax.domains import _base

NAMES = ('Ann', 'Bob', 'Cleo', 'Dan', 'Eve', 'Finn', 'Gus', 'Hana', 'Ivo',
         'Jo', 'Kai', 'Lea', 'Max', 'Nia', 'Oli', 'Pia')
THINGS = ('apples', 'pens', 'books', 'coins', 'shells', 'cards', 'stones',
          'eggs', 'cups', 'keys')
LEVELS = (1, 2, 3, 4, 5)
# Levels 1-3 count on or back by at most STEP: a table of 70 facts.
STEP = 3


def _boxed(x) -> str:
  return f'\\boxed{{{x}}}'


PHRASINGS = {
    '+': ('What is {a} + {b}?', 'Compute {a} + {b}.', '{a} + {b} = ?',
          'Add {a} and {b}.'),
    '-': ('What is {a} - {b}?', 'Compute {a} - {b}.', '{a} - {b} = ?',
          'Subtract {b} from {a}.'),
    '*': ('What is {a} * {b}?', 'Compute {a} * {b}.', '{a} * {b} = ?',
          'Multiply {a} by {b}.'),
}
WORDED = {
    '+': '{name} has {a} {thing} and gets {b} more. How many {thing} does '
         '{name} have now?',
    '-': '{name} has {a} {thing} and gives away {b}. How many {thing} does '
         '{name} have left?',
}
FRACTION_PHRASINGS = ('What is {p}/{d} {op} {q}/{d}?', 'Compute {p}/{d} {op} '
                      '{q}/{d}.', '{p}/{d} {op} {q}/{d} = ?',
                      'What is {p}/{d} {op} {q}/{d}? Give a fraction.')
EQUATION_PHRASINGS = ('Solve for {v}: {eq}.', 'Find {v} if {eq}.',
                      '{eq}. What is {v}?', 'If {eq}, then {v} = ?')
LETTERS = ('x', 'y', 'n', 'k')


def _record(key, question, answer, response=None, think=''):
  final = _boxed(answer if response is None else response)
  return key, dict(messages=_base.user(question), answer=str(answer),
                   response=f'<think>{think}</think> {final}' if think
                   else final)


def _count(a: int, b: int, op: str) -> str:
  """Counting on (or back) from a by b, as the reference works it out:
  '6 + 2: 6, 7, 8'. Each step is a successor (predecessor) fact."""
  sign = 1 if op == '+' else -1
  return f'{a} {op} {b}: ' + ', '.join(str(a + sign * k) for k in range(b + 1))


def _arith(rng, a, b, op):
  value = {'+': a + b, '-': a - b, '*': a * b}[op]
  return _record(f'{a}{op}{b}', rng.choice(PHRASINGS[op]).format(a=a, b=b),
                 value)


def _small_fact(rng):
  """(a, b, op): a + b or a - b with b <= STEP and a result of 0-9."""
  r, b = rng.randint(0, 9), rng.randint(0, STEP)
  if rng.random() < 0.5:
    b = min(b, r)
    return r - b, b, '+'
  return r + b, b, '-'


def _level1(rng):
  a, b, op = _small_fact(rng)
  if rng.random() < 0.5:
    q = rng.choice(PHRASINGS[op]).format(a=a, b=b)
  else:
    q = WORDED[op].format(name=rng.choice(NAMES), thing=rng.choice(THINGS),
                          a=a, b=b)
  return _record(f'{a}{op}{b}', q, a + b if op == '+' else a - b,
                 think=_count(a, b, op))


def _level2(rng):
  d = rng.randint(2, 9)
  a, b, op = _small_fact(rng)
  if a == 0 or b == 0:   # no 0/d terms: one fraction plus another
    a, b = max(a, 1), max(b, 1)
    op = '+' if a + b <= 9 else '-'
  num = a + b if op == '+' else a - b
  value = fractions.Fraction(num, d)
  gold = (str(value.numerator) if value.denominator == 1
          else f'{value.numerator}/{value.denominator}')
  question = rng.choice(FRACTION_PHRASINGS).format(p=a, q=b, d=d, op=op)
  # The reference counts the numerators and keeps the denominator
  # (math-verify accepts the unreduced answer for the reduced gold).
  return _record(f'{a}/{d}{op}{b}/{d}', question, gold, f'{num}/{d}',
                 think=_count(a, b, op))


def _level3(rng):
  x, v = rng.randint(0, 9), rng.choice(LETTERS)
  b = rng.randint(0, STEP)
  kind = rng.choice(('x+b', 'b+x', 'x-b'))
  if kind == 'x-b':     # v = c + b
    b = min(b, x)
    eq, think = f'{v} - {b} = {x - b}', _count(x - b, b, '+')
  else:                 # v = c - b
    x = min(x, 9 - b)
    eq = f'{v} + {b} = {x + b}' if kind == 'x+b' else f'{b} + {v} = {x + b}'
    think = _count(x + b, b, '-')
  return _record(f'{eq}', rng.choice(EQUATION_PHRASINGS).format(v=v, eq=eq),
                 x, think=f'{v} = {think}')


def _level4(rng):
  kind = rng.choice(('add', 'mul', 'word'))
  if kind == 'add':
    return _arith(rng, rng.randint(10, 99), rng.randint(10, 99), '+')
  if kind == 'mul':
    return _arith(rng, rng.randint(2, 9), rng.randint(2, 9), '*')
  a, b = rng.randint(2, 20), rng.randint(2, 20)
  q = WORDED['+'].format(name=rng.choice(NAMES), thing=rng.choice(THINGS),
                         a=a, b=b)
  return _record(f'{a}+{b}', q, a + b)


def _level5(rng):
  if rng.random() < 0.5:
    a, x, b = rng.randint(2, 9), rng.randint(-9, 12), rng.randint(0, 20)
    c = a * x + b
    return _record(f'{a}x+{b}={c}', f'Solve for x: {a}x + {b} = {c}.', x)
  p, q = rng.randint(1, 5), rng.choice((2, 3, 4, 5, 6, 8))
  r, s = rng.randint(1, 5), rng.choice((2, 3, 4, 5, 6, 8))
  total = fractions.Fraction(p, q) + fractions.Fraction(r, s)
  ans = (str(total.numerator) if total.denominator == 1
         else f'{total.numerator}/{total.denominator}')
  return _record(f'{p}/{q}+{r}/{s}',
                 f'What is {p}/{q} + {r}/{s}? Give a fraction.', ans)


_MAKERS = {1: _level1, 2: _level2, 3: _level3, 4: _level4, 5: _level5}


def _make(rng: random.Random, level: int):
  if level not in _MAKERS:
    raise ValueError(f'math: no level {level} (levels: {LEVELS})')
  return _MAKERS[level](rng)


def _flaw(rng: random.Random, rec: dict) -> str:
  """An answer off by a little (the numerator, for a fraction)."""
  given = _base.last_boxed(rec['response']) or rec['answer']
  num, _, den = given.partition('/')
  wrong = str(int(num) + rng.choice((-2, -1, 1, 2)))
  return _boxed(f'{wrong}/{den}' if den else wrong)


def generate(*, split, n, seed, levels=(1, 2, 3), eval_fraction=0.2,
             split_by='problem', response_quality=1.0):
  return _base.sample(_make, domain='math', split=split, n=n, seed=seed,
                      levels=levels, eval_fraction=eval_fraction,
                      split_by=split_by, response_quality=response_quality,
                      flaw=_flaw)


def answers_match(gold: str, predicted: str) -> bool:
  """Mathematical equivalence (1/2 = 0.5 = \\frac{1}{2}) via math-verify."""
  if predicted.strip() == gold.strip():
    return True
  try:
    # Wrapping both in $...$ makes math-verify read them as LaTeX math.
    return bool(mv_verify(mv_parse(f'${gold}$'), mv_parse(f'${predicted}$')))
  except Exception:  # pylint: disable=broad-except  # unparsable: not equal
    return False


def verify(records, responses, *, sandbox=None):
  del sandbox
  out = []
  for rec, resp in zip(records, responses, strict=True):
    pred = _base.last_boxed(_base.strip_think(resp))
    if pred is None:
      out.append(_base.binary(False, reason='no \\boxed{} answer'))
      continue
    ok = answers_match(str(rec['answer']), pred)
    out.append(_base.binary(ok, predicted=pred))
  return out


DOMAIN = _base.Domain(
    name='math', generate=generate, verify=verify,
    required_fields=('answer',),
    description='arithmetic and algebra, \\boxed{} answers, math-verify')
