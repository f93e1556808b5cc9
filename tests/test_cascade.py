"""The cascade: stages as data (checked up front), the quick cascade end to end, skip-and-resume, the report."""

import json
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cascade_jax import cascade
from cascade_jax import domains
from cascade_jax import report
from cascade_jax import reward_model
from cascade_jax import utils
from configs import cascade as cascade_config


def _names(stages):
  return [(s.name, s.init_from) for s in stages]


def test_default_order_follows_the_paper():
  stages = cascade.plan(cascade_config.get_config())
  assert [s.name for s in stages if not s.branch] == [
      'sft', 'if_rl', 'multi_domain_rl', 'mopd', 'rlhf', 'long_context_rl',
      'code_rl', 'swe_rl', 'swe_agent_rl']
  by = {s.name: s for s in stages}
  assert by['rlhf_branch'].init_from == 'sft' and by['rlhf_branch'].branch
  assert by['if_rl'].init_from == 'sft'        # not the branch before it
  assert by['mopd'].teachers == {'math': 'sft', 'instruction_following': 'if_rl',
                                 'multi_domain': 'multi_domain_rl',
                                 'preference': 'rlhf_branch'}
  kinds = {'generative_judge': 'judge', 'bradley_terry': 'rm'}
  assert by['rlhf'].reward_model == kinds[cascade_config.RLHF_REWARD]
  assert 'reward' not in by['rlhf'].config      # the cascade's, resolved
  # `:judge`: the paper's generative judge, a branch off SFT, is both RLHF
  # stages' reward; a stage's `reward` switches it back.
  c = cascade_config.get_config('judge')
  by = {s.name: s for s in cascade.plan(c)}
  assert by['judge'].branch and by['judge'].init_from == 'sft'
  assert by['rlhf'].reward_model == by['rlhf_branch'].reward_model == 'judge'
  for reward, stage in kinds.items():
    c.stages.rlhf.reward = reward
    assert {s.name: s for s in cascade.plan(c)}['rlhf'].reward_model == stage
  assert by['rlhf'].config.rl.kl_coef == cascade_config.RLHF_KL > 0


def test_reordering_and_dropping_stages_is_a_config_change():
  c = cascade_config.get_config()
  c.order = 'sft,rm,judge,rlhf,if_rl,code_rl,swe_rl'  # Nemotron-Cascade 1
  assert _names(cascade.plan(c)) == [
      ('sft', ''), ('rm', 'sft'), ('judge', 'sft'), ('rlhf', 'sft'),
      ('if_rl', 'rlhf'), ('code_rl', 'if_rl'), ('swe_rl', 'code_rl')]


@pytest.mark.parametrize('change, match', [
    (dict(order='sft,if_rl,nope'), "'nope'"),
    (dict(order='if_rl,sft'), 'nothing to start from'),
    (dict(order='sft,if_rl,if_rl'), 'twice'),
    (dict(order='sft,if_rl,multi_domain_rl,mopd'), "'rlhf_branch'"),  # teacher
    (dict(order='sft,rlhf'),
     f"reward '{cascade_config.RLHF_REWARD}' needs an earlier"),
])
def test_bad_cascades_are_refused_before_running(change, match):
  c = cascade_config.get_config()
  for k, v in change.items():
    c[k] = v
  with pytest.raises((ValueError, KeyError), match=match):
    cascade.plan(c)


@pytest.mark.parametrize('reward, rm, match', [
    ('rouge', '', "reward 'rouge' is not one of"),
    ('bradley_terry', 'judge', "reward_model 'judge' is not an earlier "
                               'reward_model stage'),
    ('', 'if_rl', "'if_rl' is not an earlier reward_model or judge stage"),
])
def test_a_reward_must_come_from_a_stage_of_its_kind(reward, rm, match):
  c = cascade_config.get_config()
  c.stages.rlhf.reward, c.stages.rlhf.reward_model = reward, rm
  with pytest.raises(ValueError, match=match):
    cascade.plan(c)


