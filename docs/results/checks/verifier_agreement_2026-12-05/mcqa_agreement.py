"""Our multiple-choice verifier (`_mcqa`) against NeMo-Gym's mcqa server's own verify, on generated responses.

  python docs/results/checks/verifier_agreement_2026-12-05/mcqa_agreement.py \
      --gym=/path/to/extracted/Gym --n=4000 --seed=0 --out=mcqa.json

`--gym` holds NeMo-Gym's `resources_servers/mcqa/app.py`. Its framework
(`nemo_gym`, fastapi) is not installed here: the few names app.py imports
from it are stood in by plain pydantic models, and its server's `verify`
is called as NeMo-Gym calls it (the response's `output_text`). The same
row goes through our reader (`nemo_gym.parse_row`) and `_mcqa.reward`.
Responses are drawn from answer forms the public MCQA rollouts show (boxed
letters and texts, `Answer:` lines with markdown, option text, letter
lists, other scripts, several boxes, thoughts), in every grading mode, with
and without a row regex.
"""

import argparse
import asyncio
import enum
import json
import random
import sys
import types
from typing import Any

import pydantic

from cascade_jax.domains import _mcqa
from cascade_jax.domains import nemo_gym


def _stub_framework():
  """The names app.py imports from nemo_gym and fastapi, as plain models."""
  base = types.ModuleType('nemo_gym.base_resources_server')

  class Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra='allow',
                                       arbitrary_types_allowed=True)

  class ReverifyMode(enum.Enum):
    STATELESS = 'stateless'

  class BaseVerifyRequest(Model):
    response: Any = None

  class BaseVerifyResponse(Model):
    reward: float

  class SimpleResourcesServer(Model):
    config: Any = None

  for name, obj in dict(BaseResourcesServerConfig=Model, BaseRunRequest=Model,
                        BaseVerifyRequest=BaseVerifyRequest,
                        BaseVerifyResponse=BaseVerifyResponse,
                        ReverifyMode=ReverifyMode,
                        SimpleResourcesServer=SimpleResourcesServer).items():
    setattr(base, name, obj)
  profile = types.ModuleType('nemo_gym.reward_profile')
  profile.compute_pass_majority_metrics = profile.highest_k_metrics = None
  fastapi = types.ModuleType('fastapi')
  fastapi.FastAPI = object
  sys.modules.update({'nemo_gym': types.ModuleType('nemo_gym'),
                      'nemo_gym.base_resources_server': base,
                      'nemo_gym.reward_profile': profile,
                      'fastapi': fastapi})


TEXTS = ['mitochondria', 'the Golgi apparatus', 'ribosomes', 'the nucleus',
         'E. coli', 'None of the above', 'Both A and B', '42', '3/4',
         'Paris', 'a decrease in pressure']
MODES = [None] + list(_mcqa.GRADING_MODES)
REGEXES = [None, r'Answer:\s*([A-Z])', [r'\(([A-J])\)', r'Answer:\s*(.+)'],
           r'final answer is ([A-Za-z]+)', r'(unclosed']


