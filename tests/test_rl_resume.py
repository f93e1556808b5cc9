"""An RL stage killed (SIGKILL, mid-step) and started again ends exactly where an uninterrupted run ends."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from cascade_jax import checkpoint
import _run_helpers  # pylint: disable=g-import-not-at-top

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Timings differ between any two runs; everything else must not.
_TIMING = ('time', 'step_s', 'sample_s', 'score_s', 'train_s',
           'weight_sync_s', 'rollout_wait_s', 'sampler_wall_s', 'sampler_cpu_s')


@pytest.fixture(scope='module')
def sft_dir(main_job_sft):
  return main_job_sft     # conftest: the main job's model, 6 quick SFT steps


def _command(workdir, sft_dir, algorithm):
  cmd = [sys.executable, '-m', 'experiments.rl', '--config=configs/rl.py:quick',
         f'--workdir={workdir}', f'--config.init_from={sft_dir}',
         '--config.steps=6', '--config.checkpoint_every=2',
         '--config.eval_n=8', '--config.eval_every=3']
  if algorithm == 'mopd':
    cmd += ['--config.rl.algorithm=mopd', f'--config.teachers.math={sft_dir}',
            '--config.rl.dynamic_filtering=False']
  else:
    # GRPO on instruction following (graded: the share of constraints met),
    # where the quick SFT's rollouts score 0-1 within a group; its math
    # rollouts all score 0, so every advantage was 0 and no update moved the
    # weights or the moments. No filtering: every step takes an update
    # (with it, steps 3-6 found no group with a spread after refills).
    cmd += ['--config.data.domain=instruction_following',
            '--config.data.levels=1,2', '--config.rl.dynamic_filtering=False']
  if algorithm == 'packed':      # GRPO, rollouts packed several a row
    cmd += ['--config.rl.pack_width=64']
  if algorithm == 'decoupled':   # GRPO from a sampler process, 1 step ahead
    cmd += ['--config.rl.max_staleness=1', '--config.rl.rollout_worker=process']
  if algorithm == 'decoupled_thread':   # from a sampler thread, 1 step ahead
    cmd += ['--config.rl.max_staleness=1', '--config.rl.rollout_worker=thread']
  return cmd


def _env():
  env = dict(os.environ)
  env['XLA_FLAGS'] = ' '.join(
      f for f in env.get('XLA_FLAGS', '').split()
      if not f.startswith('--xla_force_host_platform_device_count'))
  return env


def _rows(workdir):
  with open(os.path.join(workdir, 'rl_metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  return [{k: v for k, v in r.items() if k not in _TIMING} for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize('algorithm', ['grpo', 'mopd', 'decoupled',
                                       'decoupled_thread', 'packed'])
def test_a_killed_rl_stage_resumes_bit_identically(sft_dir, tmp_path,
                                                   algorithm):
  whole, cut = str(tmp_path / 'whole'), str(tmp_path / 'cut')
  subprocess.run(_command(whole, sft_dir, algorithm), cwd=ROOT, env=_env(),
                 check=True, capture_output=True, timeout=600)

  # Killed while step 4 runs: after the checkpoint at step 2 and the
  # evaluation at step 3, before the checkpoint at step 4.
  proc = subprocess.Popen(_command(cut, sft_dir, algorithm), cwd=ROOT,
                          env=_env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  metrics = os.path.join(cut, 'rl_metrics.jsonl')
  deadline = time.monotonic() + 600
  # The checkpoint at step 2 is written asynchronously: with the compiled
  # programs cached, step 3 can be done before it is committed (Orbax
  # renames its temporary directory to `2` last).
  committed = os.path.join(cut, 'checkpoints', '2')
  while time.monotonic() < deadline and proc.poll() is None:
    if os.path.isdir(committed) and os.path.exists(metrics) and any(
        '"step": 3' in line and 'eval/' in line for line in open(metrics)):
      break
    time.sleep(0.05)
  assert proc.poll() is None, 'the run ended before it could be killed'
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  ck = checkpoint.Checkpointer(os.path.join(cut, 'checkpoints'))
  assert ck.latest_step() == 2
  ck.close()
  # Rows after the checkpoint were written before the kill (step 3's, and
  # step 4's too when it finished between the last look and the signal):
  # the resume must drop them.
  assert max(r['step'] for r in _rows(cut)) in (3, 4)

  subprocess.run(_command(cut, sft_dir, algorithm), cwd=ROOT, env=_env(),
                 check=True, capture_output=True, timeout=600)
  step_w, state_w, extra_w = _run_helpers.final_state(whole, sft_dir)
  step_c, state_c, extra_c = _run_helpers.final_state(cut, sft_dir)
  assert step_w == step_c == 6
  assert extra_w == extra_c and extra_c['prompt_position'] > 0
  # A packed run restores its row count (the update's shape) as well.
  assert (extra_c['pack_rows'] > 0) == (algorithm == 'packed')
  # Parameters, optimizer state (moments and count) and step: bit-equal.
  for a, b in zip(jax.tree.leaves(state_w), jax.tree.leaves(state_c),
                  strict=True):
    np.testing.assert_array_equal(a, b)
  # The metrics file: every row once, with the values of the whole run.
  rows_w, rows_c = _rows(whole), _rows(cut)
  # A resumed step took an update that moved the weights (the test could
  # not tell a restored optimizer state from a lost one otherwise; a step
  # whose groups all scored alike has no gradient).
  moved = [r['step'] for r in rows_w
           if r['step'] > 2 and r.get('grad_norm', 0) > 0]
  assert moved, rows_w
  assert [r['step'] for r in rows_c] == [r['step'] for r in rows_w]
  assert rows_c == rows_w
  assert json.load(open(os.path.join(cut, 'rl_scores.json'))) == json.load(
      open(os.path.join(whole, 'rl_scores.json')))


def test_metrics_rows_after_the_checkpoint_are_dropped_on_resume(tmp_path):
  from cascade_jax import metrics  # pylint: disable=g-import-not-at-top
  from cascade_jax.rl import _stage  # pylint: disable=g-import-not-at-top
  w = metrics.MetricsWriter(str(tmp_path), name='rl', tensorboard=False)
  w.write(0, {'eval/math/pass_rate': 0.1})
  for s in (1, 2, 3):
    w.write(s, {'loss': s})
  w.write(3, {'eval/math/pass_rate': 0.3})
  w.write(4, {'loss': 4})
  w.close()
  with open(tmp_path / 'rl_metrics.jsonl', 'a') as f:
    f.write('{"step": 5, "lo')                     # cut by the kill
  read = lambda: [(r['step'], 'eval/math/pass_rate' in r) for r in (
      json.loads(x) for x in open(tmp_path / 'rl_metrics.jsonl'))]
  # Resumed from the checkpoint at step 3 of 6: the evaluation at step 3
  # came before that checkpoint and stays; step 4 and the cut row go.
  metrics.MetricsWriter(str(tmp_path), name='rl', tensorboard=False,
                        keep=lambda r: _stage._written_before(r, 3, 6)).close()
  assert read() == [(0, True), (1, False), (2, False), (3, False), (3, True)]
  # Resumed at the last step: its final evaluation is redone.
  metrics.MetricsWriter(str(tmp_path), name='rl', tensorboard=False,
                        keep=lambda r: _stage._written_before(r, 3, 3)).close()
  assert read() == [(0, True), (1, False), (2, False), (3, False)]
  # Resumed from nothing: the first evaluation is redone too.
  metrics.MetricsWriter(str(tmp_path), name='rl', tensorboard=False,
                        keep=lambda r: _stage._written_before(r, 0, 6)).close()
  assert read() == []
