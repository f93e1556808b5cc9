r"""Math: arithmetic and algebra word problems, answers in \boxed{}, checked with math-verify.

Levels: 1 single-digit sums and differences; 2 two-digit sums, products,
word problems; 3 linear equations and fraction sums (answers such as 3/4,
for which 0.75 and \frac{3}{4} are accepted as well).
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


def _arith(rng, a, b, op):
  value = {'+': a + b, '-': a - b, '*': a * b}[op]
  q = rng.choice(PHRASINGS[op]).format(a=a, b=b)
  return f'{a}{op}{b}', dict(messages=_base.user(q), answer=str(value),
                             response=_boxed(value))


def _make(rng: random.Random, level: int):
  if level == 1:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return _arith(rng, a, b, '+' if rng.random() < 0.5 or a < b else '-')
  if level == 2:
    kind = rng.choice(('add', 'mul', 'word'))
    if kind == 'add':
      return _arith(rng, rng.randint(10, 99), rng.randint(10, 99), '+')
    if kind == 'mul':
      return _arith(rng, rng.randint(2, 9), rng.randint(2, 9), '*')
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    q = (f'{name} has {a} {thing} and gets {b} more. '
         f'How many {thing} does {name} have now?')
    return f'{a}+{b}', dict(messages=_base.user(q), answer=str(a + b),
                            response=_boxed(a + b))
  kind = rng.choice(('linear', 'frac'))
  if kind == 'linear':
    a, x, b = rng.randint(2, 9), rng.randint(-9, 12), rng.randint(0, 20)
    c = a * x + b
    q = f'Solve for x: {a}x + {b} = {c}.'
    return f'{a}x+{b}={c}', dict(messages=_base.user(q), answer=str(x),
                                 response=_boxed(x))
  p, q = rng.randint(1, 5), rng.choice((2, 3, 4, 5, 6, 8))
  r, s = rng.randint(1, 5), rng.choice((2, 3, 4, 5, 6, 8))
  total = fractions.Fraction(p, q) + fractions.Fraction(r, s)
  ans = (str(total.numerator) if total.denominator == 1
         else f'{total.numerator}/{total.denominator}')
  return f'{p}/{q}+{r}/{s}', dict(
      messages=_base.user(f'What is {p}/{q} + {r}/{s}? Give a fraction.'),
      answer=ans, response=_boxed(ans))


def _flaw(rng: random.Random, rec: dict) -> str:
  """An answer off by a little (the numerator, for a fraction)."""
  num, _, den = rec['answer'].partition('/')
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
