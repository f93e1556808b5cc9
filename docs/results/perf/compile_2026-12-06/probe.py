"""Compile seconds and a bitwise fingerprint of the main job's model through
one SFT step, one RL collect (sampler) and one learner step."""
import hashlib, sys, time, os
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
import jax, numpy as np
from flax import nnx
sys.path.insert(0, os.getcwd())
from cascade_jax import data, model, rl, train

comp = [0.0]
def _dur(ev, s, **kw):
  if ev == '/jax/core/compile/backend_compile_duration':
    comp[0] += s
jax.monitoring.register_event_duration_secs_listener(_dur)

t0 = time.time()
tok = data.train_tokenizer(['aaa bbb ccc', 'abc cab bca', 'write letters',
                            'a b c d e'] * 20, 160)
recs = [dict(id=str(i), domain='toy',
             messages=[{'role': 'user', 'content': 'write letters'}])
        for i in range(8)]
cfg = model.small(vocab_size=tok.vocab_size)
if os.environ.get("SCAN"): import dataclasses; cfg = dataclasses.replace(cfg, scan_layers=True)
m = model.Transformer(cfg, rngs=nnx.Rngs(0))
m.set_expert_biases(np.stack([np.random.RandomState(i).uniform(-0.1, 0.1, 8)
                              for i in range(m.cfg.pattern.count('E'))]))
opt = train.make_optimizer(train.OptimConfig(lr=1e-3, warmup_steps=1,
                                             schedule='constant', weight_decay=0.0))
graph, state = train.init_state(m, opt)
c = rl.RLConfig(prompts_per_step=8, rollouts_per_prompt=8, max_new_tokens=16,
                dynamic_filtering=False, overlong='none')
batch, _ = rl.collect(nnx.merge(graph, state.params, state.rest), tok,
                      rl.PromptStream(recs), c, jax.random.key(0),
                      reward_fn=lambda r, _: np.arange(len(r)) % 2)
learner = rl.Learner(graph, opt, c)
state, met = learner.step(state, batch)
h = hashlib.sha256()
for a in [batch.inputs, batch.sampler_logp] + jax.tree.leaves(state.params):
  h.update(np.asarray(a).tobytes())
print(f'fingerprint {h.hexdigest()[:16]} compile {comp[0]:.1f} s total {time.time()-t0:.1f} s mismatch {float(met["sampler_mismatch_max"]):.2e}')