def test_per_domain_options_must_name_a_domain_of_the_stage():
  c = cascade_config.get_config()
  assert set(c.stages.multi_domain_rl.data.per_domain) == {'multi_domain',
                                                           'tool_use'}
  c.stages.multi_domain_rl.data.domain = 'multi_domain'
  with pytest.raises(ValueError, match=r"multi_domain_rl.*\['tool_use'\]"):
    cascade.plan(c)


def test_multi_turn_domains_are_evaluated_on_their_first_prompts():
  c = cascade_config.get_config()
  c.eval_n, c.eval_n_episodes = 12, 5
  sets = cascade.eval_sets(c)
  full = cascade.eval_sets(cascade_config.get_config())
  for d, recs in sets.items():
    multi_turn = domains.get(d).env is not None
    assert len(recs) == (5 if multi_turn else 12), d
    if multi_turn:    # the first prompts of the full set: the same problems
      assert recs == full[d][:5]
  assert {'swe_agent', 'tool_use'} <= set(sets)


def test_bad_kind_is_named():
  c = cascade_config.get_config()
  c.stages.if_rl.kind = 'ppo'
  with pytest.raises(ValueError, match="if_rl.*'ppo'"):
    cascade.plan(c)


def _laptop(c):
  """The cascade as the main job runs it on a laptop: one device, no mesh
  (the suite's 8 fake devices are for the sharding tests; the cascade on
  meshes and on two processes: tests/test_scale.py)."""
  c.mesh = type(c.mesh)({})
  return c


# The main job's stage kinds by default (its RLHF reward is the RM); with
# the generative judge's stage in the cascade too in CI (the judge stage
# alone, trained and serving as a reward: tests/test_judge.py).
@pytest.mark.parametrize('judge', [False, pytest.param(
    True, marks=pytest.mark.slow)], ids=['main_job_kinds', 'judge'])
