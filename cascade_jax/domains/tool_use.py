r"""Executed tool calling: call tools, read their results, answer `\boxed{...}`; the answer is verified.

The multi-domain stage's agentic part (30% of the recipe's multi-domain
mix). Unlike `multi_domain`'s `tool_call` kind, which judges the call as
text, here the calls run: the model writes `<tool_call>{json}</tool_call>`,
the environment executes it against deterministic tools and answers with a
`tool` message, and the episode ends at the first message without a tool
call, whose `\boxed{}` answer is checked against the true result.

Tools (pure functions of their arguments and the record's own weather
table, which differs per record, so a value cannot be memorised):
get_weather(city), add(a, b), multiply(a, b), convert(amount, unit_from,
unit_to). Levels: 1 a weather lookup; 2 an addition of three-digit numbers;
3 a lookup then a conversion (the temperature in Fahrenheit: two calls).
"""

from __future__ import annotations

import random

from cascade_jax import envs
from cascade_jax.domains import _base

CITIES = ('Paris', 'Oslo', 'Lima', 'Rome', 'Cairo', 'Tokyo', 'Quito', 'Bern')
SKIES = ('sunny', 'cloudy', 'rain', 'snow', 'fog')
# unit -> (other unit, factor or function)
_CONVERT = {('km', 'mi'): lambda x: x * 0.621371,
            ('mi', 'km'): lambda x: x / 0.621371,
            ('kg', 'lb'): lambda x: x * 2.20462,
            ('lb', 'kg'): lambda x: x / 2.20462,
            ('c', 'f'): lambda x: x * 9 / 5 + 32,
            ('f', 'c'): lambda x: (x - 32) * 5 / 9}
TOOLS_TEXT = ('Tools: get_weather(city), add(a, b), multiply(a, b), '
              'convert(amount, unit_from, unit_to).')
MAX_CALLS_PER_TURN = 4


def _number(x: float) -> str:
  """Tool outputs and answers: integers as such, else one decimal."""
  r = round(x, 1)
  return str(int(r)) if r == int(r) else f'{r:.1f}'


def toolbox(weather: dict) -> envs.Toolbox:
  """The tools of one record (its weather table)."""
  def get_weather(city):
    if city not in weather:
      raise envs.ToolCallError(f'no weather for {city!r}; cities: '
                               f'{", ".join(sorted(weather))}')
    temp, sky = weather[city]
    return f'{city}: {temp} C, {sky}'

  def convert(amount, unit_from, unit_to):
    fn = _CONVERT.get((str(unit_from).lower(), str(unit_to).lower()))
    if fn is None:
      raise envs.ToolCallError(
          f'cannot convert {unit_from!r} to {unit_to!r}; pairs: '
          f'{", ".join(f"{a}->{b}" for a, b in _CONVERT)}')
    return _number(fn(amount))

  num = (int, float)
  return envs.Toolbox([
      envs.Tool('get_weather', (('city', str),), get_weather),
      envs.Tool('add', (('a', num), ('b', num)), lambda a, b: _number(a + b)),
      envs.Tool('multiply', (('a', num), ('b', num)),
                lambda a, b: _number(a * b)),
      envs.Tool('convert', (('amount', num), ('unit_from', str),
                            ('unit_to', str)), convert),
  ])


def _make(rng: random.Random, level: int):
  weather = {c: (rng.randint(-10, 35), rng.choice(SKIES)) for c in CITIES}
  city = rng.choice(CITIES)
  if level == 1:
    q = f'What is the temperature in {city}, in C?'
    calls = [envs.format_call('get_weather', city=city)]
    answer = _number(weather[city][0])
    key = f'weather:{city}:{weather[city][0]}'
  elif level == 2:
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    q = f'What is {a} + {b}?'
    calls = [envs.format_call('add', a=a, b=b)]
    answer = _number(a + b)
    key = f'add:{a}+{b}'
  else:
    temp = weather[city][0]
    q = f'What is the temperature in {city}, in F?'
    calls = [envs.format_call('get_weather', city=city),
             envs.format_call('convert', amount=temp, unit_from='c',
                              unit_to='f')]
    answer = _number(temp * 9 / 5 + 32)
    key = f'weather_f:{city}:{temp}'
  rec = dict(messages=_base.user(f'{TOOLS_TEXT}\n{q}'),
             weather={c: list(v) for c, v in weather.items()}, answer=answer)
  rec['turns'] = _demonstration(rec, calls + [f'\\boxed{{{answer}}}'])
  return key, rec


