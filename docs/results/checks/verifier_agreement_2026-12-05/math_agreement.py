"""Our math verdict (`nemo_gym.math_reward`) against NeMo-Gym's math_with_judge library path (no judge), on generated answers.

  python docs/results/checks/verifier_agreement_2026-12-05/math_agreement.py \
      --gym=/path/to/extracted/Gym --n=1500 --seed=0 --out=math.json

`--gym` holds NeMo-Gym's `resources_servers/math_with_judge/app.py` (the
fetched snapshot, 07d6b0d). Its module-level `_run_math_verify` is run as
its subprocess runs it (math-verify built with the same extraction
configs, the gold's outer delimiters stripped and boxed), behind the gate
a later version of the server adds (05a4377 in the code index, not in the
snapshot): 0 unless the response has a complete, non-empty last
`\\boxed{}`. That gate is written here from that version's text (five
lines), the rest is the snapshot's own code. The names app.py imports from
NeMo-Gym's framework are stood in by empty modules and classes.
"""

import argparse
import json
import random
import sys
import types
from typing import Any

import pydantic

from cascade_jax.domains import nemo_gym

GOLDS = ['4', '12', '-3', '\\frac{3}{4}', '$\\frac{1}{2}$', '\\(2\\sqrt{2}\\)',
         '0.25', '\\pi', '(1, 3)', '[0, 1)', '\\{1, 2, 3\\}', 'x^2 + 1',
         '100\\%', '6.0', '2^{10}']
SAME = {'4': ['4', '4.0', '\\frac{8}{2}'], '12': ['12', '12.00'],
        '-3': ['-3', '-3.0'], '\\frac{3}{4}': ['\\frac{3}{4}', '0.75', '3/4'],
        '$\\frac{1}{2}$': ['\\frac{1}{2}', '0.5'],
        '\\(2\\sqrt{2}\\)': ['2\\sqrt{2}', '\\sqrt{8}'],
        '0.25': ['0.25', '\\frac{1}{4}'], '\\pi': ['\\pi'],
        '(1, 3)': ['(1, 3)', '(1,3)'], '[0, 1)': ['[0, 1)'],
        '\\{1, 2, 3\\}': ['\\{1, 2, 3\\}', '\\{3, 2, 1\\}'],
        'x^2 + 1': ['x^2 + 1', '1 + x^2'], '100\\%': ['100\\%', '100'],
        '6.0': ['6', '6.0'], '2^{10}': ['1024', '2^{10}']}


def _stub_framework():
  class Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra='allow',
                                       arbitrary_types_allowed=True)

  mods = {
      'nemo_gym': {},
      'nemo_gym.base_resources_server': dict(
          BaseResourcesServerConfig=Model, BaseRunRequest=Model,
          BaseVerifyRequest=Model, BaseVerifyResponse=Model,
          SimpleResourcesServer=Model),
      'nemo_gym.config_types': dict(ModelServerRef=Any),
      'nemo_gym.judge': dict(call_judge=None),
      'nemo_gym.openai_utils': dict(
          NeMoGymEasyInputMessage=Any, NeMoGymResponse=Any,
          NeMoGymResponseCreateParamsNonStreaming=Any),
      'nemo_gym.reward_profile': dict(compute_pass_majority_metrics=None,
                                      highest_k_metrics=None),
      'fastapi': dict(FastAPI=object),
  }
  for name, attrs in mods.items():
    m = types.ModuleType(name)
    for k, v in attrs.items():
      setattr(m, k, v)
    sys.modules[name] = m


def last_box(text: str):
  """05a4377's gate: the exact contents of the last complete \\boxed{}."""
  start = text.rfind('\\boxed{')
  if start < 0:
    return None
  depth, i0 = 1, start + len('\\boxed{')
  for i in range(i0, len(text)):
    depth += {'{': 1, '}': -1}.get(text[i], 0)
    if depth == 0:
      return text[i0:i]
  return None


def response(rng: random.Random, gold: str) -> tuple[str, str]:
  right = rng.choice(SAME[gold])
  wrong = rng.choice(['5', '\\frac{2}{3}', '-4', '(1, 4)', 'x^2', '7'])
  ans = right if rng.random() < 0.6 else wrong
  form = rng.choice(['boxed', 'boxed', 'unboxed', 'two_boxes', 'empty_box',
                     'open_box', 'think_box', 'dollar_box', 'text'])
  if form == 'boxed':
    return f'So the answer is \\boxed{{{ans}}}.', form
  if form == 'unboxed':
    return f'The answer is {ans}.', form
  if form == 'two_boxes':
    return f'First \\boxed{{{wrong}}}, then \\boxed{{{ans}}}.', form
  if form == 'empty_box':
    return f'It is {ans}. \\boxed{{ }}', form
  if form == 'open_box':
    return f'\\boxed{{{ans}', form
  if form == 'think_box':
    return f'<think>maybe \\boxed{{{ans}}}</think>The answer is {ans}.', form
  if form == 'dollar_box':
    return f'$\\boxed{{{ans}}}$', form
  return f'Answer: {ans}', form


def main():
  p = argparse.ArgumentParser()
  p.add_argument('--gym', required=True)
  p.add_argument('--n', type=int, default=1500)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--out', default='')
  a = p.parse_args()
  _stub_framework()
  sys.path.insert(0, a.gym)
  from resources_servers.math_with_judge import app  # pylint: disable=g-import-not-at-top
  verifier = app.math_metric(
      gold_extraction_target=(app.LatexExtractionConfig(),),
      pred_extraction_target=(app.ExprExtractionConfig(),
                              app.LatexExtractionConfig()))
  rng = random.Random(a.seed)
  stats, disagree = {}, []
  for _ in range(a.n):
    gold = rng.choice(GOLDS)
    text, form = response(rng, gold)
    box = last_box(text)
    ref = (0.0 if box is None or not box.strip() else
           app._run_math_verify(verifier, gold, text)[0])  # pylint: disable=protected-access
    ours = nemo_gym.math_reward(gold, text)[0]
    s = stats.setdefault(form, dict(n=0, agree=0, ref_one=0))
    s['n'] += 1
    s['agree'] += ours == ref
    s['ref_one'] += ref == 1.0
    if ours != ref:
      disagree.append(dict(gold=gold, response=text, form=form,
                           reference=ref, ours=ours))
  print(f"{'response form':<14}{'cases':>6}{'agree':>7}{'ref 1':>7}")
  for k, s in sorted(stats.items()):
    print(f"{k:<14}{s['n']:>6}{s['agree']:>7}{s['ref_one']:>7}")
  print(f"{'all':<14}{a.n:>6}{a.n - len(disagree):>7}")
  for d in disagree[:10]:
    print(json.dumps(d))
  if a.out:
    with open(a.out, 'w', encoding='utf-8') as f:
      json.dump(dict(n=a.n, seed=a.seed, stats=stats,
                     disagreements=disagree[:100]), f, indent=1)


if __name__ == '__main__':
  main()
