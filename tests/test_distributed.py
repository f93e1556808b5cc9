"""Two processes on 127.0.0.1 (jax.distributed + gloo) train like one, and decide rewards once."""

import os
import subprocess
import sys

import numpy as np
import pytest

import _run_helpers  # pylint: disable=g-import-not-at-top

_WORKER = os.path.join(os.path.dirname(__file__), '_distributed_worker.py')
_COLLECT = os.path.join(os.path.dirname(__file__), '_collect_worker.py')


def _start_pair(worker, outs):
  """`worker` as processes 0 and 1 of one jax.distributed run on
  127.0.0.1, process i writing outs[i]."""
  port = _run_helpers.free_port()
  return [subprocess.Popen(
      [sys.executable, worker, str(outs[i]), str(i), '2', str(port)],
      env=_run_helpers.child_env(), stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True) for i in range(2)]


def _wait(procs, timeout):
  for p in procs:
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out


def _reference(worker, out, timeout):
  """`worker` alone: one process, one device."""
  ref = subprocess.run([sys.executable, worker, str(out)],
                       env=_run_helpers.child_env(), capture_output=True,
                       text=True, timeout=timeout)
  assert ref.returncode == 0, ref.stdout + ref.stderr


@pytest.mark.slow  # ~36 s, not the default (one process): CI runs it
def test_two_process_sharded_step_equals_single_process(tmp_path):
  ref_path, dist_path = tmp_path / 'ref.npz', tmp_path / 'dist.npz'
  procs = _start_pair(_WORKER, [dist_path] * 2)
  _reference(_WORKER, ref_path, 300)
  _wait(procs, 300)
  want, got = np.load(ref_path), np.load(dist_path)
  assert sorted(want.files) == sorted(got.files)
  assert float(want['loss1']) < float(want['loss0'])  # the step did something
  for k in want.files:
    np.testing.assert_allclose(got[k].reshape(want[k].shape), want[k],
                               rtol=1e-5, atol=1e-5, err_msg=k)


@pytest.mark.slow  # ~26 s: CI runs it
def test_two_processes_whose_verdicts_differ_collect_the_same_batch(tmp_path):
  # Each process's reward function answers differently (its process index
  # plus 1 on every other row). Each scores its own half of the 8 rollouts
  # and the halves are shared: both get [0, 1, 0, 1, 1, 2, 1, 2] and the
  # same batch, where each on its own would have filtered and padded
  # differently and then waited on the other in a collective.
  outs = [tmp_path / f'p{i}.npz' for i in range(2)]
  _wait(_start_pair(_COLLECT, outs), 300)
  a, b = (np.load(o) for o in outs)
  np.testing.assert_array_equal(a['rewards'], [0, 1, 0, 1, 1, 2, 1, 2])
  for k in ('rewards', 'mask', 'inputs', 'filtered'):
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  np.testing.assert_array_equal(a['scored'], [4])   # its own half only
  np.testing.assert_array_equal(a['rm_rewards'], [0, 1] * 4)  # process 0's
  np.testing.assert_array_equal(b['rm_rewards'], a['rm_rewards'])
  # Episodes (environment steps on every host): process 0's are everyone's.
  for k in ('ep_rewards', 'ep_inputs', 'ep_filtered'):
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  np.testing.assert_array_equal(a['ep_rewards'], np.zeros_like(
      a['ep_rewards']))


@pytest.mark.slow  # not the default (one process): CI runs it
def test_two_process_continuous_batching_samples_what_one_device_samples(
    tmp_path):
  # Continuous batching and episode slots on a mesh that spans two
  # processes (the RL sampler's inference layout on fsdp 2 x expert 4):
  # every process reads the rows it refills from the whole batch; the
  # samples are the one-device sampler's for the same keys.
  ref_path, dist_path = tmp_path / 'ref.npz', tmp_path / 'dist.npz'
  worker = os.path.join(os.path.dirname(__file__), '_continuous_worker.py')
  procs = _start_pair(worker, [dist_path] * 2)
  _reference(worker, ref_path, 600)
  _wait(procs, 600)
  want, got = np.load(ref_path), np.load(dist_path)
  assert len(set(want['mask'].sum(1).tolist())) > 2     # rows end apart
  assert want['turns'].max() >= 2, want['turns']
  for k in ('tokens', 'mask', 'episodes', 'turns'):
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  for k in ('logprobs', 'ep_logprobs'):
    np.testing.assert_allclose(got[k], want[k], atol=1e-5, err_msg=k)