def response(rng: random.Random, opts: list[tuple[str, str]], gold: str):
  letter = rng.choice([gold] * 3 + [k for k, _ in opts])
  text = dict(opts)[letter]
  low = letter.lower()
  other = rng.choice([k for k, _ in opts])
  forms = [
      f'\\boxed{{{letter}}}', f'\\boxed{{\\text{{{letter}}}}}',
      f'\\boxed{{({letter})}}', f'\\boxed{{[{letter}]}}',
      f'\\boxed{{{letter}: {text}}}', f'\\boxed{{{letter}) {text}}}',
      f'\\boxed{{{letter}. {text}}}', f'\\boxed{{{text}}}',
      f'\\boxed{{\\text{{{text}}}}}', f'\\boxed{{{low}}}',
      f'\\boxed{{{letter}, {other}}}', f'\\boxed{{{letter}}} or \\boxed{{{other}}}',
      f'\\boxed{{{other}}} ... final: \\boxed{{{letter}}}',
      f'\\boxed{{{letter}', f'Answer: {letter}', f'answer: {low}',
      f'**Answer:** {letter}', f'**Answer**: {letter}', f'Answer: **{letter}**',
      f'Answer: ({letter})', f'Answer: {letter} because {text}',
      f'Answer: {text}', f'Answer: {letter}/{other}', f'Answer: {letter} or {other}',
      f'Answer: \\text{{{letter}}}', f'Answer: option {letter}',
      f'Answer: {other}\n...\nAnswer: {letter}', f'The answer is ({letter}).',
      f'final answer is {letter}', f'final answer is {text}',
      f'Answer: {"ABCD"["ABCD".index(letter)] if letter in "ABCD" else letter}'
      .replace('A', 'Ａ', 1) if letter == 'A' else f'Answer: {letter}',
      f'الإجابة: {"أبجد"["ABCD".index(letter)]}' if letter in 'ABCD' else '',
      '', '   ', f'<think>maybe {other}</think>\\boxed{{{letter}}}',
      f'{text}', f'I pick {letter}.',
  ]
  body = rng.choice(forms)
  pre = rng.choice(['', 'Let me think. ', 'Option analysis...\n\n'])
  return pre + body


def main():
  p = argparse.ArgumentParser()
  p.add_argument('--gym', required=True)
  p.add_argument('--n', type=int, default=4000)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--out', default='')
  a = p.parse_args()
  _stub_framework()
  sys.path.insert(0, a.gym)
  from resources_servers.mcqa import app  # pylint: disable=g-import-not-at-top
  rng = random.Random(a.seed)
  by_mode, disagree = {}, []
  for i in range(a.n):
    k = rng.randint(3, 10)
    letters = 'ABCDEFGHIJ'[:k]
    opts = [(c, t) for c, t in zip(letters, rng.sample(TEXTS, k))]
    gold = rng.choice(letters)
    mode, regex = rng.choice(MODES), rng.choice(REGEXES)
    row = dict(responses_create_params=dict(input=[
        dict(role='user', content='Which is it?')]),
               options=[{c: t} for c, t in opts], expected_answer=gold)
    if mode:
      row['grading_mode'] = mode
    if regex is not None:
      row['template_metadata'] = dict(output_regex=regex)
    text = response(rng, opts, gold)
    ours = _mcqa.reward(nemo_gym.parse_row(row, f'case {i}').fields, text)[0]
    # The markdown mode is the server's setting (its config overrides the
    # row's; a row may not name it there): ours reads it from the row.
    md = mode == 'lenient_answer_colon_md'
    server = app.MCQAResourcesServer(config=app.MCQAResourcesServerConfig(
        grading_mode=mode if md else None))
    ref_row = {k: v for k, v in row.items() if not (md and k == 'grading_mode')}
    body = app.MCQAVerifyRequest(**ref_row, response=types.SimpleNamespace(
        output_text=text))
    ref = asyncio.run(server.verify(body)).reward
    key = f"{mode or 'default'}{' +regex' if regex is not None else ''}"
    s = by_mode.setdefault(key, dict(n=0, agree=0, ref_one=0))
    s['n'] += 1
    s['agree'] += ours == ref
    s['ref_one'] += ref == 1.0
    if ours != ref:
      disagree.append(dict(mode=mode, regex=regex, options=opts, gold=gold,
                           response=text, reference=ref, ours=ours))
  print(f"{'mode':<36}{'cases':>6}{'agree':>7}{'ref 1':>7}")
  for key, s in sorted(by_mode.items()):
    print(f"{key:<36}{s['n']:>6}{s['agree']:>7}{s['ref_one']:>7}")
  print(f"{'all':<36}{a.n:>6}{a.n - len(disagree):>7}")
  for d in disagree[:10]:
    print(json.dumps(d, ensure_ascii=False))
  if a.out:
    with open(a.out, 'w', encoding='utf-8') as f:
      json.dump(dict(n=a.n, seed=a.seed, by_mode=by_mode,
                     disagreements=disagree[:100]), f, indent=1,
                ensure_ascii=False)


if __name__ == '__main__':
  main()