def test_quick_cascade_end_to_end_skips_finished_stages(tmp_path, capsys,
                                                        judge):
  c = _laptop(cascade_config.get_config('quick'))
  names = ['sft', 'rm'] + ['judge'] * judge + ['rlhf_branch', 'if_rl', 'mopd']
  c.order = ','.join(names)
  c.eval_worker = 'process'   # the main job's ('auto' there); quick: inline
  c.stages.mopd.teachers = dict(math='sft', instruction_following='if_rl',
                                multi_domain='', preference='rlhf_branch')
  c.stages.mopd.data.domain = 'math,instruction_following,preference'
  records = cascade.run(c, str(tmp_path))
  assert [r['name'] for r in records] == names
  # The run's CPU kernels, recorded for its resumes (tests/test_kernels.py).
  kept = json.load(open(tmp_path / 'cpu_kernels.json'))['kernels']
  for r in records:
    assert os.path.exists(tmp_path / r['name'] / 'stage.json')
    assert json.load(open(tmp_path / r['name'] / 'cpu_kernels.json'))[
        'kernels'] == kept, r['name']
    # Each stage's directory holds its own runner config: the cascade's
    # seed, and the stage it started from.
    cfg = json.load(open(tmp_path / r['name'] / 'config.json'))
    assert cfg['seed'] == c.seed, r['name']
    if r['init_from']:
      assert cfg['init_from'] == r['init_from'], (r['name'], cfg['init_from'])
  rm_acc = records[1]['accuracy']
  assert rm_acc == json.load(open(tmp_path / 'rm' / 'rm_scores.json'))[
      'accuracy']
  # The RM as a reward function (the RLHF stages' reward) is the trained RM:
  # it ranks the held-out pairs exactly as the RM stage's evaluation did,
  # and a response's score does not depend on what else is in the batch
  # (no token dropped): chosen and rejected scored in separate calls.
  rm_cfg = json.load(open(tmp_path / 'rm' / 'config.json'))
  held = domains.generate('preference', split='eval', n=rm_cfg['eval_n'],
                          seed=rm_cfg['seed'],
                          levels=tuple(rm_cfg['data']['levels']))
  rm_fn = reward_model.load(str(tmp_path / 'rm'))
  chosen = rm_fn(held, [r['chosen'] for r in held])
  rejected = rm_fn(held, [r['rejected'] for r in held])
  assert float(np.mean(chosen > rejected)) == pytest.approx(rm_acc, abs=1e-9)
  together = rm_fn(held + held, [r['chosen'] for r in held] +
                   [r['rejected'] for r in held])
  np.testing.assert_allclose(together, np.concatenate([chosen, rejected]),
                             atol=1e-5)
  assert rm_fn(held[:1], [held[0]['chosen']])[0] == pytest.approx(
      chosen[0], abs=1e-5)
  # The judge (the paper's RLHF reward) as a reward function is the
  # trained judge: its verdicts on the held-out pairs are the judge stage's.
  if judge:
    verdicts = records[2]['judge']
    assert verdicts == json.load(open(tmp_path / 'judge' /
                                      'judge_scores.json'))
    j_fn = reward_model.load(str(tmp_path / 'judge'))
    assert isinstance(j_fn, reward_model.JudgeReward)
    again = reward_model.judge_agreement(j_fn.judge, held)
    assert again == {k: verdicts[k] for k in again}
  assert json.load(open(tmp_path / 'rlhf_branch' / 'config.json'))[
      'reward_model'] == {'generative_judge': 'judge', 'bradley_terry': 'rm'}[
          cascade_config.RLHF_REWARD]
  # Every RL stage was on-policy at every step: the learner's log-probs are
  # the sampler's, and no scoring forward dropped a token.
  for name in ('rlhf_branch', 'if_rl', 'mopd'):
    rows = [json.loads(l) for l in open(tmp_path / name / 'rl_metrics.jsonl')]
    steps = [r for r in rows if 'sampler_mismatch_max' in r]
    assert len(steps) == 2
    for r in steps:
      assert r['sampler_mismatch_max'] <= 1e-5, (name, r)
      for k in ('dropped_learner', 'dropped_reference', 'dropped_teacher',
                'dropped_reward_model'):
        assert r.get(k, 0.0) == 0.0, (name, k, r)
    assert ('dropped_reference' in steps[0]) == (name == 'rlhf_branch')
    assert ('dropped_teacher' in steps[0]) == (name == 'mopd')
  assert set(records[0]['scores']) == {
      'code', 'instruction_following', 'long_context', 'math',
      'multi_domain', 'preference', 'swe', 'swe_agent', 'tool_use'}
  # Again: everything is done, nothing runs.
  capsys.readouterr()
  again = cascade.run(c, str(tmp_path))
  assert again == records
  out = capsys.readouterr().out
  assert out.count('skipped') == len(names) and 'warning' not in out
  # The stages were scored in the evaluation process beside the training
  # (test_a_killed_stage_resumes checks that this process scores SFT's
  # checkpoint to the same per-prompt results).
  assert [r['scored_in'] for r in records] == [
      'inline' if n in ('rm', 'judge') else 'process' for n in names]
  c.stages.if_rl.optim.lr = 1e-5     # a finished stage's config changed
  cascade.run(c, str(tmp_path))
  assert 'warning: if_rl was run with another config' in capsys.readouterr().out
  out = report.cascade_report(str(tmp_path), records)
  for f in ('matrix.png', 'deltas.png', 'curves.png', 'report.json'):
    assert os.path.getsize(tmp_path / 'report' / f) > 0
  data = json.load(open(out['json']))
  assert data['matrix_stages'] == ['sft', 'rlhf_branch', 'if_rl', 'mopd']
  d = np.asarray(data['deltas'], float)
  pr = np.asarray(data['pass_rate'], float)
  np.testing.assert_allclose(d[2], pr[2] - pr[0])   # if_rl against sft
  assert 'if_rl' in out['table'] and 'mismatch max' in out['table']
  # Each stage's compiles, counted for training and evaluation apart: SFT
  # compiled its train step; its evaluation compiled the sampler.
  for r in records:
    assert set(r['compiles']) == {'train', 'eval'}, r['name']
  assert records[0]['compiles']['train']['compiles'] >= 1
  assert records[0]['compiles']['eval']['compile_s'] > 0
  assert data['compile_s'] == pytest.approx(sum(
      x['compile_s'] + x['trace_s'] for r in records
      for x in r['compiles'].values()))
  assert 'compile s' in out['table']
  assert set(data['on_policy']) == {'rlhf_branch', 'if_rl', 'mopd'}
  for name, check in data['on_policy'].items():
    rows = [json.loads(l) for l in open(tmp_path / name / 'rl_metrics.jsonl')]
    assert check['sampler_mismatch_max'] == max(
        r['sampler_mismatch_max'] for r in rows if 'sampler_mismatch_max' in r)
    line = next(l for l in out['table'].splitlines()
                if l.split()[0] == name)
    assert line.split()[-1] == f"{check['sampler_mismatch_max']:.1e}"


