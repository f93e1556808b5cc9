# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Exploring the MoE model
#
# Routing, expert load, the aux-loss-free balancing bias, and expert-parallel
# sharding on 8 fake CPU devices. Runs top to bottom on a CPU in about a minute.

# %%
import os

# Eight fake CPU devices for the sharding section (must precede importing jax).
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx

from cascade_jax import model, sharding

print(jax.devices())

# %% [markdown]
# ## A small MoE and what its router does
# `info['router']['load']` is the share of tokens each expert receives, per
# MoE layer; `info['expert_idx']` the experts each token chose.

# %%
cfg = model.small(vocab_size=256)   # sigmoid router + correction bias
print(cfg.moe)
print(model.count_params(cfg))
lm = model.Transformer(cfg, rngs=nnx.Rngs(0))
tokens = jax.random.randint(jax.random.key(0), (8, 64), 0, cfg.vocab_size)
logits, info = lm(tokens)
load = np.asarray(info['router']['load'])
print('expert_idx', info['expert_idx'].shape, '(batch, seq, MoE layers, top-k)')

fig, axes = plt.subplots(1, len(load), figsize=(8, 2.5), sharey=True)
for i, (ax, l) in enumerate(zip(axes, load)):
  ax.bar(range(len(l)), l)
  ax.axhline(1 / len(l), color='gray', linestyle='--')
  ax.set(title=f'MoE layer {i}', xlabel='expert')
axes[0].set_ylabel('share of tokens')
plt.tight_layout()
plt.show()

# %% [markdown]
# ## The load-balancing bias
# The correction bias is added to the router scores only when choosing the
# top-k experts (never to the gate weights) and lives outside the optimizer.
# Push expert 0's bias up and it wins many more tokens; then the
# aux-loss-free update (DeepSeek-V3: raise the bias of under-loaded experts,
# lower it for over-loaded ones) brings the load back towards uniform.

# %%
moe0 = lm.moe_layers()[0]
moe0.expert_bias[...] = moe0.expert_bias[...].at[0].set(0.3)
spread = []
for step in range(60):
  _, info = lm(tokens)
  l = np.asarray(info['router']['load'])
  spread.append(l[0].max() - l[0].min())
  lm.update_expert_biases(info['router']['load'], rate=0.01)

plt.figure(figsize=(5, 3))
plt.plot(spread)
plt.axhline(load[0].max() - load[0].min(), color='gray', linestyle='--',
            label='before the push')
plt.xlabel('bias updates')
plt.ylabel('max - min expert load (layer 0)')
plt.title('The correction bias flattens the load')
plt.legend()
plt.show()
print('bias of layer 0:', np.round(np.asarray(moe0.expert_bias[...]), 3))
assert spread[-1] < 0.5 * spread[0]

# %% [markdown]
# ## Expert parallelism on 8 devices
# A mesh with `data` 2 x `expert` 4: each device holds a quarter of the
# experts, and the MoE layer runs inside `shard_map`, moving tokens to their
# experts. The sharded model computes the same logits.

# %%
cfg_cap = model.tiny(pattern='*E*E', vocab_size=256)
ref = model.Transformer(cfg_cap, rngs=nnx.Rngs(1))
ref_logits, _ = ref(tokens)
ctx = sharding.ShardingCtx(sharding.make_mesh({'data': 2, 'expert': 4}))
lm_sharded = sharding.shard_model(
    model.Transformer(cfg_cap, rngs=nnx.Rngs(1), ctx=ctx), ctx)
w = lm_sharded.moe_layers()[0].w_gate_edf[...]
print('expert weights', w.shape, w.sharding.spec)
jax.debug.visualize_array_sharding(w[:, :, 0])
out, _ = jax.jit(lambda m, t: m(t))(lm_sharded, tokens)
print('max |sharded - single device| =',
      float(jnp.max(jnp.abs(out - ref_logits))))
assert jnp.allclose(out, ref_logits, atol=1e-4)
