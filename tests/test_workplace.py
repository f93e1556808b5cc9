"""NeMo-Gym's workplace assistant: its tools, the state verdict, its rows (fixture tables written here, the reference's schema)."""

import json
import os
import subprocess
import sys

import pytest

from cascade_jax.domains import _workplace
from cascade_jax.domains import nemo_gym

DATA = os.path.join(os.path.dirname(__file__), 'data', 'nemo_gym')
DB = os.path.join(DATA, 'workplace_db')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def call(name, **kw):
  return dict(name=name, arguments=json.dumps(kw))


@pytest.fixture
def w():
  return _workplace.Workplace(_workplace.load(DB))


def test_the_workplace_has_the_references_27_tools():
  assert len(_workplace.TOOLS) == 27
  assert {t.split('_')[0] for t in _workplace.TOOLS} == {
      'analytics', 'calendar', 'company', 'customer', 'email', 'project'}


def test_reading_tools_answer_from_the_tables(w):
  assert w.run('company_directory_find_email_address',
               dict(name='KEN')) == ['ken.ito@acme.com']
  found = w.run('email_search_emails', dict(query='login page ken'))
  assert [e['email_id'] for e in found['emails']] == ['00000004', '00000002']
  assert found['pagination']['total_emails'] == 2
  assert w.run('email_search_emails', dict(query='login',
                                           date_min='2023-11-15')
               )['pagination']['total_emails'] == 1
  ev = w.run('calendar_search_events', dict(query='sync up'))
  assert [e['event_id'] for e in ev['events']] == ['00000004', '00000001']
  assert w.run('calendar_get_event_information_by_id',
               dict(event_id='2', field='duration')).startswith('Invalid')
  assert w.run('project_management_search_tasks',
               dict(assigned_to_email='KEN.ITO@acme.com', board='back')
               ) == [w.t['tasks'].iloc[3].to_dict()]
  assert w.run('analytics_engaged_users_count',
               dict(time_min='2023-11-28')) == {
                   '2023-11-28': 1, '2023-11-29': 1, '2023-11-30': 1}
  assert w.run('analytics_traffic_source_count',
               dict(traffic_source='direct')) == {
                   '2023-11-27': 1, '2023-11-28': 0, '2023-11-29': 1,
                   '2023-11-30': 0}
  assert w.run('customer_relationship_manager_search_customers',
               dict(status='lead'))['customers'][0]['customer_id'] == '00000001'
  # Searches read their text literally (a model's text reaches no regex).
  assert w.run('calendar_search_events', dict(query='(a+)+$')) == \
      'No events found.'


def test_writing_tools_validate_as_the_reference_does(w):
  before = [df.copy() for df in w.state()]
  assert w.run('project_management_create_task', dict(
      task_name='x', assigned_to_email='nobody@acme.com', list_name='Backlog',
      due_date='2023-12-01', board='Design')).startswith('Assignee')
  assert w.run('calendar_create_event', dict(
      event_name='x', participant_email='a@b.c', event_start='soon',
      duration='30')).startswith('Invalid event_start')
  assert w.run('customer_relationship_manager_update_customer', dict(
      customer_id='00000001', field='status', new_value='won')
  ).startswith('Status not valid')
  assert w.run('email_send_email', dict(recipient='nobody', subject='s',
                                        body='b')).startswith('Invalid')
  assert _workplace.same_state(w, _workplace.Workplace(
      _workplace.load(DB))) == []
  assert all(a.equals(b) for a, b in zip(before, w.state()))
  # New rows take the next id; sent mail is sent at the reference's "now".
  assert w.run('project_management_create_task', dict(
      task_name='x', assigned_to_email='Ken.Ito@acme.com',
      list_name='Backlog', due_date='2023-12-01', board='Design')) == '00000005'
  w.run('email_reply_email', dict(email_id='00000002', body='ok'))
  sent = w.t['emails'].iloc[-1]
  assert (sent['email_id'], sent['sender/recipient'], sent['subject'],
          sent['sent_datetime']) == ('7', 'ken.ito@acme.com',
                                     'RE: Task Update on Build login page',
                                     '2023-11-30 23:59:00')
  with pytest.raises(TypeError):     # an unknown argument: the call fails
    w.run('email_delete_email', dict(email_id='00000001', force=True))
  with pytest.raises(KeyError):
    w.run('email_purge', {})


def test_the_verdict_compares_the_tables_the_calls_leave():
  gt = [call('email_reply_email', email_id='00000004', body='Thanks!')]
  assert _workplace.reward(gt, gt, DB)[0] == 1.0
  r, d = _workplace.reward([], gt, DB)
  assert (r, d['tables_differ']) == (0.0, ['emails'])
  # Strings compare without case, except status, list_name and board.
  assert _workplace.reward(
      [call('email_reply_email', email_id='00000004', body='THANKS!')],
      gt, DB)[0] == 1.0
  # Reads change nothing; a failed call is skipped and counted.
  r, d = _workplace.reward(
      [call('email_search_emails', query='ken'),
       dict(name='email_reply_email', arguments='{"email_id": "0000'),
       call('email_purge'), gt[0]], gt, DB)
  assert (r, d['calls'], d['failed_calls']) == (1.0, 4, 2)
  # Another email answered, or the reply sent twice: not the same state.
  # (Ken's earlier mail has the same sender and subject: replying to it
  # leaves the same tables, for the reference too.)
  assert _workplace.reward(
      [call('email_reply_email', email_id='00000001', body='Thanks!')],
      gt, DB)[0] == 0.0
  assert _workplace.reward(
      [call('email_reply_email', email_id='00000002', body='Thanks!')],
      gt, DB)[0] == 1.0
  assert _workplace.reward(gt * 2, gt, DB)[0] == 0.0