@pytest.mark.slow
def test_quick_cascade_on_the_hybrid_model(tmp_path):
  # --config.model=hybrid: SFT trains the Mamba-2 + attention + MoE model;
  # every later stage starts from it, samples it with Mamba states in the
  # cache and stays on-policy.
  c = _laptop(cascade_config.get_config('quick'))
  c.model = 'hybrid'
  c.order = 'sft,if_rl,multi_domain_rl,mopd'
  c.stages.mopd.teachers = dict(math='sft', instruction_following='if_rl',
                                multi_domain='multi_domain_rl', preference='')
  c.stages.mopd.data.domain = 'math,instruction_following,multi_domain'
  records = cascade.run(c, str(tmp_path))
  spec = json.load(open(tmp_path / 'sft' / 'model.json'))
  assert spec['preset'] == 'small_hybrid' and 'M' in spec['overrides']['pattern']
  for name in ('if_rl', 'multi_domain_rl', 'mopd'):
    rows = [json.loads(l) for l in open(tmp_path / name / 'rl_metrics.jsonl')]
    for r in rows:
      if 'sampler_mismatch_max' in r:
        assert r['sampler_mismatch_max'] <= 1e-5, (name, r)
        assert r.get('dropped_learner', 0.0) == 0.0
  assert len(records) == 4
  c.model = 'mamba3'
  with pytest.raises(ValueError, match="model 'mamba3' is not one of"):
    cascade.plan(c)


def test_the_hybrid_takes_the_stage_settings_measured_for_it():
  # Rule 33: the hybrid's SFT at preference weight 1.5; the attention
  # model's stays at the stage's own 0.5; both sizes of the config.
  for arg in (None, 'quick'):
    c = cascade_config.get_config(arg)
    weight = lambda: next(s for s in cascade.plan(c) if s.name == 'sft'
                          ).config.data.sources.preference.weight
    own = c.stages.sft.data.sources.preference.weight
    assert weight() == own
    c.model = 'hybrid'
    assert weight() == 1.5 != own
    # The model's entry is where the setting changes.
    c.models.hybrid.stages.sft.data.sources.preference.weight = 0.25
    assert weight() == 0.25
  c.models.hybrid.stages.sft.data.sources.preferance = dict(weight=2.0)
  with pytest.raises(KeyError, match=r'config.models.hybrid.stages.sft.data'
                     r'.sources.preferance is not a setting'):
    cascade.plan(c)
  del c.models.hybrid.stages.sft.data.sources['preferance']
  c.models.hybrid.stages.sfft = dict(steps=1)
  with pytest.raises(KeyError, match=r"stages names \['sfft'\], not stages"):
    cascade.plan(c)


