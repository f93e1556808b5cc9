"""The main job with JAX's compile events totalled into /tmp/prof_out.json (run 1 and 2).

  python docs/results/archive/main_job_compiles_2026-12-04/prof_main.py \
      --config=configs/cascade.py --workdir=/tmp/mj_base
"""

import atexit
import collections
import json
import sys
import time

from absl import app
from jax import monitoring

from experiments import cascade

_TOTAL = collections.Counter()
_COUNT = collections.Counter()
_T0 = time.time()


def _event(name, duration, **_):
  _TOTAL[name] += duration
  _COUNT[name] += 1


def _dump():
  out = {k: [_COUNT[k], round(_TOTAL[k], 1)] for k in _TOTAL}
  out['wall'] = round(time.time() - _T0, 1)
  with open('/tmp/prof_out.json', 'w') as f:
    json.dump(out, f, indent=1)


if __name__ == '__main__':
  monitoring.register_event_duration_secs_listener(_event)
  atexit.register(_dump)
  sys.argv[0] = 'cascade'
  app.run(cascade.main)
