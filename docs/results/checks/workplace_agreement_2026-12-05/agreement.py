"""Our workplace-assistant verdict against NeMo-Gym's own, on its own tables.

  python docs/results/checks/workplace_agreement_2026-12-05/agreement.py \
      --gym=/path/to/extracted/Gym --n=600 --seed=0 --out=agreement.json

`--gym` is a NeMo-Gym checkout (its resources_servers/workplace_assistant,
csv_data included). The reference's `utils.is_correct` is imported from it
and run beside `_workplace.reward` on the same call lists: ground-truth
tasks drawn from the tables (every writing tool, one or two calls), each
against a perturbed prediction (the same calls, another case, another or a
missing id, an int for a string, an unknown argument, broken JSON, reads
added, a call dropped, repeated or the calls reordered, a space added, an
unknown tool). Prints the agreement per perturbation and writes them.
"""

import argparse
import contextlib
import io
import json
import os
import random
import sys

from cascade_jax.domains import _workplace

READS = [('email_search_emails', dict(query='update')),
         ('calendar_search_events', dict(query='sync')),
         ('project_management_search_tasks', dict(board='Design')),
         ('company_directory_find_email_address', dict(name='a'))]


def tasks(t: dict, rng: random.Random) -> list[tuple[str, dict]]:
  """One ground-truth task: one or two writing calls on real rows."""
  pick = lambda df, col: rng.choice(df[col].dropna().tolist())  # noqa: E731
  team = sorted(set(t['tasks']['assigned_to_email'].str.lower()))
  people = t['directory']['email_address'].tolist()
  day = f'2023-12-{rng.randint(1, 28):02d}'
  makers = [
      lambda: ('email_reply_email', dict(email_id=pick(t['emails'], 'email_id'),
                                         body='Thanks, noted.')),
      lambda: ('email_forward_email', dict(
          email_id=pick(t['emails'], 'email_id'), recipient=rng.choice(people))),
      lambda: ('email_send_email', dict(recipient=rng.choice(people),
                                        subject='Status', body='All on track.')),
      lambda: ('email_delete_email', dict(email_id=pick(t['emails'], 'email_id'))),
      lambda: ('calendar_create_event', dict(
          event_name='review', participant_email=rng.choice(people),
          event_start=f'{day} 10:00:00', duration='30')),
      lambda: ('calendar_update_event', dict(
          event_id=pick(t['events'], 'event_id'),
          field=rng.choice(['event_name', 'event_start', 'duration']),
          new_value=rng.choice(['planning', f'{day} 15:00:00', '45']))),
      lambda: ('calendar_delete_event', dict(event_id=pick(t['events'], 'event_id'))),
      lambda: ('project_management_create_task', dict(
          task_name='Write tests', assigned_to_email=rng.choice(team),
          list_name=rng.choice(_workplace.LISTS), due_date=day,
          board=rng.choice(_workplace.BOARDS))),
      lambda: ('project_management_update_task', dict(
          task_id=pick(t['tasks'], 'task_id'),
          **rng.choice([dict(field='list_name', new_value=rng.choice(_workplace.LISTS)),
                        dict(field='board', new_value=rng.choice(_workplace.BOARDS)),
                        dict(field='assigned_to_email', new_value=rng.choice(team))]))),
      lambda: ('project_management_delete_task', dict(task_id=pick(t['tasks'], 'task_id'))),
      lambda: ('customer_relationship_manager_update_customer', dict(
          customer_id=pick(t['crm'], 'customer_id'),
          **rng.choice([dict(field='status', new_value=rng.choice(_workplace.STATUSES)),
                        dict(field='product_interest', new_value=rng.choice(_workplace.PRODUCTS)),
                        dict(field='assigned_to_email', new_value=rng.choice(team))]))),
      lambda: ('customer_relationship_manager_add_customer', dict(
          customer_name='Alex Doe', assigned_to_email=rng.choice(team),
          status=rng.choice(_workplace.STATUSES), customer_email='alex@doe')),
      lambda: ('customer_relationship_manager_delete_customer', dict(
          customer_id=pick(t['crm'], 'customer_id'))),
      lambda: ('analytics_create_plot', dict(
          time_min='2023-11-01', time_max='2023-11-30',
          value_to_plot=rng.choice(_workplace.PLOT_VALUES),
          plot_type=rng.choice(_workplace.PLOT_TYPES))),
  ]
  return [rng.choice(makers)() for _ in range(rng.choice([1, 1, 2]))]


