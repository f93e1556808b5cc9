"""NeMo-Gym's workplace assistant (WorkBench): the 27 tools over the five tables, written from the reference's behaviour.

The tables are pandas DataFrames, as the reference keeps them, so the
verdict's `DataFrame.equals` (row labels and dtypes included) sees what
the reference's does: which tool keeps row labels on an insert (the
calendar's) and which renumbers them (email, tasks, CRM), which fields a
tool lower-cases, and the ids a new row takes (8 digits, except a sent
email's, the largest plus one). Each tool answers as the reference's does,
its messages included; a call with an unknown argument raises, as the
reference's `function(**args)` does. The searches match their text
literally (`_workplace`'s docstring says why).
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

NOW = pd.Timestamp('2023-11-30T23:59:00')
# The tables a verdict compares, in the reference's order, and the columns
# compared with their case.
COMPARED = ('events', 'emails', 'plots', 'tasks', 'crm')
CASE_KEPT = ('status', 'list_name', 'board')
LISTS = ('Backlog', 'In Progress', 'In Review', 'Completed')
BOARDS = ('Back end', 'Front end', 'Design')
STATUSES = ('Qualified', 'Won', 'Lost', 'Lead', 'Proposal')
PRODUCTS = ('Software', 'Hardware', 'Services', 'Consulting', 'Training')
PLOT_VALUES = ('total_visits', 'session_duration_seconds', 'user_engaged',
               'visits_direct', 'visits_referral', 'visits_search_engine',
               'visits_social_media')
CRM_FIELDS = ('customer_name', 'assigned_to_email', 'customer_email',
              'customer_phone', 'last_contact_date', 'product_interest',
              'status', 'notes', 'follow_up_by')
PLOT_TYPES = ('bar', 'line', 'scatter', 'histogram')
_EMAIL = re.compile(r'^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$')


def _contains(series: pd.Series, text: str) -> pd.Series:
  """Case-insensitive literal containment (the reference: a regex)."""
  return series.str.contains(str(text), case=False, regex=False, na=False)


def _page(items: list, key: str, page, page_size) -> dict:
  total = len(items)
  pages = (total + page_size - 1) // page_size
  page = max(1, min(page, pages)) if pages > 0 else 1
  start = (page - 1) * page_size
  return {key: items[start:min(start + page_size, total)],
          'pagination': {f'total_{key}': total, 'page': page,
                         'page_size': page_size, 'total_pages': pages}}


def _next_id(ids: pd.Series, width: int = 8) -> str:
  return str(int(ids.max()) + 1).zfill(width)


def _eight_digits(value) -> bool:
  return isinstance(value, str) and len(value) == 8 and value.isdigit()


def _valid_time(value) -> bool:
  try:
    pd.Timestamp(value)
  except ValueError:
    return False
  return True


def _positive_int(value) -> str | None:
  """None when `value` is a positive whole number of minutes, else why not."""
  try:
    if int(value) <= 0:
      return 'Duration must be a positive number of minutes.'
  except ValueError:
    return 'Invalid duration format. Expected a number of minutes.'
  return None


class Workplace:
  """One episode's (or one verdict's) copy of the tables, and its tools:
  `run(name, arguments)` calls a tool as the reference's server does (an
  unknown tool or argument raises); `state()` is what a verdict compares."""

  def __init__(self, tables: dict[str, pd.DataFrame]):
    self.t = {k: v.copy() for k, v in tables.items()}
    self.t['plots'] = pd.DataFrame(columns=['file_path'])

  def run(self, name: str, arguments: dict) -> Any:
    if name not in TOOLS:
      raise KeyError(name)
    return getattr(self, name)(**arguments)

  def state(self) -> list[pd.DataFrame]:
    out = []
    for key in COMPARED:
      df = self.t[key].copy()
      for col in df.columns:
        if col not in CASE_KEPT:
          df[col] = df[col].str.lower()
      out.append(df)
    return out

  # --------------------------------------------------- company directory

  def company_directory_find_email_address(self, name=''):
    if name == '':
      return 'Name not provided.'
    d = self.t['directory']['email_address']
    return d[_contains(d, name.lower())].values.tolist()

  # --------------------------------------------------------------- email

  def email_get_email_information_by_id(self, email_id=None, field=None):
    return self._field('emails', 'email_id', email_id, field, 'Email')

  def _field(self, key, id_col, row_id, field, what):
    if not row_id:
      return f'{what} ID not provided.'
    if not field:
      return 'Field not provided.'
    df = self.t[key]
    rows = df[df[id_col] == row_id].to_dict(orient='records')
    if not rows:
      return f'{what} not found.'
    if field in rows[0]:
      return {field: rows[0][field]}
    return (f"Field '{field}' not found. Available fields: "
            f"{', '.join(rows[0])}" if key == 'emails' else
            'Field not found.')

  def email_search_emails(self, query='', date_min=None, date_max=None,
                          page=1, page_size=5):
    e = self.t['emails']
    words = query.lower().split()
    text = (e['subject'].fillna('') + ' ' + e['body'].fillna('') + ' ' +
            e['sender/recipient'].fillna('')).str.lower()
    hit = e[[all(w in s for w in words) for s in text]].copy()
    hit['_t'] = pd.to_datetime(hit['sent_datetime'])
    rows = hit.sort_values('_t', ascending=False).drop(columns=['_t'])
    rows = rows.to_dict(orient='records')
    day = lambda r: pd.Timestamp(r['sent_datetime']).date()  # noqa: E731
    if date_min:
      rows = [r for r in rows if day(r) >= pd.Timestamp(date_min).date()]
    if date_max:
      rows = [r for r in rows if day(r) <= pd.Timestamp(date_max).date()]
    return _page(rows, 'emails', page, page_size) if rows else \
        'No emails found.'

  def email_send_email(self, recipient=None, subject=None, body=None):
    if not recipient or not subject or not body:
      return 'Recipient, subject, or body not provided.'
    if '@' not in recipient or '.' not in recipient:
      return 'Invalid recipient email address.'
    e = self.t['emails']
    new = {'email_id': str(int(e['email_id'].max()) + 1) if len(e) else '1',
           'inbox/outbox': 'outbox', 'sender/recipient': recipient.lower(),
           'subject': subject, 'sent_datetime': str(NOW), 'body': body}
    self.t['emails'] = pd.concat([e, pd.DataFrame([new])], ignore_index=True)
    return 'Email sent successfully.'

  def email_delete_email(self, email_id=None):
    return self._delete('emails', 'email_id', email_id, 'Email')

  def _delete(self, key, id_col, row_id, what):
    if not row_id:
      return f'{what} ID not provided.'
    df = self.t[key]
    if row_id not in df[id_col].values:
      return f'{what} not found.'
    self.t[key] = df[df[id_col] != row_id]
    return f'{what} deleted successfully.'

  def _email(self, email_id):
    e = self.t['emails']
    return e[e['email_id'] == email_id].to_dict(orient='records')[0]

  def email_forward_email(self, email_id=None, recipient=None):
    if not email_id or not recipient:
      return 'Email ID or recipient not provided.'
    if '@' not in recipient or '.' not in recipient:
      return 'Invalid recipient email address.'
    if email_id not in self.t['emails']['email_id'].values:
      return 'Email not found.'
    e = self._email(email_id)
    out = self.email_send_email(recipient.lower(), f"FW: {e['subject']}",
                                e['body'])
    return out if 'Invalid' in out else 'Email forwarded successfully.'

  def email_reply_email(self, email_id=None, body=None):
    if not email_id or not body:
      return 'Email ID or body not provided.'
    if email_id not in self.t['emails']['email_id'].values:
      return 'Email not found.'
    e = self._email(email_id)
    out = self.email_send_email(e['sender/recipient'], f"RE: {e['subject']}",
                                body)
    return out if 'Invalid' in out else 'Email replied successfully.'

  # ------------------------------------------------------------ calendar

  def calendar_get_event_information_by_id(self, event_id=None, field=None):
    if not event_id:
      return 'Event ID not provided.'
    if not field:
      return 'Field not provided.'
    if not _eight_digits(event_id):
      return 'Invalid event ID format. Expected 8-digit ID.'
    if field not in self.t['events'].columns:
      return ('Invalid field. Available fields are: '
              + ', '.join(self.t['events'].columns))
    return self._field('events', 'event_id', event_id, field, 'Event')

  def calendar_search_events(self, query='', time_min=None, time_max=None,
                             page=1, page_size=5):
    bounds = []
    for name, value in (('time_min', time_min), ('time_max', time_max)):
      if value and not _valid_time(value):
        return f'Invalid {name} format. Expected YYYY-MM-DD HH:MM:SS.'
      bounds.append(pd.Timestamp(value) if value else None)
    ev = self.t['events']
    rows = ev[_contains(ev['event_name'], query) |
              _contains(ev['participant_email'], query)
              ].to_dict(orient='records')
    start = lambda r: pd.Timestamp(r['event_start'])  # noqa: E731
    if bounds[0] is not None:
      rows = [r for r in rows if start(r) >= bounds[0]]
    if bounds[1] is not None:
      rows = [r for r in rows if start(r) <= bounds[1]]
    if not rows:
      return 'No events found.'
    rows.sort(key=start, reverse=True)
    return _page(rows, 'events', page, page_size)

  def calendar_create_event(self, event_name=None, participant_email=None,
                            event_start=None, duration=None):
    for value, what in ((event_name, 'Event name'),
                        (participant_email, 'Participant email'),
                        (event_start, 'Event start'),
                        (duration, 'Event duration')):
      if not value:
        return f'{what} not provided.'
    if not _valid_time(event_start):
      return 'Invalid event_start format. Expected YYYY-MM-DD HH:MM:SS.'
    why = _positive_int(duration)
    if why:
      return why
    ev = self.t['events']
    event_id = _next_id(ev['event_id'])
    new = pd.DataFrame({'event_id': [event_id], 'event_name': [event_name],
                        'participant_email': [participant_email.lower()],
                        'event_start': [event_start],
                        'duration': [duration]})
    self.t['events'] = pd.concat([ev, new])     # keeps labels (reference)
    return event_id

  def calendar_delete_event(self, event_id=None):
    if event_id and not _eight_digits(event_id):
      return 'Invalid event ID format. Expected 8-digit ID.'
    return self._delete('events', 'event_id', event_id, 'Event')

  def calendar_update_event(self, event_id=None, field=None, new_value=None):
    if not event_id or not field or not new_value:
      return 'Event ID, field, or new value not provided.'
    if not _eight_digits(event_id):
      return 'Invalid event ID format. Expected 8-digit ID.'
    fields = ('event_name', 'participant_email', 'event_start', 'duration')
    if field not in fields:
      return f"Invalid field. Available fields are: {', '.join(fields)}"
    if field == 'event_start' and not _valid_time(new_value):
      return 'Invalid event_start format. Expected YYYY-MM-DD HH:MM:SS.'
    if field == 'duration' and (why := _positive_int(new_value)):
      return why
    ev = self.t['events']
    if event_id not in ev['event_id'].values:
      return 'Event not found.'
    if field == 'participant_email':
      new_value = new_value.lower()
    ev.loc[ev['event_id'] == event_id, field] = new_value
    return 'Event updated successfully.'

  # ----------------------------------------------------------- analytics

  def analytics_get_visitor_information_by_id(self, visitor_id=None):
    if not visitor_id:
      return 'Visitor ID not provided.'
    a = self.t['analytics']
    rows = a[a['visitor_id'] == visitor_id].to_dict(orient='records')
    return rows or 'Visitor not found.'

  def analytics_create_plot(self, time_min=None, time_max=None,
                            value_to_plot=None, plot_type=None):
    if not time_min:
      return 'Start date not provided.'
    if not time_max:
      return 'End date not provided.'
    if value_to_plot not in PLOT_VALUES:
      return ('Value to plot must be one of '
              + ', '.join(f"'{v}'" for v in PLOT_VALUES))
    if plot_type not in PLOT_TYPES:
      return ("Plot type must be one of 'bar', 'line', 'scatter', or "
              "'histogram'")
    path = f'plots/{time_min}_{time_max}_{value_to_plot}_{plot_type}.png'
    plots = self.t['plots']
    plots.loc[len(plots)] = [path]
    return path

  def _visits(self, time_min, time_max) -> pd.DataFrame:
    a = self.t['analytics']
    if time_min:
      a = a[a['date_of_visit'] >= time_min]
    if time_max:
      a = a[a['date_of_visit'] <= time_max]
    return a.copy()

  def analytics_total_visits_count(self, time_min=None, time_max=None):
    return self._visits(time_min, time_max).groupby(
        'date_of_visit').size().to_dict()

  def analytics_engaged_users_count(self, time_min=None, time_max=None):
    a = self._visits(time_min, time_max)
    a['user_engaged'] = a['user_engaged'].astype(bool).astype(int)
    return a.groupby('date_of_visit')['user_engaged'].sum().to_dict()

  def analytics_traffic_source_count(self, time_min=None, time_max=None,
                                     traffic_source=None):
    a = self._visits(time_min, time_max)
    if not traffic_source:
      return a.groupby('date_of_visit').size().to_dict()
    a['n'] = (a['traffic_source'] == traffic_source).astype(int)
    return a.groupby('date_of_visit')['n'].sum().to_dict()

  def analytics_get_average_session_duration(self, time_min=None,
                                             time_max=None):
    a = self._visits(time_min, time_max)
    a['s'] = a['session_duration_seconds'].astype(float)
    return a.groupby('date_of_visit')['s'].mean().to_dict()

  # -------------------------------------------------- project management

  def project_management_get_task_information_by_id(self, task_id=None,
                                                    field=None):
    return self._field('tasks', 'task_id', task_id, field, 'Task')

  def project_management_search_tasks(self, task_name=None,
                                      assigned_to_email=None, list_name=None,
                                      due_date=None, board=None):
    if not any([task_name, assigned_to_email, list_name, due_date, board]):
      return 'No search parameters provided.'
    if assigned_to_email and not _EMAIL.match(assigned_to_email):
      return 'Invalid email format for assigned_to_email.'
    t = self.t['tasks']
    if assigned_to_email:
      t = t[t['assigned_to_email'].str.lower() == assigned_to_email.lower()]
    for col, value in (('task_name', task_name), ('list_name', list_name),
                       ('due_date', due_date), ('board', board)):
      if value:
        t = t[_contains(t[col], value)]
    return t.to_dict(orient='records')

  def _team(self) -> set[str]:
    return set(self.t['tasks']['assigned_to_email'].str.lower())

  def project_management_create_task(self, task_name=None,
                                     assigned_to_email=None, list_name=None,
                                     due_date=None, board=None):
    if not all([task_name, assigned_to_email, list_name, due_date, board]):
      return 'Missing task details.'
    assigned_to_email = assigned_to_email.lower()
    why = (self._choice('assigned_to_email', assigned_to_email) or
           self._choice('list_name', list_name) or
           self._choice('board', board))
    if why:
      return why
    t = self.t['tasks']
    task_id = _next_id(t['task_id'])
    new = pd.DataFrame({'task_id': [task_id], 'task_name': [task_name],
                        'assigned_to_email': [assigned_to_email],
                        'list_name': [list_name], 'due_date': [due_date],
                        'board': [board]})
    self.t['tasks'] = pd.concat([t, new], ignore_index=True)
    return task_id

  def _choice(self, field, value) -> str | None:
    if field == 'assigned_to_email' and value not in self._team():
      return ('Assignee email not valid. Please choose from the list of '
              'team members.')
    if field == 'list_name' and value not in LISTS:
      return ("List not valid. Please choose from: 'Backlog', 'In Progress',"
              " 'In Review', 'Completed'.")
    if field == 'board' and value not in BOARDS:
      return ("Board not valid. Please choose from: 'Back end', 'Front end',"
              " 'Design'.")
    return None

  def project_management_delete_task(self, task_id=None):
    return self._delete('tasks', 'task_id', task_id, 'Task')

  def project_management_update_task(self, task_id=None, field=None,
                                     new_value=None):
    if not task_id or not field or not new_value:
      return 'Task ID, field, or new value not provided.'
    if field == 'assigned_to_email':
      new_value = new_value.lower()
    why = self._choice(field, new_value)
    if why:
      return why
    return self._update('tasks', 'task_id', task_id, field, new_value,
                        'Task', 'Field not valid.')

  def _update(self, key, id_col, row_id, field, value, what, bad_field):
    df = self.t[key]
    if row_id not in df[id_col].values:
      return f'{what} not found.'
    if field not in df.columns:
      return bad_field
    df.loc[df[id_col] == row_id, field] = value
    return f'{what} updated successfully.'

  # ----------------------------------------------------------------- CRM

  def customer_relationship_manager_search_customers(
      self, customer_name=None, customer_email=None, product_interest=None,
      status=None, assigned_to_email=None, last_contact_date_min=None,
      last_contact_date_max=None, follow_up_by_min=None,
      follow_up_by_max=None, page=1, page_size=5):
    text = dict(customer_name=customer_name, customer_email=customer_email,
                product_interest=product_interest, status=status,
                assigned_to_email=assigned_to_email)
    ranges = ((last_contact_date_min, 'last_contact_date', 1),
              (last_contact_date_max, 'last_contact_date', -1),
              (follow_up_by_min, 'follow_up_by', 1),
              (follow_up_by_max, 'follow_up_by', -1))
    if not any(text.values()) and not any(r[0] for r in ranges):
      return ('No search parameters provided. Please provide at least one '
              'parameter.')
    c = self.t['crm']
    for col, value in text.items():
      if value:
        c = c[_contains(c[col], value)]
    for value, col, sign in ranges:
      if value:
        c = c[c[col] >= value] if sign > 0 else c[c[col] <= value]
    rows = c.to_dict(orient='records')
    return _page(rows, 'customers', page, page_size) if rows else \
        'No customers found.'

  def customer_relationship_manager_update_customer(self, customer_id=None,
                                                    field=None,
                                                    new_value=None):
    if not customer_id or not field or not new_value:
      return 'Customer ID, field, or new value not provided.'
    if field == 'status' and new_value not in STATUSES:
      return ('Status not valid. Please choose from: '
              + ', '.join(f"'{s}'" for s in STATUSES))
    if field == 'product_interest' and new_value not in PRODUCTS:
      return ('Product interest not valid. Please choose from: '
              + ', '.join(f"'{p}'" for p in PRODUCTS))
    if field in ('customer_email', 'assigned_to_email'):
      new_value = new_value.lower()
    return self._update('crm', 'customer_id', customer_id, field, new_value,
                        'Customer', 'Field not valid. Please choose from: '
                        + ', '.join(f"'{c}'" for c in CRM_FIELDS))

  def customer_relationship_manager_add_customer(
      self, customer_name=None, assigned_to_email=None, status=None,
      customer_email=None, customer_phone=None, last_contact_date=None,
      product_interest=None, notes='', follow_up_by=None):
    if not all([customer_name, assigned_to_email, status]):
      return ('Please provide all required fields: customer_name, '
              'assigned_to_email, status.')
    c = self.t['crm']
    new_id = _next_id(c['customer_id'])
    new = pd.DataFrame({
        'customer_id': [new_id], 'customer_name': [customer_name],
        'customer_email': [customer_email.lower() if customer_email
                           else customer_email],
        'customer_phone': [customer_phone],
        'last_contact_date': [last_contact_date],
        'product_interest': [product_interest], 'status': [status],
        'assigned_to_email': [assigned_to_email.lower()], 'notes': [notes],
        'follow_up_by': [follow_up_by]})
    self.t['crm'] = pd.concat([c, new], ignore_index=True)
    return new_id

  def customer_relationship_manager_delete_customer(self, customer_id=None):
    return self._delete('crm', 'customer_id', customer_id, 'Customer')


TOOLS = tuple(sorted(n for n in vars(Workplace)
                     if not n.startswith('_') and n not in ('run', 'state')))

