"""Our conversational tool-use verifier (`_tool_call`) against NeMo-Gym's single-step tool-use server's own comparator, on generated actions.

  python docs/results/checks/verifier_agreement_2026-12-05/tool_call_agreement.py \
      --gym=/path/to/extracted/Gym --n=4000 --seed=0 --out=tool_call.json

`--gym` holds NeMo-Gym's
`resources_servers/single_step_tool_use_with_argument_comparison`. Its
`extract_action` and `ActionComparator` are imported and run as the
server's verify runs them (only `nemo_gym.openai_utils`' response type is
stood in: the response is a plain object with `output` items). The same
row and response go through our reader (`nemo_gym.parse_row`,
`response_text`) and `_tool_call.reward`, under both configurations the
server ships: the single-step one (word overlap 0.1, the call count free)
and the parallel-calls one (the count counted, subsets and supersets
admitted, f1). Actions: a message, one call or a batch; arguments of every
JSON type, nested; responses perturbed (reordered, values nudged or
changed, types swapped, keys dropped or added, words dropped, wrong tool,
broken JSON, calls added or dropped, a message instead).
"""

import argparse
import asyncio  # noqa: F401  (the server's verify is async; its parts are not)
import copy
import json
import random
import sys
import types
from typing import Any

from cascade_jax.domains import _tool_call
from cascade_jax.domains import nemo_gym

WORDS = ('order shipping address refund account billing card the new a of '
         'for please update cancel my status premium plan').split()
TOOLS = ['get_order', 'update_address', 'refund', 'search_flights',
         'lookup_account']
CONFIGS = {
    'single_step': (dict(word_count_similarity_threshold=0.1), {}),
    'parallel_f1': (dict(word_count_similarity_threshold=0.1,
                         parallel_tool_call_rewarding=True, allow_subset=True,
                         allow_superset=True,
                         parallel_tool_call_reward_mode='f1'),
                    dict(count_calls=True, allow_subset=True,
                         allow_superset=True, mode='f1')),
}


def value(rng: random.Random, depth: int = 0):
  kind = rng.choice(['word', 'words', 'int', 'float', 'bool', 'null', 'list',
                     'object'] if depth < 2 else ['word', 'int', 'words'])
  if kind == 'word':
    return rng.choice(WORDS)
  if kind == 'words':
    return ' '.join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))
  if kind == 'int':
    return rng.randint(-5, 500)
  if kind == 'float':
    return round(rng.uniform(-10, 10), rng.choice([1, 3, 6]))
  if kind == 'bool':
    return rng.random() < 0.5
  if kind == 'null':
    return None
  if kind == 'list':
    return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
  return {f'k{i}': value(rng, depth + 1) for i in range(rng.randint(1, 3))}


