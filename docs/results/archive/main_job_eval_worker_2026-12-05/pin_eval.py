"""One stage scored as the evaluation process scores it, pinned to one CPU or not; writes its per-prompt results."""
import json
import os
import sys
import time

if sys.argv[1] == 'pin':
  os.sched_setaffinity(0, {1})   # before XLA starts: its thread pools see one CPU
from cascade_jax.cascade import _run  # noqa: E402
from cascade_jax.cascade import _scoring  # noqa: E402
from configs import cascade as cc  # noqa: E402

c = cc.get_config()
evals = _run.eval_sets(c)
t = time.perf_counter()
r = _scoring.scored(c, sys.argv[2], evals)
print(sys.argv[1], 'eval_s', round(time.perf_counter() - t, 1), r['compiles'])
with open(f'/tmp/pin_{sys.argv[1]}.json', 'w') as f:
  json.dump({d: v['prompt_pass'] for d, v in r['scores'].items()}, f)
