"""One of two processes of an RL stage whose rollouts come from sampler processes (one a host).

  python tests/_decoupled_worker.py OUT.json PROC NPROC PORT SFT_DIR WORKDIR WORKER \
      [ENV [ROLLOUT_MESH [MESH]]]

The stage of tests/test_decoupled.py (the main job's model, the quick RL
config, instruction following) on a data 2 x expert 4 mesh (or `MESH`,
'expert=8') over two processes of 4 CPU devices, one update behind
(`max_staleness` 1), 4 steps, a checkpoint every 2; `WORKER` 'inline'
samples in the learner's processes, 'process' in a sampler process beside
each, which form a jax.distributed run of their own (`ENV`: their
`rl.rollout_env`; `ROLLOUT_MESH`: their `rl.rollout_mesh`). Writes the
stage's metric rows to OUT.json (process 0).
"""

import json
import os
import sys


def main():
  # Here, not at the top: a sampler process (multiprocessing's spawn)
  # imports this file again and must not join the learner's run.
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
      __file__))))
  import _worker_start  # pylint: disable=g-import-not-at-top,unused-import
  import ml_collections  # pylint: disable=g-import-not-at-top
  from configs import rl as rl_config  # pylint: disable=g-import-not-at-top

  from cascade_jax import rl  # pylint: disable=g-import-not-at-top
  sft_dir, workdir, worker = sys.argv[5:8]
  sampler_env, rollout_mesh, mesh = (sys.argv[8:] + ['', '', ''])[:3]
  c = rl_config.get_config('quick')
  c.init_from, c.steps, c.eval_n, c.checkpoint_every = sft_dir, 4, 0, 2
  c.rl.dynamic_filtering = False
  c.data.domain, c.rl.overlong = 'instruction_following', 'none'
  c.rl.rollout_worker, c.rl.max_staleness = worker, 1
  c.rl.rollout_env, c.rl.rollout_mesh = sampler_env, rollout_mesh
  c.mesh = ml_collections.ConfigDict(dict(
      (k, int(v)) for k, v in (a.split('=') for a in (
          mesh or 'data=2,expert=4').split(','))))
  rl.run(c, workdir)
  if _worker_start.proc == 0:
    with open(os.path.join(workdir, 'rl_metrics.jsonl')) as f:
      rows = [json.loads(line) for line in f]
    with open(_worker_start.out_path, 'w') as f:
      json.dump([r for r in rows if 'reward_mean' in r], f)


if __name__ == '__main__':
  main()