PERTURBATIONS = ('same', 'case', 'other_id', 'missing_id', 'int_value',
                 'extra_arg', 'bad_json', 'reads_added', 'dropped',
                 'duplicated', 'reordered', 'space', 'unknown_tool')


def perturb(calls, kind: str, t: dict, rng: random.Random):
  calls = [(n, dict(a)) for n, a in calls]
  name, args = calls[-1]
  strings = [k for k, v in args.items() if isinstance(v, str)]
  ids = [k for k in args if k.endswith('_id')]
  if kind == 'case' and strings:
    k = rng.choice(strings)
    args[k] = rng.choice([str.upper, str.title, str.lower])(args[k])
  elif kind == 'other_id' and ids:
    k = ids[0]
    table = dict(email_id='emails', event_id='events', task_id='tasks',
                 customer_id='crm')[k]
    args[k] = rng.choice(t[table][k].tolist())
  elif kind == 'missing_id' and ids:
    args[ids[0]] = '99999999'
  elif kind == 'int_value':
    digits = [k for k in strings if args[k].isdigit()]
    if digits:
      args[digits[0]] = int(args[digits[0]])
  elif kind == 'extra_arg':
    args['note'] = 'urgent'
  elif kind == 'reads_added':
    calls.insert(0, READS[rng.randrange(len(READS))])
  elif kind == 'dropped':
    calls = calls[:-1]
  elif kind == 'duplicated':
    calls.append((name, dict(args)))
  elif kind == 'reordered':
    calls = calls[::-1]
  elif kind == 'space' and strings:
    args[rng.choice(strings)] += ' '
  elif kind == 'unknown_tool':
    calls[-1] = (name + '_v2', args)
  out = [dict(name=n, arguments=json.dumps(a)) for n, a in calls]
  if kind == 'bad_json':
    out[-1]['arguments'] = out[-1]['arguments'][:-1]
  return out


def main():
  p = argparse.ArgumentParser()
  p.add_argument('--gym', required=True)
  p.add_argument('--n', type=int, default=600)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--out', default='')
  a = p.parse_args()
  sys.path.insert(0, a.gym)
  from resources_servers.workplace_assistant.utils import is_correct  # pylint: disable=g-import-not-at-top
  db = os.path.join(a.gym, 'resources_servers/workplace_assistant/csv_data')
  t = _workplace.load(_workplace.find_db(db))
  rng = random.Random(a.seed)
  rows = {k: dict(n=0, agree=0, ref_one=0, ours_one=0) for k in PERTURBATIONS}
  disagree = []
  for i in range(a.n):
    gt_calls = tasks(t, rng)
    kind = PERTURBATIONS[i % len(PERTURBATIONS)]
    pred = perturb(gt_calls, kind, t, rng)
    gt = [dict(name=n, arguments=json.dumps(x)) for n, x in gt_calls]
    with contextlib.redirect_stdout(io.StringIO()):
      ref = float(is_correct(pred, gt, None))
    ours, details = _workplace.reward(pred, gt, db)
    r = rows[kind]
    r['n'] += 1
    r['agree'] += ref == ours
    r['ref_one'] += ref == 1.0
    r['ours_one'] += ours == 1.0
    if ref != ours:
      disagree.append(dict(kind=kind, ground_truth=gt, predicted=pred,
                           reference=ref, ours=ours, details=details))
  import pandas  # pylint: disable=g-import-not-at-top
  print(f'pandas {pandas.__version__}; {a.n} cases, seed {a.seed}')
  print(f"{'perturbation':<14}{'cases':>6}{'agree':>7}{'ref 1':>7}{'ours 1':>8}")
  for k, r in rows.items():
    print(f"{k:<14}{r['n']:>6}{r['agree']:>7}{r['ref_one']:>7}{r['ours_one']:>8}")
  total = sum(r['agree'] for r in rows.values())
  print(f"{'all':<14}{a.n:>6}{total:>7}")
  if a.out:
    with open(a.out, 'w', encoding='utf-8') as f:
      json.dump(dict(pandas=pandas.__version__, n=a.n, seed=a.seed,
                     rows=rows, disagreements=disagree[:50]), f, indent=1)


if __name__ == '__main__':
  main()
