"""Math pass@1 of SFT runs (T=1 over 2 samples, and greedy) on 256 eval prompts of levels 1-3.

  PYTHONPATH=. python docs/results/claims/2026-12-02/math_levels/probe_levels.py out.json RUN [RUN ...]
"""
import json
import sys

from cascade_jax import domains
from cascade_jax import rollout
from cascade_jax import train

out = {}
for run in sys.argv[2:]:
  _, model, tok = train.restore_run(run)
  recs = domains.generate('math', split='eval', n=256, seed=0,
                          levels=(1, 2, 3), split_by='prompt')
  s = rollout.evaluate_model(model, tok, {'math': recs}, temperature=1.0,
                             samples=2)['math']
  g = rollout.evaluate_model(model, tok, {'math': recs})['math']
  out[run] = dict(pass_at_1_t1=s.pass_rate, se=s.pass_se,
                  greedy=g.pass_rate, n_prompts=len(recs))
  print(run, out[run])
with open(sys.argv[1], 'w') as f:
  json.dump(out, f, indent=2)
