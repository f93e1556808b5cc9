# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The recipe step by step
#
# GRPO and MOPD losses on a toy, a short RL stage, and reading a cascade
# report. Runs top to bottom on a CPU in a couple of minutes.

# %%
import json
import os
import sys
import tempfile

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# The repository root (for `configs`), whether run from colabs/ or the root.
ROOT = os.path.abspath('..' if os.path.basename(os.getcwd()) == 'colabs'
                       else '.')
sys.path.insert(0, ROOT)

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from cascade_jax import cascade, losses, report, utils
from configs import cascade as cascade_config

# %% [markdown]
# ## Group advantages and the GRPO loss
# Two prompts, four rollouts each: advantages are z-scores within a group.
# At ratio 1 (strictly on-policy) the loss is the token-normalised REINFORCE
# objective.

# %%
rewards = jnp.array([1., 0., 0., 1., 0., 0., 0., 1.])
adv = losses.group_advantages(rewards, group_size=4)
print('advantages', np.round(np.asarray(adv), 3))
logp = jnp.log(jnp.full((8, 5), 0.5))
mask = jnp.ones((8, 5), jnp.int32)
loss, m = losses.grpo_loss(logp, adv, mask)
print('loss', float(loss), {k: float(v) for k, v in m.items()})

# %% [markdown]
# ## MOPD on a categorical toy
# A student policy over 6 tokens learns from a teacher through the MOPD loss
# on its own samples: the per-token advantage is log pi_teacher - log
# pi_student. The reverse KL to the teacher falls towards zero.

# %%
teacher = jax.nn.log_softmax(jnp.array([2., 1., 0., -1., 0.5, -2.]))
student = jnp.zeros(6)
key = jax.random.key(0)


def loss_fn(theta, toks, sampler_logp):
  lp = jax.nn.log_softmax(theta)[toks][:, None]
  return losses.mopd_loss(lp, teacher[toks][:, None], sampler_logp,
                          jnp.ones_like(lp, jnp.int32))[0]


kls = []
for step in range(150):
  key, sub = jax.random.split(key)
  lp_all = jax.nn.log_softmax(student)
  toks = jax.random.categorical(sub, lp_all, shape=(64,))
  g = jax.grad(loss_fn)(student, toks, lp_all[toks][:, None])
  student = student - 0.5 * g
  p = jax.nn.softmax(student)
  kls.append(float(jnp.sum(p * (jnp.log(p) - teacher))))
plt.figure(figsize=(5, 3))
plt.plot(kls)
plt.xlabel('step')
plt.ylabel('KL(student || teacher)')
plt.title('MOPD drives the reverse KL down')
plt.show()
assert kls[-1] < 0.1 * kls[0]

# %% [markdown]
# ## A short cascade: SFT then one RL stage
# The `quick` cascade at its smallest: SFT from scratch, then IF-RL from the
# SFT checkpoint. Stages are config data; `order` picks them. XLA's
# persistent compilation cache (~/.cache/cascade_jax/xla, as the launchers
# use; CASCADE_JAX_XLA_CACHE moves it) lets a second run of this cell load
# its programs instead of compiling them.

# %%
utils.enable_compilation_cache()
workdir = tempfile.mkdtemp()
c = cascade_config.get_config('quick')
c.order = 'sft,if_rl'
records = cascade.run(c, workdir)

# %% [markdown]
# ## Reading the report
# The report is JSON for machines and Markdown + PNG for people. The matrix
# holds each stage's pass rate on every domain (`metric` says how it was
# measured: pass@1 at the sampling temperature by default); `deltas` what
# each stage changed against the stage it started from.

# %%
out = report.cascade_report(workdir, records)
print(out['table'])
data = json.load(open(out['json']))
print(data['metric'], '| own-domain change per RL stage:',
      data['own_domain_change'])
img = plt.imread(os.path.join(workdir, 'report', 'matrix.png'))
plt.figure(figsize=(8, 3))
plt.imshow(img)
plt.axis('off')
plt.show()
