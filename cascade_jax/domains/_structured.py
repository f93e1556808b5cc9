"""Structured-output replies (NeMo-Gym's structured_outputs rows): parsed as their format, coerced where the format holds only strings, validated against the strict schema.

The reference server's behaviour, written here from its documentation and
what it decides (`nemo_gym` reads the rows):
- the reply (after any think block) is parsed whole as the row's
  schema_type: JSON, YAML, TOML, XML (xmltodict, entities never expanded)
  or CSV (a header, then one object a row);
- XML and CSV values are strings: each is first turned into its schema's
  type where it reads as one (`_coerce_xml`, `_coerce_csv`);
- the schema is made strict (every object's properties all required, no
  others) and the reply validated with openapi-schema-validator; 1 when it
  validates, else 0 and why (empty_response, parse_error,
  validation_error).
"""

from __future__ import annotations

import csv
import io
import json

from cascade_jax.domains import _base

SCHEMA_TYPES = ('json', 'yaml', 'toml', 'xml', 'csv')


def _strict(schema):
  """The schema as the reference validates it: every object with
  properties requires all of them and allows no others, through nested
  objects (not into lists: anyOf / allOf branches stay as written, as in
  the reference)."""
  if not isinstance(schema, dict):
    return schema
  out = {k: _strict(v) for k, v in schema.items()}
  if 'properties' in schema:
    out['required'] = list(schema['properties'])
    out['additionalProperties'] = False
  return out


def _parse_structured(schema_type: str, text: str):
  if schema_type == 'json':
    return json.loads(text)
  if schema_type == 'yaml':
    import yaml  # pylint: disable=g-import-not-at-top
    return yaml.safe_load(text)
  if schema_type == 'xml':
    import xmltodict  # pylint: disable=g-import-not-at-top
    return xmltodict.parse(text, disable_entities=True)
  if schema_type == 'csv':
    return list(csv.DictReader(io.StringIO(text)))
  import tomllib  # pylint: disable=g-import-not-at-top
  return tomllib.loads(text)


def _scalar(value: str, kind):
  """A string read as a JSON-schema type where it reads as one (else as it
  is, for the validator to refuse): integer, number, boolean (true / false /
  1 / 0, any case); a list of types tries each in order."""
  if isinstance(kind, list):
    if value in (None, '') and 'null' in kind:
      return None
    for k in kind:
      if k == 'null':
        continue
      out = _scalar(value, k)
      if k == 'string' or not isinstance(out, str):
        return out
    return value
  if not isinstance(value, str) or value == '':
    return value
  try:
    if kind == 'integer':
      return int(value)
    if kind == 'number':
      return float(value)
  except ValueError:
    return value
  if kind == 'boolean':
    return {'true': True, '1': True, 'false': False, '0': False}.get(
        value.lower(), value)
  return value


def _coerce_xml(data, schema):
  """xmltodict's strings in the schema's types, walking both: an object's
  known properties; an array's items, unwrapping the one-tag object
  xmltodict makes of repeated (or single) child elements; an empty element
  (None) is '' where a string is wanted (other types stay None and fail)."""
  if not isinstance(schema, dict) or 'type' not in schema:
    return data
  kind = schema['type']
  if kind == 'object' and isinstance(data, dict):
    props = schema.get('properties', {})
    return {k: _coerce_xml(v, props[k]) if k in props else v
            for k, v in data.items()}
  if kind == 'array':
    if isinstance(data, dict) and len(data) == 1:
      data = next(iter(data.values()))
    data = data if isinstance(data, list) else ([] if data is None else [data])
    return [_coerce_xml(x, schema.get('items', {})) for x in data]
  if data is None and kind == 'string':
    return ''
  return _scalar(data, kind) if isinstance(kind, str) else data


def _coerce_csv(rows: list[dict], schema) -> list[dict]:
  """csv's strings in the types of the schema's items' properties (a
  property without a type, or unknown, stays a string)."""
  props = schema.get('items', schema).get('properties', {})
  return [{k: _scalar(v, props.get(k, {}).get('type', 'string'))
           for k, v in row.items()} for row in rows]


def _tool_payload(fields: dict, response: str):
  """The payload of a tool-call structured response (NeMo-Gym's v4 rows:
  response_mode 'tool_call'), as that server's documentation says it
  verifies one: exactly one function call, named `tool_name`, its
  arguments JSON, unwrapped from `tool_payload_key` when the row wraps
  them. (payload, None) or (None, (error_type, error))."""
  from cascade_jax.domains import _tool_call  # pylint: disable=g-import-not-at-top
  action = _tool_call.action_from_text(response)
  calls = action.get('calls', [])
  if not calls:
    return None, ('missing_tool_call', f"no call of {fields['tool_name']}")
  if len(calls) > 1:
    return None, ('multiple_tool_calls', f'{len(calls)} calls; the answer '
                  'is exactly one')
  (call,) = calls
  if call.get('error'):
    return None, ('tool_arguments_parse_error', call['error'])
  if call['name'] != fields['tool_name']:
    return None, ('wrong_tool_name', f"{call['name']!r}, want "
                  f"{fields['tool_name']!r}")
  key = fields.get('tool_payload_key')
  if key is None:
    return call['arguments'], None
  if key not in call['arguments']:
    return None, ('missing_tool_payload_key', f'no {key!r} in the arguments '
                  f"(keys: {sorted(call['arguments'])[:8]})")
  return call['arguments'][key], None


def structured_reward(fields: dict, response: str) -> tuple[float, dict]:
  """1 when the response (after any think block) parses as the row's
  schema_type and validates against its strict schema; else 0 and why
  (empty_response, parse_error, validation_error). Tool-call rows
  (response_mode 'tool_call'): the one call's payload validates
  (`_tool_payload` names the other failures)."""
  from openapi_schema_validator import validate  # pylint: disable=g-import-not-at-top
  if fields.get('response_mode') == 'tool_call':
    obj, why = _tool_payload(fields, response)
    if why:
      return 0.0, dict(error_type=why[0], error=why[1][:200])
    try:
      schema = _strict(json.loads(fields['schema_str']))
    except Exception as e:  # pylint: disable=broad-except
      return 0.0, dict(error_type='schema_error', error=str(e)[:200])
    try:
      validate(obj, schema)
    except Exception as e:  # pylint: disable=broad-except
      return 0.0, dict(error_type='validation_error',
                       error=f'{type(e).__name__}: {e}'[:200])
    return 1.0, {}
  text = _base.strip_think(response)
  if not text.strip():
    return 0.0, dict(error_type='empty_response')
  try:
    obj = _parse_structured(fields['schema_type'], text)
  except Exception as e:  # pylint: disable=broad-except
    return 0.0, dict(error_type='parse_error',
                     error=f'{type(e).__name__}: {e}'[:200])
  schema = _strict(json.loads(fields['schema_str']))
  try:
    if fields['schema_type'] == 'xml':
      obj = _coerce_xml(obj, schema)
    elif fields['schema_type'] == 'csv':
      obj = _coerce_csv(obj, schema)
    validate(obj, schema)
  except Exception as e:  # pylint: disable=broad-except
    return 0.0, dict(error_type='validation_error',
                     error=f'{type(e).__name__}: {e}'[:200])
  return 1.0, {}