def _demonstration(rec, replies, reward=1.0):
  convo, step = envs.run_scripted(ToolUseEnv(), rec, replies)
  if not (step.done and step.reward == reward):
    raise AssertionError(f'tool_use: the demonstration earns {step.reward}, '
                         f'not {reward} ({step})')
  return convo[len(rec['messages']):]


def _flaw(rng: random.Random, rec: dict) -> list[dict]:
  """A weak teacher's episode, wrong: it guesses instead of calling the tool
  (levels 1 and 2: a plausible number, no call), or stops one call short
  (level 3: the Celsius value, the conversion skipped).

  The correct half of the data is then the only source of the answer's
  tokens after a tool result: copying the result is learned from it, and
  calling the tool is what RL has to make reliable.
  """
  calls = [m['content'] for m in rec['turns'][:-1]
           if m['role'] == 'assistant']
  want = float(rec['answer'])
  if rec['level'] == 3:
    city = envs.parse_tool_calls(calls[0])[0].arguments['city']
    return _demonstration(
        rec, calls[:1] + [f'\\boxed{{{rec["weather"][city][0]}}}'], 0.0)
  if rec['level'] == 1:
    got = rng.choice([t for t in range(-10, 36) if t != want])
  else:
    got = want + rng.choice((-100, -10, 10, 100))
  return _demonstration(rec, [f'\\boxed{{{_number(got)}}}'], 0.0)


def answer_matches(got: str | None, want: str) -> bool:
  if got is None:
    return False
  try:
    return abs(float(got.strip()) - float(want)) < 0.051
  except ValueError:
    return got.strip() == want


class ToolUseEnv:
  """Runs the record's tools for each call; the first message without one is the answer."""

  def __init__(self):
    self.rec = None
    self.toolbox = None

  def reset(self, record):
    self.rec = record
    self.toolbox = toolbox({c: tuple(v) for c, v in record['weather'].items()})
    return list(record['messages'])

  def step(self, assistant: str) -> envs.Step:
    if self.rec is None:
      raise RuntimeError('ToolUseEnv.step before reset')
    text = _base.strip_think(assistant)
    try:
      calls = envs.parse_tool_calls(text)
    except envs.ToolCallError as e:
      return envs.Step((envs.tool_message(f'error: {e}'),))
    if not calls:   # the final answer
      got = _base.last_boxed(text)
      ok = answer_matches(got, self.rec['answer'])
      return envs.Step(reward=float(ok), done=True,
                       info=dict(passed=ok, predicted=got))
    return envs.Step(self.toolbox.answer(calls, MAX_CALLS_PER_TURN))


def make_env(record, sandbox=None) -> ToolUseEnv:
  del record, sandbox    # the tools are pure functions: nothing to sandbox
  return ToolUseEnv()


def generate(*, split, n, seed, levels=(1, 2, 3), eval_fraction=0.2,
             split_by='problem', response_quality=1.0):
  return _base.sample(_make, domain='tool_use', split=split, n=n, seed=seed,
                      levels=levels, eval_fraction=eval_fraction,
                      split_by=split_by, response_quality=response_quality,
                      flaw=_flaw)


DOMAIN = _base.Domain(
    name='tool_use', generate=generate, verify=_base.episode_only('tool_use'),
    required_fields=('weather', 'answer'), env=make_env,
    episode_limits=dict(max_turns=4, max_new_tokens=48,
                        max_observation_tokens=32, max_tokens=256),
    description='executed tool calls (lookup, arithmetic, conversion), '
                'multi-turn; the final boxed answer verified')