def perturb_value(rng: random.Random, v):
  if isinstance(v, bool):
    return rng.choice([not v, int(v), str(v).lower()])
  if isinstance(v, int):
    return rng.choice([v + 1, float(v), str(v), v])
  if isinstance(v, float):
    return rng.choice([v + 1e-8, v + 1e-3, int(v), str(v)])
  if isinstance(v, str):
    words = v.split()
    return rng.choice([v.upper(), v + ' ' + rng.choice(WORDS),
                       ' '.join(words[:max(1, len(words) // 2)]),
                       rng.choice(WORDS), '', 7])
  if isinstance(v, list):
    return rng.choice([v[:-1], v + [1], list(reversed(v)),
                       [perturb_value(rng, x) for x in v]])
  if isinstance(v, dict):
    keys = list(v)
    return rng.choice([{k: v[k] for k in keys[:-1]}, dict(v, extra=1),
                       {k: perturb_value(rng, x) for k, x in v.items()}])
  return rng.choice([0, '', False, 'null'])


def perturb_call(rng: random.Random, call: dict) -> dict:
  call = copy.deepcopy(call)
  args = call['arguments']
  what = rng.choice(['same', 'same', 'value', 'drop_key', 'add_key', 'name',
                     'spaces', 'bad_json', 'empty'])
  if what == 'value' and args:
    k = rng.choice(list(args))
    args[k] = perturb_value(rng, args[k])
  elif what == 'drop_key' and args:
    args.pop(rng.choice(list(args)))
  elif what == 'add_key':
    args['note'] = value(rng)
  elif what == 'name':
    call['name'] = rng.choice(TOOLS)
  text = json.dumps(args, indent=2 if what == 'spaces' else None)
  if what == 'bad_json':
    text = text[:-1]
  if what == 'empty':
    text = ''
  return dict(name=call['name'], arguments=text)


def case(rng: random.Random):
  kind = rng.choice(['message', 'call', 'call', 'batch'])
  calls = [dict(name=rng.choice(TOOLS), arguments={
      f'a{i}': value(rng) for i in range(rng.randint(0, 4))})
           for _ in range(1 if kind == 'call' else rng.randint(2, 3))]
  if kind == 'message':
    expected = dict(type='message', content='How can I help?')
  elif kind == 'call':
    expected = dict(type='function_call', name=calls[0]['name'],
                    arguments=json.dumps(calls[0]['arguments']))
  else:
    expected = dict(type='function_call_batch', calls=[
        dict(type='function_call', name=c['name'],
             arguments=json.dumps(c['arguments'])) for c in calls])
  shape = rng.choice(['calls', 'calls', 'calls', 'reordered', 'extra',
                      'dropped', 'message', 'message_and_calls', 'nothing'])
  got = [perturb_call(rng, c) for c in calls]
  if shape == 'reordered':
    rng.shuffle(got)
  elif shape == 'extra':
    got.append(perturb_call(rng, rng.choice(calls)))
  elif shape == 'dropped' and len(got) > 1:
    got.pop(rng.randrange(len(got)))
  output = [] if shape in ('message', 'nothing') else [
      dict(type='function_call', name=g['name'], arguments=g['arguments'],
           call_id=f'c{i}') for i, g in enumerate(got)]
  if shape in ('message', 'message_and_calls'):
    output.insert(0, dict(type='message', role='assistant', content=[
        dict(type='output_text', text='Sure, one moment.')]))
  return expected, output, f'{kind}/{shape}'


def _ns(obj):
  if isinstance(obj, dict):
    return types.SimpleNamespace(**{k: _ns(v) for k, v in obj.items()})
  if isinstance(obj, list):
    return [_ns(v) for v in obj]
  return obj


def main():
  p = argparse.ArgumentParser()
  p.add_argument('--gym', required=True)
  p.add_argument('--n', type=int, default=4000)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--out', default='')
  a = p.parse_args()
  utils = types.ModuleType('nemo_gym.openai_utils')
  utils.NeMoGymResponse = Any
  sys.modules.update({'nemo_gym': types.ModuleType('nemo_gym'),
                      'nemo_gym.openai_utils': utils})
  sys.path.insert(0, a.gym)
  pkg = 'resources_servers.single_step_tool_use_with_argument_comparison.common'
  response_utils = __import__(f'{pkg}.response_utils', fromlist=['x'])
  vu = __import__(f'{pkg}.verification_utils', fromlist=['x'])
  import pydantic  # pylint: disable=g-import-not-at-top
  expected_adapter = pydantic.TypeAdapter(vu.ExpectedAction)
  rng = random.Random(a.seed)
  tools = [dict(type='function', name=t, description=t, parameters=dict(
      type='object', properties={})) for t in TOOLS]
  stats, disagree = {}, []
  for i in range(a.n):
    expected, output, shape = case(rng)
    row = dict(responses_create_params=dict(
        input=[dict(role='user', content='Help me.')], tools=tools),
               expected_action=expected, response=dict(output=output))
    parsed = nemo_gym.parse_row(row, f'case {i}')
    text = nemo_gym.response_text(parsed)
    want = expected_adapter.validate_python(expected)
    actual = response_utils.extract_action(_ns(dict(output=output)))
    for name, (ref_cfg, our_cfg) in CONFIGS.items():
      if actual is None:
        ref = 0.0
      else:
        comp = vu.ActionComparator(config=vu.ToolCallComparatorConfig(**ref_cfg))
        ref = comp.compare_action(want, actual).reward
      fields = dict(parsed.fields, comparator=our_cfg)
      ours = _tool_call.reward(fields, text)[0]
      key = f'{name} {shape}'
      s = stats.setdefault(key, dict(n=0, agree=0, ref_one=0))
      s['n'] += 1
      s['agree'] += abs(ours - ref) < 1e-9
      s['ref_one'] += ref == 1.0
      if abs(ours - ref) >= 1e-9:
        disagree.append(dict(config=name, shape=shape, expected=expected,
                             output=output, reference=ref, ours=ours))
  print(f"{'config / expected / response':<40}{'cases':>6}{'agree':>7}{'ref 1':>7}")
  for key, s in sorted(stats.items()):
    print(f"{key:<40}{s['n']:>6}{s['agree']:>7}{s['ref_one']:>7}")
  total = sum(s['n'] for s in stats.values())
  print(f"{'all':<40}{total:>6}{total - len(disagree):>7}")
  for d in disagree[:8]:
    print(json.dumps(d)[:600])
  if a.out:
    with open(a.out, 'w', encoding='utf-8') as f:
      json.dump(dict(n=a.n, seed=a.seed, stats=stats,
                     disagreements=disagree[:100]), f, indent=1)


if __name__ == '__main__':
  main()