def test_the_verdict_keeps_the_references_row_labels():
  """pandas' equals compares row labels: deleting a mail before sending one
  (the send relabels every row) leaves other labels than the other order,
  so the reference gives 0 though the rows are the same; so do we."""
  send = call('email_send_email', recipient='ada.obi@acme.com', subject='s',
              body='b')
  delete = call('email_delete_email', email_id='00000002')
  r, d = _workplace.reward([send, delete], [delete, send], DB)
  assert (r, d['tables_differ']) == (0.0, ['emails'])


def test_the_tables_are_found_or_the_error_says_how_to_give_them(
    tmp_path, monkeypatch):
  monkeypatch.delenv(_workplace.ENV_VAR, raising=False)
  with pytest.raises(_workplace.DatabaseError, match='--workplace_db'):
    _workplace.find_db('')
  monkeypatch.setenv(_workplace.ENV_VAR, DB)
  assert _workplace.find_db('') == os.path.abspath(DB)
  (tmp_path / 'emails.csv').write_text('email_id\n1\n')
  with pytest.raises(_workplace.DatabaseError, match='calendar_events.csv'):
    _workplace.load(str(tmp_path))
  # NeMo-Gym's own layout (csv_data/processed, csv_data/raw) reads as is.
  gym = tmp_path / 'gym' / 'csv_data'
  (gym / 'processed').mkdir(parents=True)
  (gym / 'raw').mkdir()
  for f in os.listdir(DB):
    sub = 'raw' if f == _workplace.DIRECTORY_FILE else 'processed'
    (gym / sub / f).write_text(open(os.path.join(DB, f)).read())
  t = _workplace.load(str(tmp_path / 'gym'))
  assert len(t['emails']) == 6 and len(t['directory']) == 4


def test_workplace_rows_are_read_with_their_tools_shown(tmp_path):
  rows = nemo_gym.read_rows(os.path.join(DATA, 'workplace.jsonl'))
  assert [r.kind for r in rows] == ['workplace'] * 4
  assert 'email_reply_email' in rows[0].messages[0]['content']
  assert rows[2].fields['ground_truth'][1]['name'] == \
      'project_management_update_task'
  bad = json.loads(open(os.path.join(DATA, 'workplace.jsonl')).readline())
  bad['ground_truth'] = [{'name': 'email_reply_email', 'arguments': {}}]
  path = tmp_path / 'bad.jsonl'
  path.write_text(json.dumps(bad) + '\n')
  with pytest.raises(nemo_gym.RowError, match=r'bad.jsonl:1: field '
                     r'ground_truth\[0\]'):
    nemo_gym.read_rows(str(path))


def test_experiments_verify_scores_workplace_rollouts(tmp_path):
  # The command line, in its own process (its absl flags are its own).
  src = os.path.join(DATA, 'workplace_rollouts.jsonl')
  env = {k: v for k, v in os.environ.items() if k != _workplace.ENV_VAR}

  def run(out, *extra):
    return subprocess.run(
        [sys.executable, '-m', 'experiments.verify', f'--rows={src}',
         f'--out={out}', *extra], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300)

  res = run(tmp_path / 'out.jsonl', f'--workplace_db={DB}')
  assert res.returncode == 0, res.stderr[-2000:]
  out = [json.loads(line) for line in open(tmp_path / 'out.jsonl')]
  assert [r['reward'] for r in out] == [1.0, 0.0, 1.0, 0.0]
  assert [r['id'] for r in out] == [0, 1, 2, 3]            # order kept
  assert out[1]['verifier_details']['tables_differ'] == ['events']
  assert out[2]['verifier_details']['failed_calls'] == 1
  assert 'workplace by category: same_state 2' in res.stdout, res.stdout
  # Without the tables: refused before any work, saying how to give them.
  res = run(tmp_path / 'none.jsonl')
  assert res.returncode != 0 and '--workplace_db' in res.stderr
  assert not (tmp_path / 'none.jsonl').exists()


# --------------------------------------------------------------- RL domain

