"""Our structured-output verifier against NeMo-Gym's structured_outputs server's own verify, on generated schemas and responses.

  python docs/results/checks/verifier_agreement_2026-12-05/structured_agreement.py \
      --gym=/path/to/extracted/Gym --n=3000 --seed=0 --out=structured.json

`--gym` holds NeMo-Gym's `resources_servers/structured_outputs/app.py`; the
names it imports from its framework (`nemo_gym`, fastapi) are stood in by
plain pydantic models, and its server's `verify` is called with the
rollout's response (`output` items, as objects). The same rollout row goes
through `nemo_gym.verify_rows`. Schemas: objects of strings, integers,
numbers, booleans, enums, arrays and nested objects (CSV: an array of flat
objects); responses: the schema's instance rendered in its type (JSON,
YAML, TOML, XML, CSV) or broken (a key dropped or added, a value of
another type, a fence around it, text after it, truncated, empty), and v4
tool-call rows (one call, its payload under a key or not; two calls; the
wrong tool; arguments not JSON).
"""

import argparse
import asyncio
import csv
import io
import json
import random
import sys
import types
from typing import Any

import pydantic
import yaml

from cascade_jax.domains import nemo_gym


def _stub_framework():
  base = types.ModuleType('nemo_gym.base_resources_server')

  class Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra='allow',
                                       arbitrary_types_allowed=True)

  class BaseVerifyRequest(Model):
    response: Any = None

  class BaseVerifyResponse(Model):
    reward: float

  class SimpleResourcesServer(Model):
    config: Any = None

  for name, obj in dict(BaseResourcesServerConfig=Model,
                        BaseVerifyRequest=BaseVerifyRequest,
                        BaseVerifyResponse=BaseVerifyResponse,
                        SimpleResourcesServer=SimpleResourcesServer).items():
    setattr(base, name, obj)
  fastapi = types.ModuleType('fastapi')
  fastapi.FastAPI = object
  sys.modules.update({'nemo_gym': types.ModuleType('nemo_gym'),
                      'nemo_gym.base_resources_server': base,
                      'fastapi': fastapi})


def schema_and_value(rng: random.Random, flat: bool, depth: int = 0):
  props, value = {}, {}
  for i in range(rng.randint(1, 4)):
    kind = rng.choice(['string', 'integer', 'number', 'boolean', 'enum'] +
                      ([] if flat or depth else ['array', 'object']))
    key = f'f{i}'
    if kind == 'string':
      props[key], value[key] = {'type': 'string'}, rng.choice(
          ['alpha', 'two words', '', 'x-1'])
    elif kind == 'integer':
      props[key], value[key] = {'type': 'integer'}, rng.randint(-9, 99)
    elif kind == 'number':
      props[key], value[key] = {'type': 'number'}, round(rng.uniform(0, 9), 2)
    elif kind == 'boolean':
      props[key], value[key] = {'type': 'boolean'}, rng.random() < 0.5
    elif kind == 'enum':
      props[key] = {'type': 'string', 'enum': ['red', 'green']}
      value[key] = rng.choice(['red', 'green'])
    elif kind == 'array':
      props[key] = {'type': 'array', 'items': {'type': 'integer'}}
      value[key] = [rng.randint(0, 9) for _ in range(rng.randint(1, 3))]
    else:
      sub, v = schema_and_value(rng, flat, depth + 1)
      props[key], value[key] = sub, v
  return {'type': 'object', 'properties': props}, value


def broken(rng: random.Random, value: dict) -> dict:
  value = json.loads(json.dumps(value))
  what = rng.choice(['same', 'same', 'drop', 'add', 'type'])
  keys = list(value)
  if what == 'drop':
    value.pop(rng.choice(keys))
  elif what == 'add':
    value['extra'] = 1
  elif what == 'type':
    k = rng.choice(keys)
    value[k] = rng.choice(['7', 7, True, None, [1]])
  return value


def to_xml(obj, tag='root') -> str:
  if isinstance(obj, dict):
    return f'<{tag}>' + ''.join(to_xml(v, k) for k, v in obj.items()) + \
        f'</{tag}>'
  if isinstance(obj, list):
    return f'<{tag}>' + ''.join(to_xml(v, 'item') for v in obj) + f'</{tag}>'
  if isinstance(obj, bool):
    return f'<{tag}>{str(obj).lower()}</{tag}>'
  return f'<{tag}>{"" if obj is None else obj}</{tag}>'


def to_toml(obj: dict, prefix: str = '') -> str:
  lines, tables = [], []
  for k, v in obj.items():
    if isinstance(v, dict):
      tables.append((k, v))
    elif v is not None:
      lines.append(f'{k} = {json.dumps(v)}')
  out = '\n'.join(lines)
  for k, v in tables:
    out += f'\n[{prefix}{k}]\n' + to_toml(v, f'{prefix}{k}.')
  return out