def test_an_evaluation_process_failure_names_the_stage(tmp_path):
  from cascade_jax.cascade import _scoring  # pylint: disable=g-import-not-at-top
  # 'auto': the main job's evaluation (256 prompts x 2) in a process of its
  # own on this CPU, the quick cascade's (8 x 2) inline.
  assert _scoring.worker_kind(cascade_config.get_config()) == 'process'
  assert _scoring.worker_kind(cascade_config.get_config('quick')) == 'inline'
  c = _laptop(cascade_config.get_config('quick'))
  c.eval_worker = 'sometimes'
  with pytest.raises(ValueError, match="eval_worker: 'sometimes'"):
    _scoring.make(c, {})
  c.eval_worker, c.eval_cpus = 'inline', '0'
  with pytest.raises(ValueError, match='eval_cpus pins'):
    _scoring.make(c, {})
  c.eval_worker, c.eval_cpus = 'process', '0,x'
  with pytest.raises(ValueError, match='not a comma-separated list'):
    _scoring.make(c, {})
  c.eval_cpus = ''
  scoring = _scoring.make(c, cascade.eval_sets(c))
  assert isinstance(scoring, _scoring.ProcessScoring)
  try:
    scoring.submit('ghost', str(tmp_path / 'no_such_stage'))
    with pytest.raises(RuntimeError, match='failed while scoring ghost'):
      scoring.ready(wait=True)
  finally:
    scoring.close()


@pytest.mark.slow  # ~90 s: CI runs it; the quick cascade test resumes past finished stages by default
def test_a_killed_stage_resumes(tmp_path, monkeypatch):
  c = _laptop(cascade_config.get_config('quick'))
  c.order = 'sft,if_rl'
  c.eval_worker = 'process'
  cascade.run(c, str(tmp_path / 'first'))
  # Each stage records its model; stage paths are relative to the cascade.
  assert json.load(open(tmp_path / 'first' / 'if_rl' / 'model.json')) == (
      json.load(open(tmp_path / 'first' / 'sft' / 'model.json')))
  assert json.load(open(tmp_path / 'first' / 'if_rl' / 'config.json'))[
      'init_from'] == 'sft'
  # Pretend the RL stage was killed after its checkpoint at step 1, and the
  # cascade's directory was moved before it was started again.
  os.remove(tmp_path / 'first' / 'if_rl' / 'stage.json')
  os.rename(tmp_path / 'first', tmp_path / 'moved')
  c.stages.if_rl.steps = 3
  records = cascade.run(c, str(tmp_path / 'moved'))
  # Killed after SFT's training but before its scores came back from the
  # evaluation process: SFT's finished run is resumed and scored again,
  # to the same scores; the later stage is skipped.
  sft_scores = records[0]['scores']
  os.remove(tmp_path / 'moved' / 'sft' / 'stage.json')
  again = cascade.run(c, str(tmp_path / 'moved'))
  assert again[0]['scores'] == sft_scores and again[1] == records[1]
  tmp_path = tmp_path / 'moved'
  rows = [json.loads(l) for l in open(tmp_path / 'if_rl' / 'rl_metrics.jsonl')]
  steps = [r['step'] for r in rows if 'reward_mean' in r]
  assert steps == [1, 2, 3]          # 1-2 before the "kill", 3 after resume
  assert records[-1]['name'] == 'if_rl'
  # The stage again, from the run's SFT checkpoint, with another lr, from
  # another current directory (relative paths).
  c.stages.if_rl.optim.lr = 1e-3
  monkeypatch.chdir(tmp_path / 'if_rl')
  rows = cascade.rerun_stage(c, '..', 'if_rl', str(tmp_path / 'again'))
  assert rows[0]['domain'] == 'instruction_following' and rows[0]['own']
  assert len(rows) == len(cascade.eval_sets(c))     # every SFT domain
  assert not any(r['own'] for r in rows[1:])
  after = cascade.score_stage(
      str(tmp_path / 'again'), cascade.eval_sets(c),
      temperature=c.eval_temperature, samples=c.eval_samples, seed=c.seed)
  for r in rows:   # the start's scores are the ones the cascade recorded
    # (scored in its evaluation process; rerun_stage scores in this one)
    before = records[0]['scores'][r['domain']]
    assert r['before'] == before['pass_rate']
    assert r['after'] == after[r['domain']]['pass_rate']
    assert abs(r['change'] - (r['after'] - r['before'])) < 1e-9
    # The paired standard error by hand: the sample standard deviation of
    # the per-prompt changes over sqrt(prompts).
    diffs = [after[r['domain']]['prompt_pass'][k] - v
             for k, v in before['prompt_pass'].items()]
    want = np.std(diffs, ddof=1) / np.sqrt(len(diffs))
    assert len(diffs) == (c.eval_n_episodes if domains.get(r['domain']).env
                          else c.eval_n)
    np.testing.assert_allclose(r['se'], want, rtol=1e-9, atol=1e-12)
  # Instruction following's constraint kinds, each check's share met.
  checks = rows[0]['by_check']
  assert checks and checks == {
      k: dict(before=records[0]['scores']['instruction_following'][
          'by_check'].get(k), after=v)
      for k, v in after['instruction_following']['by_check'].items()}
  assert json.load(open(tmp_path / 'again' / 'config.json'))['optim']['lr'] == 1e-3
  meta = json.load(open(tmp_path / 'again' / 'rerun.json'))['meta']
  assert meta['commit'] and meta['wall_s'] > 0     # written by rerun_stage
  with pytest.raises(ValueError, match='only RL stages'):
    cascade.rerun_stage(c, str(tmp_path), 'sft', str(tmp_path / 'x'))
  with pytest.raises(ValueError, match="no stage 'rlhf9'"):
    cascade.rerun_stage(c, str(tmp_path), 'rlhf9', str(tmp_path / 'x'))


