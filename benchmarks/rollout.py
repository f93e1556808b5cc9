"""Generated tokens per second: cascade_jax's sampler vs transformers' generate (PyTorch CPU).

Then one MoE layer's decode step with the CPU kernel against XLA's layouts.

  python -m benchmarks.rollout --config=benchmarks/configs/rollout.py
"""

import tempfile
import time

import jax
import numpy as np
from absl import app
from absl import flags
from flax import nnx
from ml_collections import config_flags

from cascade_jax import checkpoint
from cascade_jax import model as model_lib
from cascade_jax import rollout
from cascade_jax import utils
from benchmarks import moe_layers

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'benchmarks/configs/rollout.py', 'Benchmark config.',
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'If set, writes config.json and results.json here.')


def model_config(c) -> model_lib.ModelConfig:
  """The benchmark's Qwen3-MoE-shaped model (exportable to transformers)."""
  return model_lib.ModelConfig(
      vocab_size=c.vocab_size, embed_dim=c.embed_dim, pattern='*E' * c.layers,
      num_heads=4, num_kv_heads=2, head_dim=c.embed_dim // 4, qk_norm=True,
      rope_theta=1e6, moe=model_lib.MoEConfig(
          num_experts=c.num_experts, top_k=c.top_k, expert_dim=c.expert_dim,
          dispatch=c.dispatch))


def main(argv):
  del argv
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  c = _CONFIG.value
  if c.torch_threads:
    torch.set_num_threads(c.torch_threads)
  cfg = model_config(c)
  ours = model_lib.Transformer(cfg, rngs=nnx.Rngs(0))
  path = tempfile.mkdtemp()
  checkpoint.save_hf_qwen3_moe(cfg, ours, path)
  hf = transformers.Qwen3MoeForCausalLM.from_pretrained(path).eval()
  # The weights as the sampler holds them in an RL stage and an evaluation
  # on the CPU: one array per layer (rl.SamplerWeights, model.split_model).
  ours = model_lib.split_model(ours)
  print(f'model: {model_lib.count_params(cfg)}; prompt {c.prompt_len}, '
        f'{c.new_tokens} new tokens, greedy, fp32, jax {jax.__version__}, '
        f'torch {torch.__version__} ({torch.get_num_threads()} threads)')
  rows = []
  rng = np.random.RandomState(0)
  for b in c.batch_sizes:
    prompts = rng.randint(1, c.vocab_size, (b, c.prompt_len))
    # No stop token (-1 never occurs): both generate exactly new_tokens.
    def ours_run(new_tokens):
      sc = rollout.SampleConfig(max_new_tokens=new_tokens, temperature=0.0,
                                prompt_bucket=c.prompt_len)
      return lambda: np.asarray(rollout.generate(
          ours, prompts.tolist(), cfg=sc, stop_ids=-1).tokens)

    def hf_run():
      with torch.no_grad():
        return hf.generate(
            torch.tensor(prompts), max_new_tokens=c.new_tokens,
            min_new_tokens=c.new_tokens, do_sample=False,
            pad_token_id=0)[:, c.prompt_len:].numpy()

    # One new token: the fixed cost (prefill, weight layouts, dispatch); the
    # rest, spread over the other steps, is the cost of a decode step.
    runs = {'ours': ours_run(c.new_tokens), 'fixed': ours_run(1),
            'hf': hf_run}
    outputs = {k: run() for k, run in runs.items()}   # compiles, warms up
    # Interleaved repeats, medians: the machine's speed drifts by 10-30 %
    # over a minute, and each side should see the same drift. Each timed
    # run follows an untimed one of its own: right after the other library
    # (torch's OpenMP threads spin on after a call) or after a pause, the
    # first call ran up to 1.5-2.7x slower (measured for our prefill).
    times = {k: [] for k in runs}
    for _ in range(c.repeats):
      for k, run in runs.items():
        run()
        t0 = time.perf_counter()
        run()
        times[k].append(time.perf_counter() - t0)
    ours_s, fixed_s, hf_s = (float(np.median(times[k])) for k in runs)
    step_ms = (ours_s - fixed_s) / max(c.new_tokens - 1, 1) * 1e3
    ours_tok, hf_tok = outputs['ours'], outputs['hf']
    agree = float(np.mean(ours_tok == hf_tok))
    n = b * c.new_tokens
    rows.append([b, n / ours_s, n / hf_s, hf_s / ours_s, agree,
                 fixed_s * 1e3, step_ms])
  print(utils.format_table(
      ['batch', 'ours tok/s', 'transformers tok/s', 'speed-up',
       'same tokens', 'ours fixed ms', 'ours ms/step'], rows))
  # Where the decode step's MoE time goes: one layer, kernel vs XLA layouts.
  moe = moe_layers.moe_decode_benchmark(
      batch_sizes=c.batch_sizes, embed_dim=c.embed_dim,
      expert_dim=c.expert_dim, num_experts=c.num_experts, top_k=c.top_k,
      activation=cfg.moe.activation, steps=c.new_tokens)
  print('\nMoE layer, one decode step (us): CPU kernel vs XLA decode layouts')
  print(utils.format_table(
      ['batch', 'kernel us', 'XLA us', 'XLA / kernel'],
      [[r['batch'], r['kernel'], r['xla'], r['xla'] / r['kernel']]
       for r in moe]))
  if _WORKDIR.value:
    keys = ['batch', 'ours_tok_s', 'transformers_tok_s', 'speed_up',
            'same_tokens', 'ours_fixed_ms', 'ours_step_ms']
    utils.write_results(_WORKDIR.value, c, dict(
        sampler=[dict(zip(keys, map(float, r))) for r in rows],
        moe_decode_layer_us=moe))


if __name__ == '__main__':
  app.run(main)
