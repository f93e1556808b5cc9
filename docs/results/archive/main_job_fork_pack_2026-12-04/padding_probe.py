"""Logs the rows, width and tokens of every learner batch of an experiments.rerun_stage run (run with PYTHONPATH=<repo root>)."""
import sys, json, numpy as np
from cascade_jax.rl import _learner
orig = _learner.Learner.step
def step(self, state, batch):
    seg = np.asarray(batch.segment_ids) != 0
    lens = seg.sum(1)
    with open('/tmp/probe/fill.jsonl','a') as f:
        f.write(json.dumps(dict(rows=int(seg.shape[0]), width=int(seg.shape[1]), tokens=int(seg.sum()),
                                fill=float(seg.mean()), max_len=int(lens.max()), mean_len=float(lens.mean()))) + '\n')
    return orig(self, state, batch)
_learner.Learner.step = step
from experiments import rerun_stage
from absl import app
sys.argv = [sys.argv[0]] + sys.argv[1:]
app.run(rerun_stage.main)