def render(rng: random.Random, stype: str, value, rows=None) -> str:
  if stype == 'json':
    text = json.dumps(value, indent=rng.choice([None, 2]))
  elif stype == 'yaml':
    text = yaml.safe_dump(value)
  elif stype == 'toml':
    text = to_toml(value)
  elif stype == 'xml':
    text = to_xml(value)
  else:
    buf = io.StringIO()
    keys = list(dict.fromkeys(k for r in rows for k in r))
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    for r in rows:
      w.writerow(r)
    text = buf.getvalue()
  frame = rng.choice(['plain', 'plain', 'plain', 'fence', 'after', 'cut',
                      'empty', 'think'])
  if frame == 'fence':
    text = f'```{stype}\n{text}\n```'
  elif frame == 'after':
    text += '\nHope this helps!'
  elif frame == 'cut':
    text = text[:max(1, len(text) * 2 // 3)]
  elif frame == 'empty':
    text = ' '
  elif frame == 'think':
    text = '<think>the schema wants an object</think>' + text
  return text, frame


def main():
  p = argparse.ArgumentParser()
  p.add_argument('--gym', required=True)
  p.add_argument('--n', type=int, default=3000)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--out', default='')
  a = p.parse_args()
  _stub_framework()
  sys.path.insert(0, a.gym)
  from resources_servers.structured_outputs import app  # pylint: disable=g-import-not-at-top
  server = app.StructuredOutputsResourcesServer(
      config=app.StructuredOutputsResourcesServerConfig())
  rng = random.Random(a.seed)
  stats, disagree = {}, []
  for i in range(a.n):
    stype = rng.choice(['json', 'yaml', 'toml', 'xml', 'csv', 'tool_call'])
    schema, value = schema_and_value(rng, flat=stype == 'csv')
    row = dict(responses_create_params=dict(input=[
        dict(role='user', content='Fill the schema.')]))
    if stype == 'csv':
      schema = {'type': 'array', 'items': schema}
      rows = [broken(rng, value) for _ in range(2)]
      text, frame = render(rng, 'csv', None, rows)
    elif stype == 'tool_call':
      key = rng.choice([None, 'payload'])
      args = broken(rng, value)
      args = {key: args} if key else args
      tool = dict(type='function', name='submit', description='d',
                  parameters=dict(type='object', properties={}))
      row['responses_create_params']['tools'] = [tool]
      row.update(response_mode='tool_call', tool_name='submit')
      if key:
        row['tool_payload_key'] = key
      shape = rng.choice(['one', 'one', 'one', 'two', 'wrong', 'bad'])
      calls = [dict(type='function_call', name='submit',
                    arguments=json.dumps(args), call_id='c0')]
      if shape == 'two':
        calls.append(dict(calls[0], call_id='c1'))
      elif shape == 'wrong':
        calls[0]['name'] = 'send'
      elif shape == 'bad':
        calls[0]['arguments'] = json.dumps(args)[:-1]
      output, frame = calls, shape
    else:
      if stype == 'xml':    # xmltodict reads the root element as one key
        schema = {'type': 'object', 'properties': {'root': schema}}
      text, frame = render(rng, stype, broken(rng, value))
    if stype != 'tool_call':
      output = [dict(type='message', role='assistant', content=[
          dict(type='output_text', text=text)])]
    row.update(schema_str=json.dumps(schema),
               schema_type='json' if stype == 'tool_call' else stype,
               response=dict(output=output, error=None))
    ours = nemo_gym.verify_rows([nemo_gym.parse_row(row, f'case {i}')])[0]
    ref_row = {k: v for k, v in row.items()
               if k not in ('response', 'responses_create_params')}
    body = app.StructuredOutputsVerifyRequest(
        **ref_row, response=types.SimpleNamespace(
            error=None, output=[_ns(o) for o in output]))
    ref = asyncio.run(server.verify(body))
    s = stats.setdefault(f'{stype} {frame}', dict(n=0, agree=0, ref_one=0))
    s['n'] += 1
    s['agree'] += ours['reward'] == ref.reward
    s['ref_one'] += ref.reward == 1.0
    if ours['reward'] != ref.reward:
      disagree.append(dict(type=stype, frame=frame, schema=schema,
                           output=output,
                           reference=ref.reward, ref_error=ref.error_type,
                           ours=ours['reward'],
                           our_details=ours['verifier_details']))
  print(f"{'schema type, response':<22}{'cases':>6}{'agree':>7}{'ref 1':>7}")
  for k, s in sorted(stats.items()):
    print(f"{k:<22}{s['n']:>6}{s['agree']:>7}{s['ref_one']:>7}")
  print(f"{'all':<22}{a.n:>6}{a.n - len(disagree):>7}")
  for d in disagree[:6]:
    print(json.dumps(d, default=str)[:700])
  if a.out:
    with open(a.out, 'w', encoding='utf-8') as f:
      json.dump(dict(n=a.n, seed=a.seed, stats=stats,
                     disagreements=disagree[:100]), f, indent=1, default=str)


def _ns(obj):
  if isinstance(obj, dict):
    return types.SimpleNamespace(**{k: _ns(v) for k, v in obj.items()})
  if isinstance(obj, list):
    return [_ns(v) for v in obj]
  return obj


if __name__ == '__main__':
  main()