def test_sweep_report_gives_mean_and_spread(tmp_path):
  runs = []
  for seed, (a, b) in enumerate([(0.2, 0.5), (0.4, 0.7), (0.3, 0.6)]):
    d = tmp_path / f'seed{seed}' / 'report'
    d.mkdir(parents=True)
    json.dump(dict(matrix_stages=['sft', 'if_rl'], domains=['math', 'code'],
                   pass_rate=[[a, b], [a + 0.1, b - 0.1]]),
              open(d / 'report.json', 'w'))
    runs.append(str(tmp_path / f'seed{seed}'))
  out = report.cascade_sweep_report(runs, str(tmp_path))
  data = json.load(open(out['json']))
  np.testing.assert_allclose(data['mean'], [[0.3, 0.6], [0.4, 0.5]])
  np.testing.assert_allclose(data['std'], [[0.1, 0.1], [0.1, 0.1]])
  assert '0.300±0.100' in out['table']
  assert os.path.getsize(tmp_path / 'sweep_matrix.png') > 0


def test_sweep_launcher_prints_one_command_per_run(tmp_path):
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  r = subprocess.run(
      [sys.executable, '-m', 'experiments.sweep', '--experiment=cascade',
       '--config=configs/cascade.py', f'--workdir={tmp_path}', '--dry_run'],
      cwd=root, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  lines = [l for l in r.stdout.splitlines() if l.startswith('[sweep] run')]
  assert len(lines) == 3
  for seed, line in enumerate(lines):
    assert f'--config.seed={seed}' in line
    assert f'--workdir={tmp_path}/seed={seed}' in line


def test_report_marks_own_domain_changes_against_noise(tmp_path):
  def rec(name, init, doms, p_math):
    return dict(name=name, kind='grpo' if init else 'sft', init_from=init,
                domains=doms, train_s=1.0, eval_s=1.0, reward_model='',
                scores={'math': dict(pass_rate=p_math, mean_reward=p_math,
                                     n=400)})
  records = [rec('sft', '', [], 0.20), rec('big', 'sft', ['math'], 0.40),
             rec('small', 'big', ['math'], 0.42)]
  out = report.cascade_report(str(tmp_path), records)
  md = open(out['markdown']).read()
  assert 'big: math +0.200 (beyond noise)' in md      # 2 SE ~ 0.06 at n=400
  assert 'small: math +0.020 (within noise)' in md


def test_own_domain_noise_is_paired_over_the_eval_prompts(tmp_path):
  # 100 prompts, 2 samples each: after the stage, 10 prompts that passed
  # half the time pass always, nothing else moves. +0.05 is within two
  # independent standard errors (~0.09) but far beyond the paired ones.
  before = {str(i): (1.0 if i < 20 else 0.5 if i < 60 else 0.0)
            for i in range(100)}
  after = dict(before, **{str(i): 1.0 for i in range(20, 30)})

  def rec(name, init, doms, pp):
    p = float(np.mean(list(pp.values())))
    return dict(name=name, kind='grpo' if init else 'sft', init_from=init,
                domains=doms, train_s=1.0, eval_s=1.0, reward_model='',
                scores={'math': dict(pass_rate=p, mean_reward=p, n=200,
                                     prompts=100, prompt_pass=pp)})
  records = [rec('sft', '', [], before), rec('rl', 'sft', ['math'], after)]
  md = open(report.cascade_report(str(tmp_path), records)['markdown']).read()
  assert 'rl: math +0.050 (beyond noise)' in md
  for r in records:                    # without per-prompt results: within
    del r['scores']['math']['prompt_pass']
  md = open(report.cascade_report(str(tmp_path), records)['markdown']).read()
  assert 'rl: math +0.050 (within noise)' in md


@pytest.mark.slow   # ~2 min: a quick cascade to long_context_rl, then both arms
def test_recover_runs_mopd_with_the_best_earlier_teachers_and_grpo(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  c = _laptop(cascade_config.get_config('quick'))
  c.order = 'sft,if_rl,long_context_rl'
  run = tmp_path / 'run'
  cascade.run(c, str(run))
  stage = lambda n: json.load(open(run / n / 'stage.json'))
  want = max(('sft', 'if_rl'),
             key=lambda n: (stage(n)['scores']['math']['pass_rate'],
                            n == 'sft'))   # the earliest on a tie
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  res = subprocess.run(
      [sys.executable, '-m', 'experiments.recover',
       '--config=configs/cascade.py:quick', '--config.order=' + c.order,
       f'--run={run}', '--domains=math', f'--workdir={tmp_path / "rec"}'],
      cwd=root, capture_output=True, text=True, timeout=900)
  assert res.returncode == 0, res.stderr[-3000:]
  assert f'[recover] teachers: math <- {want}' in res.stdout, res.stdout
  for arm in ('mopd', 'grpo'):
    doc = json.load(open(tmp_path / 'rec' / arm / 'rerun.json'))
    assert doc['stage'] == f'{arm}_recover' and doc['meta']['commit']
    assert doc['recover']['teachers']['math']['stage'] == want
    assert doc['recover']['after'] == 'long_context_rl'
    rows = {r['domain']: r for r in doc['rows']}
    assert rows['math']['own'] and not rows['code']['own']
    # Both arms start from long_context_rl: its own scores are the before.
    assert rows['math']['before'] == stage('long_context_rl')['scores'][
        'math']['pass_rate']
    cfg = json.load(open(tmp_path / 'rec' / arm / 'config.json'))
    assert cfg['data']['domain'] == 'math'
    assert cfg['rl']['max_refill_rounds'] == 0
  rollouts = lambda arm: (lambda r: r['prompts_per_step'] * r[
      'rollouts_per_prompt'])(json.load(open(
          tmp_path / 'rec' / arm / 'config.json'))['rl'])
  assert rollouts('mopd') == rollouts('grpo') == 8     # equal rollouts


def test_compile_counter_counts_compiles_in_its_block_only():
  f = jax.jit(lambda x: x * 3 - 1)
  x4, x5 = jnp.ones(4), jnp.ones(5)       # made outside: not counted
  with utils.CompileCounter() as counted:
    f(x4)
    first = counted.stats()               # so far, inside the block
    f(x4)                                 # the same shape: no compile
    assert counted.stats()['compiles'] == first['compiles'] == 1
    t = threading.Thread(target=lambda: f(x5))
    t.start()
    t.join()                              # another thread's compile counts
  after = counted.stats()
  assert after['compiles'] == 2 and after['compile_s'] > 0
  assert after['trace_s'] > 0 and after['cache_hits'] == 0
  f(jnp.ones(6))                          # after the block: not counted
  assert counted.stats() == after
  with pytest.raises(RuntimeError, match='context manager'):
    utils.CompileCounter().stats()
