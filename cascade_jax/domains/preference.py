"""Preference (RLHF): prompts with chosen / rejected responses under one consistent taste.

The taste, which a small reward model can learn and the rule judge below
scores: a good answer names the prompt's topic, says something about it
(at least one of its descriptive words), is polite (no rude words), does not
repeat itself, and ends with a full stop. Each rejected response breaks one
or two of these rules; levels make the rejected one closer to the chosen
(1: off-topic or rude, 2: repetitive or unfinished, 3: one subtle flaw).

`verify` is that rule judge: reward = fraction of rules met; it is the
ground truth for evaluating RLHF, while RLHF training uses a reward model
fitted to the pairs.
"""

from __future__ import annotations

import random
import re

from cascade_jax.domains import _base

TOPICS = {
    'cats': ('soft', 'curious', 'quiet', 'playful'),
    'rain': ('wet', 'cool', 'gray', 'steady'),
    'the sea': ('deep', 'blue', 'salty', 'vast'),
    'bread': ('warm', 'fresh', 'soft', 'golden'),
    'music': ('loud', 'joyful', 'calm', 'rich'),
    'winter': ('cold', 'white', 'long', 'still'),
    'trains': ('fast', 'long', 'loud', 'busy'),
    'gardens': ('green', 'calm', 'bright', 'lush'),
}
RUDE = ('stupid', 'dumb', 'boring', 'idiot', 'whatever')
ASKS = ('Tell me about {t}.', 'Describe {t}.', 'What are {t} like?',
        'Say something about {t}.')
RULES = ('on_topic', 'informative', 'polite', 'no_repeat', 'finished')
_WORD = re.compile(r"[a-z']+")


def _good(rng, topic):
  a, b = rng.sample(TOPICS[topic], 2)
  name = topic[0].upper() + topic[1:]
  return rng.choice((f'{name} are {a} and {b}.', f'{name} can be {a} and {b}.',
                     f'I find {topic} {a} and {b}.'))


def _bad(rng, topic, level):
  others = [t for t in TOPICS if t != topic]
  if level == 1:
    flaw = rng.choice(('off_topic', 'rude'))
  elif level == 2:
    flaw = rng.choice(('repeat', 'unfinished'))
  else:
    flaw = rng.choice(('off_topic', 'rude', 'repeat', 'unfinished', 'vague'))
  good = _good(rng, topic)
  if flaw == 'off_topic':
    return _good(rng, rng.choice(others))
  if flaw == 'rude':
    return f'{rng.choice(RUDE).capitalize()} question. ' + good
  if flaw == 'repeat':
    w = rng.choice(TOPICS[topic])
    return f'{topic.capitalize()} are {w} {w} {w} {w}.'
  if flaw == 'unfinished':
    return good.rstrip('.') + ' and'
  return f'{topic.capitalize()} are things.'  # vague: says nothing


def _make(rng: random.Random, level: int, response_quality: float = 1.0):
  topic = rng.choice(sorted(TOPICS))
  prompt = rng.choice(ASKS).format(t=topic)
  chosen = _good(rng, topic)
  rejected = _bad(rng, topic, level)
  # SFT data is rarely all good: with response_quality < 1 the reference
  # response is sometimes the rejected one, which leaves RLHF work to do.
  response = chosen if rng.random() < response_quality else rejected
  return f'{prompt}|{chosen}|{rejected}', dict(
      messages=_base.user(prompt), topic=topic, chosen=chosen,
      rejected=rejected, response=response)


def generate(*, split, n, seed, levels=(1, 2, 3), eval_fraction=0.2,
             split_by='problem',
             response_quality=1.0):
  if not 0.0 <= response_quality <= 1.0:
    raise ValueError(f'preference: response_quality must be in [0, 1], got '
                     f'{response_quality}')
  make = lambda rng, level: _make(rng, level, response_quality)
  return _base.sample(make, domain='preference', split=split, n=n, seed=seed,
                      levels=levels, eval_fraction=eval_fraction,
                      split_by=split_by)


def judge(topic: str, text: str) -> dict[str, bool]:
  """Which of RULES the response meets."""
  ws = _WORD.findall(text.lower())
  topic_words = set(_WORD.findall(topic.lower())) - {'the'}
  return dict(
      on_topic=bool(topic_words & set(ws)),
      informative=bool(set(TOPICS.get(topic, ())) & set(ws)),
      polite=not set(RUDE) & set(ws),
      no_repeat=len(ws) > 0 and len(set(ws)) >= 0.75 * len(ws),
      finished=text.strip().endswith('.'))


def verify(records, responses, *, sandbox=None):
  del sandbox
  out = []
  for rec, resp in zip(records, responses, strict=True):
    if 'topic' not in rec:
      raise ValueError(
          f"record {rec['id']}: the rule judge needs a 'topic'; preference "
          'data of other kinds is scored by a reward model only')
    met = judge(rec['topic'], _base.strip_think(resp))
    out.append(_base.Score(sum(met.values()) / len(met), all(met.values()),
                           met))
  return out


DOMAIN = _base.Domain(
    name='preference', generate=generate, verify=verify,
    required_fields=('chosen', 'rejected'),
    description='chosen / rejected pairs; rule judge as ground truth')