def test_workplace_rows_are_their_own_episode_domain(monkeypatch):
  from cascade_jax import domains  # pylint: disable=g-import-not-at-top
  from cascade_jax.domains import nemo_gym_rl  # pylint: disable=g-import-not-at-top
  rows = os.path.join(DATA, 'workplace.jsonl')
  recs = nemo_gym_rl.generate_workplace(split='train', n=9, seed=0,
                                        files=rows, eval_fraction=0.0,
                                        workplace_db=DB)
  assert len(recs) == 4 and {r['domain'] for r in recs} == {
      'nemo_gym_workplace'}
  assert all(r['workplace_db'] == os.path.abspath(DB) for r in recs)
  with pytest.raises(ValueError, match='its 4 rows are for domain '
                     'nemo_gym_workplace'):
    nemo_gym_rl.generate(split='train', n=9, seed=0, files=rows,
                         eval_fraction=0.0)
  monkeypatch.delenv(_workplace.ENV_VAR, raising=False)
  with pytest.raises(_workplace.DatabaseError, match='workplace_db'):
    nemo_gym_rl.generate_workplace(split='train', n=9, seed=0, files=rows,
                                   eval_fraction=0.0)
  with pytest.raises(ValueError, match='unknown data options'):
    nemo_gym_rl.generate_python(split='train', n=9, seed=0, files=rows,
                                workplace_db=DB)
  dom = domains.get('nemo_gym_workplace')
  assert dom.env is nemo_gym_rl.make_workplace_env and dom.from_files


def test_a_workplace_episode_acts_on_its_own_tables_and_is_judged_by_them():
  from cascade_jax import envs  # pylint: disable=g-import-not-at-top
  from cascade_jax.domains import nemo_gym_rl  # pylint: disable=g-import-not-at-top
  recs = nemo_gym_rl.generate_workplace(
      split='train', n=9, seed=0, files=os.path.join(DATA, 'workplace.jsonl'),
      eval_fraction=0.0, workplace_db=DB)
  rec = next(r for r in recs if r['ground_truth'][0]['name'] ==
             'project_management_update_task')
  good = [envs.format_call('project_management_search_tasks',
                           task_name='login'),
          envs.format_call('project_management_update_task',
                           task_id='00000001', field='list_name',
                           new_value='In Progress') +
          envs.format_call('project_management_update_task',
                           task_id='00000001', field='assigned_to_email',
                           new_value='ada.obi@acme.com'),
          'Done.']
  env = nemo_gym_rl.make_workplace_env(rec)
  convo, last = envs.run_scripted(env, rec, good)
  assert last.done and last.reward == 1.0 and last.info['passed']
  found = json.loads(convo[3]['content'])
  assert found[0]['task_id'] == '00000001'
  assert [m['content'] for m in convo[5:7]] == [
      '"Task updated successfully."'] * 2
  # Another episode starts from the tables as read: half the job earns 0.
  env = nemo_gym_rl.make_workplace_env(rec)
  convo, last = envs.run_scripted(env, rec, [good[1].split('</tool_call>')[0]
                                             + '</tool_call>', 'Done.'])
  assert last.done and last.reward == 0.0
  assert last.info['tables_differ'] == ['tasks']
  # A bad call is an observation the model reads; the tool's own errors too.
  env = nemo_gym_rl.make_workplace_env(rec)
  convo, last = envs.run_scripted(env, rec, [
      '<tool_call>{"name": </tool_call>',
      envs.format_call('project_management_update_task', task_id='1',
                       colour='red'),
      envs.format_call('customer_relationship_manager_search_customers',
                       customer_name='Riley')])
  assert convo[-5]['content'].startswith('error: tool call is not valid JSON')
  assert convo[-3]['content'].startswith(
      "Error executing tool 'project_management_update_task'")
  # pandas' missing values reach the model as JSON nulls.
  assert json.loads(convo[-1]['content'])['customers'][0][
      'customer_phone'] is None
  assert not last.done


def test_an_rl_stage_gives_the_row_files_to_every_nemo_gym_domain():
  from cascade_jax import rl  # pylint: disable=g-import-not-at-top
  data = dict(domain='nemo_gym_workplace', files='a.jsonl', eval_files='',
              n_train=8, per_domain={'nemo_gym_workplace': dict(
                  workplace_db=DB)})
  assert rl.domain_options(data, 'nemo_gym_workplace') == dict(
      files='a.jsonl', eval_files='', workplace_db=DB)
  assert 'files' not in rl.domain_options(data, 'math')


@pytest.mark.slow  # ~10 s, not the default (the main job reads no NeMo-Gym rows): CI runs it
def test_workplace_episodes_run_through_the_sampler():
  from cascade_jax import rollout  # pylint: disable=g-import-not-at-top
  from cascade_jax.domains import nemo_gym_rl  # pylint: disable=g-import-not-at-top
  import _nemo_gym_helpers  # pylint: disable=g-import-not-at-top
  recs = nemo_gym_rl.generate_workplace(
      split='train', n=4, seed=0, files=os.path.join(DATA, 'workplace.jsonl'),
      eval_fraction=0.0, workplace_db=DB)
  eps, made = _nemo_gym_helpers.episodes_through_sampler(
      recs, text_repeats=5, max_tokens=2048)
  assert len(made) == 4 and all(
      isinstance(e, nemo_gym_rl.WorkplaceEnv) for e in made)
  # A random model calls nothing: every table stays as read, and only a
  # task whose ground truth changes nothing could earn 1 (none here).
  assert len(eps) == 4 and all(e.end in rollout.ENDS for e in eps)
  assert all(e.reward == 0.0 for e in eps)
