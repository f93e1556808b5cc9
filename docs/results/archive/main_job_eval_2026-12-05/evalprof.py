"""Per-domain time of a stage's evaluation: generation, scoring, episodes (run twice: compile, then warm)."""
import time
import jax
from absl import app, flags
from ml_collections import config_flags
from cascade_jax import cascade, train, domains
from cascade_jax.rollout import _evaluate as ev
from cascade_jax.rollout._sampler import SampleConfig

_CFG = config_flags.DEFINE_config_file('config')
flags.DEFINE_string('run', None, '')
flags.DEFINE_string('stage', 'sft', '')
flags.DEFINE_integer('repeat', 2, '')
FLAGS = flags.FLAGS

def main(_):
  config = _CFG.value
  evals = cascade.eval_sets(config)
  _, model, tok = train.restore_run(cascade.stage_dir(FLAGS.run, FLAGS.stage))
  for rep in range(FLAGS.repeat):
    tot = 0
    for name in sorted(evals, key=lambda d: (not ev._needs_sandbox(d), d)):
      recs = list(evals[name]) * config.eval_samples
      key = jax.random.key(rep)
      t0 = time.perf_counter()
      if ev._is_multi_turn(name):
        ev.episode_scores(model, tok, recs, temperature=config.eval_temperature, key=key,
                               episodes=ev.episode_config(name, config.episodes.to_dict()))
        gen = time.perf_counter() - t0; score = 0.0
      else:
        cfg = SampleConfig(max_new_tokens=ev.max_new_tokens_for(tok, evals[name]), temperature=config.eval_temperature)
        resp = ev.responses_for(model, tok, recs, cfg=cfg, key=key)
        gen = time.perf_counter() - t0; t1 = time.perf_counter()
        domains.evaluate(recs, resp)
        score = time.perf_counter() - t1
      tot += gen + score
      print(f'rep {rep} {name:24s} rows {len(recs):4d} gen {gen:6.2f}s score {score:6.2f}s', flush=True)
    print(f'rep {rep} total {tot:.1f}s', flush=True)

if __name__ == '__main__':
  app.run(main)
