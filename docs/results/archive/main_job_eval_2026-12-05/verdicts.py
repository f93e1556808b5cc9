"""Code and SWE eval verdicts of a stage: distinct programs, syntax errors, the sandbox's seconds (verdict cache cleared)."""
import time, ast
import jax
from absl import app, flags
from ml_collections import config_flags
from cascade_jax import cascade, train, domains
from cascade_jax.rollout import _evaluate as ev
from cascade_jax.rollout._sampler import SampleConfig
from cascade_jax.domains import _base, code
_CFG = config_flags.DEFINE_config_file('config')
flags.DEFINE_string('run', None, ''); flags.DEFINE_string('stage', 'sft', '')
FLAGS = flags.FLAGS
def main(_):
  config = _CFG.value
  evals = cascade.eval_sets(config)
  _, model, tok = train.restore_run(cascade.stage_dir(FLAGS.run, FLAGS.stage))
  for name in ('code', 'swe'):
    recs = list(evals[name]) * 2
    cfg = SampleConfig(max_new_tokens=ev.max_new_tokens_for(tok, evals[name]), temperature=1.0)
    resp = ev.responses_for(model, tok, recs, cfg=cfg, key=jax.random.key(0))
    progs = [_base.extract_code(r) for r in resp]
    syn = 0
    for p in progs:
      try: ast.parse(p)
      except Exception: syn += 1
    code._VERDICTS.clear()
    t0 = time.perf_counter()
    scores = domains.evaluate(recs, resp)
    dt = time.perf_counter() - t0
    print(name, 'rows', len(recs), 'distinct', len(set(zip([r.get('id') for r in recs], progs))), 'syntax errors', syn, f'{dt:.2f}s')
    print(name, {d: round(v.pass_rate, 3) for d, v in scores.items()})
if __name__ == '__main__':
  app.run(main)
