"""NeMo-Gym's workplace assistant (WorkBench): five tables, 27 tools, and the verdict by the state they leave.

A workplace-assistant row (`environment_name: workplace_assistant`) asks for
a business task (send an email, move a meeting, reassign a task) and carries
`ground_truth`: the calls that do it, `[{name, arguments}]` with arguments a
JSON object's text. The reference verifier (NeMo-Gym's workplace_assistant
server) runs the response's calls on fresh copies of the tables, the
ground truth's on others, and gives 1 when the tables they leave are equal:
the emails, calendar, project tasks, CRM and the analytics plots made,
strings compared without case except `status`, `list_name` and `board`. A
call that fails (unknown tool, unknown argument, bad JSON) is skipped, as
the reference skips it. Reading tools change nothing, so only the tables
the writing tools leave decide.

The tables are the reference's data, which the rows do not carry: a
directory with `emails.csv`, `calendar_events.csv`, `analytics_data.csv`,
`project_tasks.csv`, `customer_relationship_manager_data.csv` and
(optional: the company directory, read by one tool) `email_addresses.csv`;
NeMo-Gym's `resources_servers/workplace_assistant/csv_data` (with its
`processed/` and `raw/`) is read as it is. Set it with
`experiments.verify --workplace_db=DIR`, the RL domain's
`data.per_domain.nemo_gym_workplace.workplace_db`, or
`CASCADE_JAX_WORKPLACE_DB`.

The tools (`_workplace_tools`) are written here from the reference's
behaviour, on pandas as the reference keeps its tables (so
`DataFrame.equals`'s rules, row labels and dtypes included, are the
reference's: a verdict can depend on pandas' version as the reference's
does). One deliberate difference: the searches
match their text literally, where the reference's pandas `str.contains`
reads it as a regular expression. A model's text never reaches a regex
engine here (a pattern can take exponential time); searches change no
table, so verdicts are unaffected, only what a search shows for a query
with regex characters.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence

import pandas as pd

from cascade_jax.domains._workplace_tools import BOARDS  # noqa: F401
from cascade_jax.domains._workplace_tools import CASE_KEPT  # noqa: F401
from cascade_jax.domains._workplace_tools import COMPARED
from cascade_jax.domains._workplace_tools import CRM_FIELDS  # noqa: F401
from cascade_jax.domains._workplace_tools import LISTS  # noqa: F401
from cascade_jax.domains._workplace_tools import NOW  # noqa: F401
from cascade_jax.domains._workplace_tools import PLOT_TYPES  # noqa: F401
from cascade_jax.domains._workplace_tools import PLOT_VALUES  # noqa: F401
from cascade_jax.domains._workplace_tools import PRODUCTS  # noqa: F401
from cascade_jax.domains._workplace_tools import STATUSES  # noqa: F401
from cascade_jax.domains._workplace_tools import TOOLS  # noqa: F401
from cascade_jax.domains._workplace_tools import Workplace

ENV_VAR = 'CASCADE_JAX_WORKPLACE_DB'
FILES = dict(emails='emails.csv', events='calendar_events.csv',
             analytics='analytics_data.csv', tasks='project_tasks.csv',
             crm='customer_relationship_manager_data.csv')
DIRECTORY_FILE = 'email_addresses.csv'


class DatabaseError(ValueError):
  """The workplace tables cannot be found or read."""


def find_db(path: str = '') -> str:
  """The directory holding the tables: `path`, else $CASCADE_JAX_WORKPLACE_DB;
  a NeMo-Gym csv_data directory (processed/, raw/) is accepted."""
  path = os.path.expanduser(path or os.environ.get(ENV_VAR, ''))
  if not path:
    raise DatabaseError(
        'workplace-assistant rows need the tables they act on, which the '
        'rows do not carry: pass --workplace_db=DIR (data.workplace_db for '
        f'RL) or set {ENV_VAR}, a directory with {sorted(FILES.values())} '
        "(NeMo-Gym's resources_servers/workplace_assistant/csv_data)")
  return os.path.abspath(path)


def _locate(root: str, name: str, sub: str) -> str | None:
  for p in (os.path.join(root, name), os.path.join(root, sub, name),
            os.path.join(root, 'csv_data', sub, name)):
    if os.path.isfile(p):
      return p
  return None


@functools.lru_cache(maxsize=4)
def load(path: str) -> dict[str, pd.DataFrame]:
  """The tables as read (shared: `Workplace` copies them)."""
  if not os.path.isdir(path):
    raise DatabaseError(f'workplace tables: no directory {path}')
  found = {k: _locate(path, f, 'processed') for k, f in FILES.items()}
  missing = [FILES[k] for k, p in found.items() if p is None]
  if missing:
    raise DatabaseError(f'workplace tables: {path} lacks {missing}')
  tables = {}
  for key, p in found.items():
    try:
      tables[key] = pd.read_csv(p, dtype=str)
    except (ValueError, OSError) as e:
      raise DatabaseError(f'workplace tables: {p} does not read as CSV: '
                          f'{e}') from None
  tables['analytics']['user_engaged'] = (
      tables['analytics']['user_engaged'] == 'True')
  directory = _locate(path, DIRECTORY_FILE, 'raw')
  tables['directory'] = (pd.read_csv(directory, header=None,
                                     names=['email_address'])
                         if directory else
                         pd.DataFrame({'email_address': pd.Series(dtype=str)}))
  return tables



def execute(tables: dict[str, pd.DataFrame],
            calls: Sequence[dict]) -> tuple[Workplace, int]:
  """A fresh workplace after `calls` ({name, arguments: a JSON object's
  text}), and how many failed (skipped, as the reference skips them)."""
  w, failed = Workplace(tables), 0
  for call in calls:
    try:
      w.run(call['name'], json.loads(call['arguments']))
    except Exception:  # pylint: disable=broad-except
      failed += 1      # the reference prints it and goes on
  return w, failed


def same_state(a: Workplace, b: Workplace) -> list[str]:
  """The compared tables that differ between two workplaces (empty: the
  same state, the reference's verdict 1)."""
  return [k for k, x, y in zip(COMPARED, a.state(), b.state(), strict=True)
          if not x.equals(y)]


def judge(got: Workplace, ground_truth: Sequence[dict],
          tables: dict[str, pd.DataFrame], **details) -> tuple[float, dict]:
  """The reference's verdict on a workplace the predicted calls left: 1
  when the ground truth's calls leave `tables` the same; the details name
  the tables that differ (`category` too) beside `details`."""
  want, _ = execute(tables, ground_truth)
  differ = same_state(got, want)
  return float(not differ), dict(
      details, tables_differ=differ,
      category='same_state' if not differ else 'differs:' + '+'.join(differ))


def reward(predicted: Sequence[dict], ground_truth: Sequence[dict],
           db: str = '') -> tuple[float, dict]:
  """The reference's verdict: the predicted calls run on fresh tables,
  then judged (`judge`)."""
  tables = load(find_db(db))
  got, failed = execute(tables, predicted)
  return judge(got, ground_truth, tables, calls=len(predicted),
               failed_calls=failed)


# ------------------------------------------------------------------ rows


def is_row(obj: dict) -> bool:
  """A workplace-assistant row: named so, or carrying `ground_truth`."""
  return (obj.get('environment_name') == 'workplace_assistant'
          or 'ground_truth' in obj)


def calls_field(value, field: str) -> list[dict]:
  """`value` checked as a list of calls {name, arguments} (a JSON list's
  text is read); raises ValueError naming the field."""
  if isinstance(value, str):
    try:
      value = json.loads(value)
    except ValueError:
      raise ValueError(f'field {field} is a string that is not a JSON list '
                       'of calls') from None
  if not isinstance(value, list):
    raise ValueError(f'field {field} must be a list of calls '
                     f'{{name, arguments}}, got {type(value).__name__}')
  for j, call in enumerate(value):
    if not (isinstance(call, dict) and isinstance(call.get('name'), str)
            and isinstance(call.get('arguments'), str)):
      raise ValueError(f'field {field}[{j}] must be {{"name": str, '
                       '"arguments": str (a JSON object)}}')
  return [dict(name=c['name'], arguments=c['arguments']) for c in value]


def response_calls(output: list) -> list[dict]:
  """A rollout's calls: its `function_call` items, in order, as written."""
  return [dict(name=item.get('name'), arguments=item.get('arguments'))
          for item in output
          if isinstance(item, dict) and item.get('type') == 'function_call']


def verdict(calls: Sequence[dict], fields: dict,
            db: str = '') -> tuple[float, dict]:
  """A row's reward and details (its `category`: the tables that differ),
  its tables those of the row's `workplace_db`, else `db`."""
  return reward(calls, fields['ground_truth'],
                fields.get('workplace_db') or db)
