"""Decoupled rollouts (`rl.max_staleness`, `rl.rollout_worker`, `rl.rollout_devices`): a sampler process or thread that runs ahead of the learner.

On the main job's model (the quick SFT of configs/sft.py, its capacity
dispatch), through the RL stage as users run it.
"""

import json
import os
import pickle
import sys

import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import rl as rl_config  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

from cascade_jax import checkpoint  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import rl  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax.rl import _decoupled  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax.rl import _process  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
import _run_helpers  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

# Timings differ between any two runs; everything else must not.
_TIMING = ('time', 'step_s', 'sample_s', 'score_s', 'train_s', 'weight_sync_s',
           'rollout_wait_s', 'sampler_wall_s', 'sampler_cpu_s')
# Only the decoupled runs log these.
_DECOUPLED = ('policy_staleness', 'stale_dropped')


@pytest.fixture(scope='module')
def sft_dir(main_job_sft):
  return main_job_sft     # conftest: the main job's model, 6 quick SFT steps


def _run(sft_dir, workdir, worker: str, staleness: int, steps: int = 4,
         **rl_fields):
  c = rl_config.get_config('quick')
  c.init_from, c.steps, c.eval_n, c.checkpoint_every = sft_dir, steps, 0, 2
  c.rl.dynamic_filtering = False      # every step learns
  # Graded rewards (the share of constraints met, cut replies scored as
  # they are) spread even for a weak policy, so every step moves it.
  c.data.domain, c.rl.overlong = 'instruction_following', 'none'
  c.rl.rollout_worker, c.rl.max_staleness = worker, staleness
  for k, v in rl_fields.items():
    c.rl[k] = v
  rl.run(c, str(workdir))
  with open(os.path.join(workdir, 'rl_metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  return [r for r in rows if 'reward_mean' in r]


def _same(rows, drop=()):
  return [{k: v for k, v in r.items() if k not in _TIMING + drop}
          for r in rows]


def test_policy_version_schedule_is_fixed():
  assert [rl.policy_version(t, 0) for t in range(5)] == [0, 1, 2, 3, 4]
  assert [rl.policy_version(t, 1) for t in range(5)] == [0, 0, 1, 2, 3]
  assert [rl.policy_version(t, 2) for t in range(5)] == [0, 0, 0, 1, 2]
  # Resumed at step 3 with a larger bound: weights before 3 are gone.
  assert [rl.policy_version(t, 2, floor=3) for t in range(3, 7)] == [3, 3, 3,
                                                                       4]


def test_staleness_and_rollout_worker_config_errors():
  with pytest.raises(ValueError, match='max_staleness must be >= 0'):
    rl.RLConfig(max_staleness=-1)
  with pytest.raises(ValueError, match="rollout_worker: 'pool'"):
    rl.RLConfig(rollout_worker='pool')
  with pytest.raises(ValueError, match='not a comma-separated list'):
    rl.RLConfig(rollout_worker='process', rollout_cpus='one')
  with pytest.raises(ValueError, match="needs rl.rollout_worker='process'"):
    rl.RLConfig(rollout_cpus='1')
  # Stale rollouts are corrected even with the learner's own dtype.
  assert rl.RLConfig().correction('float32') == 'none'
  # bf16 compute: the sampler's and the learner's programs round apart.
  assert rl.RLConfig().correction('float32', 'bfloat16') == 'tis'
  assert rl.RLConfig(max_staleness=1).correction('float32') == 'tis'
  assert rl.RLConfig(max_staleness=1, behaviour_correction='mask'
                     ).correction('float32') == 'mask'


def test_staleness_drops_rollouts_older_than_the_bound():
  ones = np.ones((4, 3), np.int32)
  b = rl.RLBatch(inputs=ones, targets=ones, positions=ones, segment_ids=ones,
                 mask=ones, sampler_logp=np.zeros((4, 3), np.float32),
                 rewards=np.ones(4, np.float32), domains=('math',) * 4)
  r = rl.Rollout(step=5, version=3, batch=b, stats={}, position=8)
  kept, dropped = _decoupled.drop_stale(r, 5, 2)
  assert dropped == 0 and kept is b
  out, dropped = _decoupled.drop_stale(r, 5, 1)
  assert dropped == 4 and not out.learn
  assert out.mask.sum() == 0 and out.rewards.sum() == 0
  assert out.inputs.shape == b.inputs.shape and out.domains == b.domains


@pytest.mark.slow  # ~40 s, not the default (max_staleness 0 runs the synchronous loop, tested throughout): CI runs it
def test_decoupled_process_at_staleness_0_equals_the_synchronous_loop(
    sft_dir, tmp_path):
  sync = _run(sft_dir, tmp_path / 'sync', 'inline', 0)
  proc = _run(sft_dir, tmp_path / 'proc', 'process', 0)
  assert [r['step'] for r in proc] == [1, 2, 3, 4]
  assert _same(proc, _DECOUPLED) == _same(sync)
  assert all(r['policy_staleness'] == 0 and r['stale_dropped'] == 0
             for r in proc)
  assert all(r['sampler_cpu_s'] > 0 and r['weight_sync_s'] > 0
             for r in proc[:-1])


@pytest.mark.slow  # ~40 s, not the default (max_staleness 0, whose test stays): CI runs it
def test_decoupled_process_at_staleness_1_follows_the_schedule(sft_dir,
                                                               tmp_path):
  inline = _run(sft_dir, tmp_path / 'inline', 'inline', 1)
  proc = _run(sft_dir, tmp_path / 'proc', 'process', 1)
  # The sampler process draws exactly what the schedule says: its batches
  # and the learner's updates on them equal the one-process schedule's.
  assert _same(proc) == _same(inline)
  assert [r['policy_staleness'] for r in proc] == [0, 1, 1, 1]
  # Stale steps are trained with the decoupled objective: the behaviour
  # weight is applied and the sampler's log-probs differ from the
  # learner's by more than rounding once the policy has moved.
  assert all('is_weight_mean' in r for r in proc)
  assert proc[0]['sampler_mismatch_max'] < 1e-4
  assert max(r['sampler_mismatch_max'] for r in proc[1:]) > 1e-4
  sync = _run(sft_dir, tmp_path / 'sync', 'inline', 0)
  assert proc[0]['loss'] == pytest.approx(sync[0]['loss'], abs=1e-6)
  assert proc[0]['reward_mean'] == sync[0]['reward_mean']
  # Once an update has moved the policy, a stale step draws other
  # rollouts than the synchronous loop's.
  moved = [i for i, r in enumerate(sync[:-1]) if r['grad_norm'] > 0]
  assert moved, 'no update moved the policy: the test cannot tell'
  after = moved[0] + 1
  assert all(p['entropy'] != s['entropy']
             for p, s in zip(proc[after:], sync[after:]))
  # The checkpoint at step 2 keeps step 2's rollouts, sampled ahead by
  # version 1, and the prompt position after them.
  ck = checkpoint.Checkpointer(str(tmp_path / 'proc' / 'checkpoints'))
  try:
    assert ck.all_steps() == [2, 4]
    _, extra = ck.read(2)
  finally:
    ck.close()
  path = tmp_path / 'proc' / 'rollouts' / 'step_2.pkl'
  with open(path, 'rb') as f:
    queued = pickle.load(f)
  assert [(r.step, r.version) for r in queued] == [(2, 1)]
  assert queued[0].batch.mask.sum() > 0 and queued[0].position > 0
  assert extra['pending_rollouts'] == 'step_2.pkl'
  assert extra['prompt_position'] == queued[0].position
  assert sorted(os.listdir(tmp_path / 'proc' / 'rollouts')) == ['step_2.pkl']


@pytest.mark.slow  # ~20 s, not the default (max_staleness 0): CI runs it
def test_decoupled_staleness_with_several_updates_uses_the_proximal_policy(
    sft_dir, tmp_path):
  # Two updates a batch on stale rollouts: the clipped ratio is taken
  # against the current policy's log-probs before the update (proximal),
  # the sampler's weighed as the behaviour policy's.
  rows = _run(sft_dir, tmp_path / 'prox', 'inline', 1, updates_per_batch=2)
  assert [r['policy_staleness'] for r in rows] == [0, 1, 1, 1]
  assert all('is_weight_mean' in r and 'clip_fraction' in r for r in rows)
  assert all(np.isfinite(r['loss']) for r in rows)


def test_decoupled_sampler_process_failure_names_its_cause(sft_dir,
                                                           tmp_path):
  # A failure in the sampler process (here: pinning it to a core this
  # machine lacks) reaches the learner with the worker's traceback.
  c = rl_config.get_config('quick')
  c.init_from, c.steps, c.eval_n = sft_dir, 2, 0
  c.rl.rollout_worker, c.rl.rollout_cpus = 'process', '4095'
  with pytest.raises(RuntimeError, match='the sampler process failed') as e:
    rl.run(c, str(tmp_path))
  assert 'sched_setaffinity' in str(e.value)


@pytest.mark.slow
def test_decoupled_resume_under_another_staleness_bound(sft_dir, tmp_path):
  # Three steps at staleness 1 from a sampler process, killed after the
  # checkpoint at 2 (the one at 3 removed), which keeps step 3's rollouts
  # (sampled by version 1). Resumed at staleness 0 they are too old:
  # dropped, counted, nothing learned from them; resumed at staleness 2 the
  # run samples from the oldest weights it has (version 2) instead of
  # waiting for version 1, which is gone.
  import shutil  # pylint: disable=g-import-not-at-top
  first = _run(sft_dir, tmp_path / 'a', 'process', 1, steps=3)
  assert [r['policy_staleness'] for r in first] == [0, 1, 1]
  shutil.rmtree(tmp_path / 'a' / 'checkpoints' / '3')
  assert os.path.exists(tmp_path / 'a' / 'rollouts' / 'step_2.pkl')
  shutil.copytree(tmp_path / 'a', tmp_path / 'b')
  tighter = _run(sft_dir, tmp_path / 'a', 'process', 0, steps=4)
  assert [r['step'] for r in tighter] == [1, 2, 3, 4]
  assert tighter[2]['stale_dropped'] > 0 and 'loss' not in tighter[2]
  assert tighter[3]['stale_dropped'] == 0 and 'loss' in tighter[3]
  looser = _run(sft_dir, tmp_path / 'b', 'process', 2, steps=5)
  assert [r['policy_staleness'] for r in looser] == [0, 1, 1, 1, 2]


# ------------------------------------------- a sampler thread, own devices


def test_rollout_devices_split_and_config_errors():
  import jax  # pylint: disable=g-import-not-at-top
  devices = jax.devices()
  assert len(devices) == 8     # conftest's fake CPU devices
  assert rl.split_devices(0) == (None, None)
  learner, sampler = rl.split_devices(3)
  assert learner == devices[:5] and sampler == devices[5:]
  with pytest.raises(ValueError, match='leaves the learner none of the '
                     "run's 8 device"):
    rl.split_devices(8)
  with pytest.raises(ValueError, match='rollout_devices must be >= 0'):
    rl.RLConfig(rollout_devices=-1)
  with pytest.raises(ValueError, match="needs rl.rollout_worker 'thread'"):
    rl.RLConfig(rollout_worker='process', rollout_devices=4)
  for bad in ('data', 'data=two', 'pipeline=2', 'data=0'):
    with pytest.raises(ValueError, match='is not a mesh shape'):
      rl.RLConfig(rollout_mesh=bad)
  with pytest.raises(ValueError, match="names 'data' twice"):
    rl.RLConfig(rollout_mesh='data=2,data=4')
  assert rl.RLConfig(rollout_mesh='data=2, expert=2').rollout_mesh_shape() == {
      'data': 2, 'expert': 2}


def test_rollout_devices_that_leave_the_step_unsplittable_fail_at_set_up(
    sft_dir, tmp_path, monkeypatch):
  # 3 of the 8 devices to the sampler leaves the learner 5, which do not
  # split the quick config's 4 x 4 rollouts: named before the stage builds
  # its sampler or evaluates anything (the first step found it before).
  from cascade_jax.rl import _stage  # pylint: disable=g-import-not-at-top

  def never(*args, **kwargs):
    raise AssertionError('the stage got past its set-up')
  monkeypatch.setattr(_stage, '_evaluate', never)
  monkeypatch.setattr(_stage, '_rollouts', never)
  with pytest.raises(ValueError, match=(
      r"a step's 16 rollouts .* do not split over the learner's 5 devices "
      r'on its batch axes \(the run\'s devices less '
      r'rl.rollout_devices=3\): make the rollouts a multiple of 5')):
    _run(sft_dir, tmp_path / 'run', 'thread', 1, rollout_devices=3,
         prompts_per_step=4, rollouts_per_prompt=4)


def test_decoupled_thread_and_device_split_refuse_a_multi_host_run(
    monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  with pytest.raises(ValueError, match="'thread' runs in one process"):
    rl.ThreadRollouts(None, None, None, 1, 4)
  with pytest.raises(ValueError, match="splits one process's devices"):
    rl.split_devices(2)


def test_decoupled_weight_sync_shards_cut_the_samplers_blocks():
  # On several hosts each learner process sends its own sampler process
  # its shards (`Shards`); the sampler cuts each of its blocks from them,
  # on a mesh of its own; a block its learner's devices do not hold is
  # named, not filled.
  import jax  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  devs = np.array(jax.devices())
  learner = Mesh(devs[:4].reshape(2, 2), ('data', 'expert'))
  sampler = Mesh(devs[4:].reshape(2, 2), ('data', 'expert'))
  want = np.arange(48, dtype=np.float32).reshape(4, 12)
  x = jax.device_put(want, NamedSharding(learner, P('expert', None)))
  sent = rl.Shards.local(x)
  assert sorted(sent.blocks) == [((0, 2), (0, 12)), ((2, 4), (0, 12))]
  for spec, mesh in [(P('expert', None), sampler),       # a mirror
                     (P(None, ('data', 'expert')), sampler),
                     (P(None, 'data'), Mesh(devs[6:], ('data',)))]:
    got = sent.place(NamedSharding(mesh, spec))
    assert got.sharding.mesh == mesh
    np.testing.assert_array_equal(np.asarray(got), want)
  # A host whose learner devices hold rows 0-1 only (another host 2-3).
  part = rl.Shards(sent.shape, sent.dtype, {
      k: v for k, v in sent.blocks.items() if k[0] == (0, 2)})
  np.testing.assert_array_equal(part.block(((0, 1), (3, 9))), want[:1, 3:9])
  with pytest.raises(ValueError, match=(
      r"needs block \(\(0, 4\), \(0, 6\)\) of a \(4, 12\) weight, which "
      r"its learner process's devices do not hold")):
    part.place(NamedSharding(sampler, P(None, 'data')))
  # Its own run beside the learner's: the coordinator's port + 1, or named.
  assert rl.sampler_cluster() is None    # one process
  with pytest.raises(ValueError, match='rl.rollout_coordinator: .* with '
                     "rl.rollout_worker='process'"):
    rl.RLConfig(rollout_coordinator='10.0.0.1:1235')
  with pytest.raises(ValueError, match="'host:port'"):
    rl.RLConfig(rollout_worker='process', rollout_coordinator='10.0.0.1')
  # Its environment (its own accelerators).
  assert rl.RLConfig(
      rollout_worker='process',
      rollout_env='CUDA_VISIBLE_DEVICES=4,5,6,7; XLA_FLAGS=--a=1 --b',
  ).rollout_env_vars() == {'CUDA_VISIBLE_DEVICES': '4,5,6,7',
                           'XLA_FLAGS': '--a=1 --b'}
  with pytest.raises(ValueError, match="'GPUS' in 'GPUS' is not KEY=VALUE"):
    rl.RLConfig(rollout_worker='process', rollout_env='GPUS')
  with pytest.raises(ValueError, match="rollout_env is the sampler process's"):
    rl.RLConfig(rollout_env='A=1')


def test_decoupled_sampler_processes_on_several_hosts_form_their_own_run(
    monkeypatch):
  import socket  # pylint: disable=g-import-not-at-top
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  # One process stands for both: process 0's verdict is its own.
  monkeypatch.setattr(_process, '_agree', bool)
  monkeypatch.setattr(distributed.global_state, 'coordinator_address',
                      '10.0.0.1:1234')
  assert rl.sampler_cluster() == dict(
      coordinator_address='10.0.0.1:1235', num_processes=2, process_id=1)
  assert rl.sampler_cluster('10.0.0.2:9000')['coordinator_address'] == (
      '10.0.0.2:9000')
  monkeypatch.setattr(distributed.global_state, 'coordinator_address', None)
  with pytest.raises(ValueError, match='give the sampler processes.* own as '
                     'rl.rollout_coordinator'):
    rl.sampler_cluster()
  # Process 0, where the sampler processes' coordinator will listen, checks
  # its port: one taken (here by a listening socket) is named at once.
  with socket.socket() as taken:
    taken.bind(('127.0.0.1', 0))
    taken.listen()
    port = taken.getsockname()[1]
    assert _process.port_in_use(f'127.0.0.1:{port}')
    monkeypatch.setattr(distributed.global_state, 'coordinator_address',
                        f'127.0.0.1:{port - 1}')
    assert rl.sampler_cluster()['process_id'] == 1   # process 1 checks nothing
    monkeypatch.setattr(jax, 'process_index', lambda: 0)
    with pytest.raises(ValueError, match=(
        f"coordinator 127.0.0.1:{port} .*cannot listen: the port is taken on "
        "process 0's host.*give rl.rollout_coordinator='host:port' a free")):
      rl.sampler_cluster()
  assert not _process.port_in_use(f'127.0.0.1:{port}')
  assert rl.sampler_cluster()['process_id'] == 0


@pytest.mark.slow  # ~3 min: four processes, six runs; CI runs it
@pytest.mark.xdist_group('heavy')  # started first (conftest)
def test_decoupled_sampler_processes_on_two_hosts_follow_the_schedule(
    sft_dir, tmp_path):
  # Two learner processes of 4 CPU devices (one data 2 x expert 4 mesh),
  # each with a sampler process beside it, the samplers a jax.distributed
  # run of their own on a mirrored mesh, each fed its learner's shards of
  # the weights: the same batches and updates as the one-process schedule
  # sampled inline by the two learner processes; killed after its
  # checkpoint at 2 and started again, the run ends where it ends (its
  # rows, and its last checkpoint bit for bit). Then the samplers'
  # coordinator port taken, samplers of 2 devices each on a mesh of their
  # own, and a learner mesh whose shards do not cover what they need.
  import signal  # pylint: disable=g-import-not-at-top
  import socket  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = _run_helpers.child_env()

  def start(name, *args, port=None):
    port = port or _run_helpers.free_port()
    return [subprocess.Popen(
        [sys.executable, os.path.join(root, 'tests', '_decoupled_worker.py'),
         str(tmp_path / f'{name}.json'), str(i), '2', str(port), sft_dir,
         str(tmp_path / name), *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i in range(2)]

  def run(name, *args, port=None):
    procs = start(name, *args, port=port)
    return [p.communicate(timeout=900)[0] for p in procs], [
        p.returncode for p in procs]

  logs, codes = run('inline', 'inline')
  assert codes == [0, 0], logs[0][-4000:] + logs[1][-4000:]
  with open(tmp_path / 'inline.json') as f:
    inline = json.load(f)
  # The sampler processes' run, both learner processes killed (SIGKILL)
  # once the checkpoint at 2 is committed and step 3 logged, then started
  # again (a new port, as a scheduler's restart would take): step 2's
  # rollouts sampled ahead come from the checkpoint, new sampler processes
  # sample on from step 3. (An uninterrupted run of the same is this one
  # before its kill: not run apart.)
  procs = start('cut', 'process')
  metrics = tmp_path / 'cut' / 'rl_metrics.jsonl'
  deadline = time.monotonic() + 600
  while time.monotonic() < deadline and all(p.poll() is None for p in procs):
    if (tmp_path / 'cut' / 'checkpoints' / '2').is_dir() and metrics.exists(
    ) and any('"step": 3' in line for line in open(metrics)):
      break
    time.sleep(0.05)
  assert all(p.poll() is None for p in procs), 'the run ended before the kill'
  for p in procs[::-1]:
    p.send_signal(signal.SIGKILL)
    p.wait()
  logs, codes = run('cut', 'process')
  assert codes == [0, 0], logs[0][-4000:] + logs[1][-4000:]
  assert 'rollouts from a sampler process' in logs[0]
  assert '[distributed] process 1 of 2 (flags): 4 local / 8 devices' in logs[1]
  assert '[rl] the sampler process: 4 cpu device(s) of 8' in logs[1]
  assert 'resumed from step 2 with 1 step(s) of rollouts sampled ahead' in (
      logs[0])
  with open(tmp_path / 'cut.json') as f:
    cut = json.load(f)
  assert len(cut) == 4 and _same(cut) == _same(inline)
  assert [r['policy_staleness'] for r in cut] == [0, 1, 1, 1]
  assert cut[0]['sampler_mismatch_max'] < 1e-5
  # The last checkpoint (step 4), as the two learner processes wrote it:
  # parameters, optimizer state and data position bit for bit those of the
  # learners that sampled inline.
  final = {w: _run_helpers.final_state(tmp_path / w, sft_dir)
           for w in ('inline', 'cut')}
  assert [final[w][0] for w in final] == [4, 4]
  assert final['cut'][2] == final['inline'][2]
  assert final['cut'][2]['prompt_position'] > 0
  for a, b in zip(jax.tree.leaves(final['inline'][1]),
                  jax.tree.leaves(final['cut'][1]), strict=True):
    np.testing.assert_array_equal(a, b)
  # The sampler processes' coordinator port (the learners' + 1) taken on
  # process 0's host: both learner processes name it at set-up and stop.
  taken = socket.socket()
  for _ in range(100):   # a free port whose next one is free too
    port = _run_helpers.free_port()
    try:
      taken.bind(('127.0.0.1', port + 1))
      break
    except OSError:
      continue
  else:
    raise AssertionError('no two free ports in a row on 127.0.0.1')
  with taken:
    taken.listen()
    logs, codes = run('taken', 'process', port=port)
  assert codes[0] != 0 and codes[1] != 0
  for log in logs:
    assert (f"coordinator 127.0.0.1:{port + 1} (rl.rollout_coordinator" in
            log and 'the port is taken' in log), log[-4000:]
  # Samplers of 2 devices each (rl.rollout_env) on a data 2 x expert 2
  # mesh: each host's learner devices hold every expert (expert 4 within a
  # host), so each sampler cuts its halves from them. Another mesh, other
  # sums: on-policy, not the same draws.
  two = 'XLA_FLAGS=--xla_force_host_platform_device_count=2'
  logs, codes = run('split', 'process', two, 'data=2,expert=2')
  assert codes == [0, 0], logs[0][-4000:] + logs[1][-4000:]
  assert '[rl] the sampler process: 2 cpu device(s) of 4' in logs[1]
  with open(tmp_path / 'split.json') as f:
    split = json.load(f)
  assert [r['policy_staleness'] for r in split] == [0, 1, 1, 1]
  assert split[0]['sampler_mismatch_max'] < 1e-5
  # The learner's experts split over both hosts (expert 8): each host's
  # sampler needs all 8 and its learner devices hold 4; every learner
  # process says why.
  logs, codes = run('uncovered', 'process', two, 'data=2,expert=2',
                    'expert=8')
  assert codes[0] != 0 and codes[1] != 0
  for log in logs:
    assert ("which its learner process's devices do not hold" in log and
            'rl.rollout_mesh' in log), log[-4000:]


@pytest.mark.slow  # ~30 s, not the default (max_staleness 0, inline; its failure and unit tests stay): CI runs it
def test_decoupled_thread_on_devices_of_its_own_follows_the_schedule(
    sft_dir, tmp_path, capsys):
  # The learner on devices 0-3 (the stage's mesh, data=-1), the sampler
  # thread on 4-7 (rl.rollout_mesh), one update behind: its batches and the
  # learner's updates on them equal the same schedule sampled inline on
  # those devices (when a step asks, nothing overlapping).
  split = dict(rollout_devices=4)
  inline = _run(sft_dir, tmp_path / 'inline', 'inline', 1, steps=3, **split)
  thread = _run(sft_dir, tmp_path / 'thread', 'thread', 1, steps=3, **split)
  assert _same(thread) == _same(inline)
  assert [r['policy_staleness'] for r in thread] == [0, 1, 1]
  # The weights after update 1 sample step 2 (those after 2, nothing).
  assert [r['weight_sync_s'] > 0 for r in thread] == [True, False, False]
  assert all(r['sampler_wall_s'] > 0 and 'sampler_cpu_s' not in r
             for r in thread)
  # Fresh weights score what they drew (across the two meshes).
  assert thread[0]['sampler_mismatch_max'] < 1e-5
  out = capsys.readouterr().out
  assert "[rl] mesh {'data': 4" in out
  assert 'the sampler on devices of its own: [4, 5, 6, 7]' in out


def test_decoupled_sampler_thread_failure_names_its_cause(sft_dir, tmp_path,
                                                          monkeypatch):
  from cascade_jax.rl import _sampler_side  # pylint: disable=g-import-not-at-top

  def broken(*args, **kwargs):
    raise ValueError('a reward server that is down')
  monkeypatch.setattr(_sampler_side, 'collect', broken)
  c = rl_config.get_config('quick')
  c.init_from, c.steps, c.eval_n = sft_dir, 2, 0
  c.rl.rollout_worker, c.rl.max_staleness = 'thread', 1
  with pytest.raises(RuntimeError, match='the sampler thread failed') as e:
    rl.run(c, str(tmp_path))
  assert 'a reward server that is down' in str(e.value)


@pytest.mark.slow  # ~20 s, not the default (max_staleness 0, inline): CI runs it
def test_decoupled_thread_at_staleness_0_equals_the_synchronous_loop(
    sft_dir, tmp_path):
  sync = _run(sft_dir, tmp_path / 'sync', 'inline', 0)
  thread = _run(sft_dir, tmp_path / 'thread', 'thread', 0)
  assert _same(thread, _DECOUPLED) == _same(sync)
  assert all(r['policy_staleness'] == 0 for r in thread)


@pytest.mark.slow  # ~30 s, not the default (max_staleness 0, inline): CI runs it
def test_decoupled_thread_resumes_where_an_uninterrupted_run_ends(sft_dir,
                                                                  tmp_path):
  # Killed after the checkpoint at 2 (the later one removed), with step 2's
  # rollouts sampled ahead by version 1: run again, it ends where the
  # uninterrupted run ends.
  import shutil  # pylint: disable=g-import-not-at-top
  whole = _run(sft_dir, tmp_path / 'a', 'thread', 1, steps=4,
               rollout_devices=4)
  shutil.rmtree(tmp_path / 'a' / 'checkpoints' / '4')
  assert os.path.exists(tmp_path / 'a' / 'rollouts' / 'step_2.pkl')
  again = _run(sft_dir, tmp_path / 'a', 'thread', 1, steps=4,
               rollout_devices=4)
  assert _same(again) == _same(whole)


@pytest.mark.slow  # ~20 s, not the default (one set of devices): CI runs it
def test_decoupled_thread_on_an_expert_parallel_mesh_of_its_own_is_on_policy(
    sft_dir, tmp_path, capsys):
  # The sampler's weights in the inference layout on its own mesh (experts
  # split over its expert axis), the learner's in the training layout on
  # the others: fresh weights score what they drew at every step.
  rows = _run(sft_dir, tmp_path / 'ep', 'thread', 0, steps=3,
              rollout_devices=4, rollout_mesh='data=2,expert=2')
  assert [r['policy_staleness'] for r in rows] == [0, 0, 0]
  assert all(r['sampler_mismatch_max'] < 1e-5 for r in rows)
  assert all(r['weight_sync_s'] > 0 for r in rows[:-1])
  assert 'rl.rollout_mesh data=2,expert=2' in capsys.readouterr().out


@pytest.mark.slow  # ~40 s: CI runs it
def test_decoupled_sampler_process_with_devices_and_a_mesh_of_its_own(
    sft_dir, tmp_path, capfd):
  # One host, as a GPU host would split it (the learner started on some
  # devices, the sampler process given others by rl.rollout_env): here
  # the sampler process has 2 CPU devices and samples on a data 2 x expert
  # 1 mesh of them (rl.rollout_mesh), the learner on one device; fresh
  # weights score what they drew.
  rows = _run(sft_dir, tmp_path / 'own', 'process', 1, steps=3,
              rollout_env='XLA_FLAGS=--xla_force_host_platform_device_count=2',
              rollout_mesh='data=2')
  assert [r['policy_staleness'] for r in rows] == [0, 1, 1]
  assert rows[0]['sampler_mismatch_max'] < 1e-5
  out = capfd.readouterr().out
  assert ('[rl] the sampler process: 2 cpu device(s) of 2, environment '
          "{'XLA_FLAGS': '--xla_force_host_platform_device_count=2'}") in out
  assert "[rl-sampler] mesh {'data': 2, 'fsdp': 1" in out


def test_decoupled_sampler_keeps_no_array_the_next_update_donates():
  # A sampler model kept past the next update (staleness > 0, or a thread)
  # must hold none of the learner's arrays, which that update donates:
  # the learner's own (a sampler that copies nothing) and any a weight
  # sync passed through unchanged are copied; its fresh arrays are not.
  import types  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  graph, params, rest = nnx.split(nnx.Linear(3, 2, rngs=nnx.Rngs(0)),
                                  nnx.Param, ...)
  state = types.SimpleNamespace(params=params, rest=rest)
  learner = {id(x) for x in jax.tree.leaves((params, rest))}

  class Sampler:   # SamplerWeights' interface
    def __init__(self, fresh):
      self.fresh = fresh

    def model(self, s):
      p = s.params
      if self.fresh:   # a sync that writes the kernel anew, passes the bias
        p = jax.tree.map(lambda x: x, p)
        p['kernel'] = nnx.Param(p['kernel'].value.astype(jnp.bfloat16))
      return nnx.merge(graph, p, s.rest)

    def copies(self, s):
      return self.fresh

  ids = lambda m: [id(x) for x in jax.tree.leaves(nnx.state(m))]
  for fresh in (False, True):
    kept, _ = _decoupled.own_model(Sampler(fresh), state, keep=True)
    assert not set(ids(kept)) & learner, fresh
    values = jax.tree.leaves(nnx.state(kept))
    np.testing.assert_array_equal(values[0], params['bias'].value)
    shared, _ = _decoupled.own_model(Sampler(fresh), state, keep=False)
    assert (set(ids(shared)) & learner) == ({id(params['bias'].value)}
                                            if fresh else learner)
