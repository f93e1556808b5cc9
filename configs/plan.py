"""AOT plans: every step of a model compiled for meshes of 8, 32 and 128 chips, from shapes only.

  python -m experiments.plan --config=configs/plan.py:qwen3_30b_a3b
  python -m experiments.plan --config=configs/plan.py:nemotron3_nano_30b_a3b
  python -m experiments.plan --config=configs/plan.py:small      # the test size
  bash scripts/plan.sh --config=configs/plan.py:qwen3_30b_a3b    # TPU v5p topologies

Per step and mesh it prints per-device memory (arguments, outputs,
temporaries), FLOPs and bytes, a roofline step time on TPU v5p and H200,
and whether the step fits (see cascade_jax/aot). With libtpu installed
(scripts/plan.sh makes .venv-tpu) the meshes are TPU v5p topologies,
otherwise fake CPU devices.

The 30B shapes, per device: SFT one packed 8k-token row; RL one rollout
(a 2k prompt + an 8k response: 10,239 scored positions) per device and
update; the sampler 64 rows (Qwen3; the hybrid 8), 2k-token prompts, a
10k-token KV cache. The plan compiles strict (`ops_strict`): a kernel that
would fall back to XLA at these shapes is an error, not a quiet slow step.
"""

import ml_collections

from cascade_jax import model
from cascade_jax import train

# Mesh name -> axes (+ the TPU topology of that many chips). Names are
# Google's slice names, which count TensorCores (two per v5p chip): a v5p-16
# is 8 chips, a v5p-64 32 chips, a v5p-256 128 chips.
MESHES_30B = {
    'v5p-16': dict(fsdp=8, topology='v5p:2x2x2'),
    'v5p-64': dict(fsdp=4, expert=8, topology='v5p:2x4x4'),
    'v5p-256': dict(fsdp=8, expert=16, topology='v5p:4x4x8'),
}

# The recipe's RL shapes: a prompt of up to 2k tokens and a response of up
# to 8k; the learner scores prompt + response - 1 = 10,239 positions (not a
# multiple of any kernel block: the kernels pad, strict mode checks it).
RL_SEQ_30B = 2048 + 8192 - 1


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.update(train.placement_defaults())
  del c['mesh']                     # the plan's meshes are `meshes`
  c.platform = 'auto'               # 'auto' (TPU if libtpu), 'tpu', 'cpu'
  c.steps = 'sft,grpo,mopd,prefill,decode,feed,sync'
  # The sampler's weights (prefill, decode; `sync` makes them from the
  # learner's): '' the model's own param dtype, or the RL stage's
  # rl.sampler_dtype ('bfloat16' at scale: half the bytes a decode step reads).
  c.sampler_dtype = ''
  # ... in rl.sampler_layout: 'inference' (no FSDP on weights, experts over
  # the FSDP and expert axes, decode's MoE by the ragged exchange) or 'train'.
  c.sampler_layout = 'inference'
  # ... laid out in memory as rl.sampler_weight_layout: 'auto' ('decode' on
  # TPU: the attention's input projections with the embed axis minor, as
  # the weight sync writes them and the decode step's matmuls read them),
  # 'decode' or 'default' (the learner's layout).
  c.sampler_weight_layout = 'auto'
  c.ops_strict = True
  # Adam's moments in training steps: 'float32' (8 bytes a parameter) or
  # 'bfloat16' (4; train.OptimConfig.moment_dtype).
  c.moment_dtype = 'float32'
  # XLA options for the TPU compiles (not the CPU fallback's), e.g.
  # dict(xla_tpu_scoped_vmem_limit_kib=65536) as MaxText raises it.
  c.tpu_compiler_options = ml_collections.ConfigDict()
  c.only = ''                       # mesh names to compile ('': all)
  # Meshes whose FLOPs / bytes are measured at full depth ('': all): two
  # more compiles of each step (aot.depth_cost); elsewhere they are NaN.
  c.cost_meshes = ''
  arg = arg or 'qwen3_30b_a3b'
  if arg == 'qwen3_30b_a3b':
    # bf16 compute over fp32 master weights (Adam's moments fp32 too).
    c.model = ml_collections.ConfigDict(dict(
        preset='qwen3_30b_a3b', overrides=ml_collections.ConfigDict(dict(
            param_dtype='float32', dtype='bfloat16',
            # The expert-parallel receive buffer, x the mean load (0: the
            # worst case, ep x tokens x top-k rows, as before 2026-12-02).
            moe=dict(ragged_buffer_factor=2.0)))))
    c.memory.update(dict(remat='full', scan_layers=True, logits_chunk=1024))
    c.meshes = ml_collections.ConfigDict(MESHES_30B)
    c.sampler_dtype = 'bfloat16'      # the sampler reads a bf16 copy
    # Per device the shapes are the same on every mesh: one mesh's costs
    # (each a third of the plan's compile time) stand for the others'.
    c.cost_meshes = 'v5p-64'
    c.shapes = ml_collections.ConfigDict(dict(
        sft_rows=1, sft_seq=8192, rl_rows=1, rl_seq=RL_SEQ_30B,
        # The sampler's rows a chip: 64, the recipe's 2,048 rollouts on
        # v5p-64 in one round (decode 69.6 GB, prefill in 16-row chunks
        # 79.0; a modeled step of 344 s against 387 at 32 rows:
        # docs/results/plan/rows64_2026-12-07). 32 from 2026-12-06 (8
        # before; docs/results/archive/plan_rollout_rows_2026-12-06), when 64
        # rows' one prefill of every row left 5.8 GB of a v5p free.
        # rl.sample_slots=2048 rl.prefill_rows=512 on v5p-64.
        rl_micro_batches=1, rollout_rows=64, prompt_len=2048,
        cache_len=RL_SEQ_30B + 1,
        # Continuous batching's prefill (rl.prefill_rows), rows a chip: at
        # 32 rows the first fill in chunks of 16 peaks at 46.8 GB, all at
        # once at 60.1 (the decode: 37.3;
        # docs/results/archive/plan_prefill_rows_2026-12-07). 0: all at once.
        prefill_rows=16,
        # The decode step's write index: 1, one a row (continuous batching,
        # rl.sample_slots, and episode slots: what the pod advice above
        # runs; 90.3 GB moved, 32.7 ms on the v5p roofline against 95.8 GB
        # and 34.7 ms with one); 0, one for the batch (a fixed batch)
        # (docs/results/plan/row_index_2026-12-07).
        row_index=1))
  elif arg == 'qwen3_30b_a3b_micro':
    # The GRPO update over more rollouts per device than fit at once, in
    # micro-batches (one optimizer step, gradients accumulated): rollouts
    # per device x micro-batches, on v5p-16 and v5p-64 (README: the table).
    c.update(get_config('qwen3_30b_a3b'))
    c.steps, c.only, c.cost_meshes = 'grpo', 'v5p-16,v5p-64', 'none'
    c.variants = ml_collections.ConfigDict({
        f'{rows}x{k}': dict(rl_rows=rows, rl_micro_batches=k)
        for rows, k in ((1, 1), (4, 1), (4, 4), (16, 1), (16, 4), (16, 16))})
  elif arg == 'qwen3_30b_a3b_recipe_batch':
    # The GRPO update at the recipe's batch: 128 prompts x 16 rollouts =
    # 2,048 rollouts of 10,239 scored positions per step, one optimizer
    # step, each device's share in micro-batches of one rollout.
    c.update(get_config('qwen3_30b_a3b'))
    c.steps, c.cost_meshes = 'grpo', 'none'
    c.shapes.update(dict(rl_batch=0, rl_rows_per_micro=1))
    c.variants = ml_collections.ConfigDict({
        '2048 rollouts': dict(rl_batch=2048, rl_rows_per_micro=1)})
  elif arg == 'qwen3_30b_a3b_rollout_rows':
    # The sampler's rows a chip: the recipe's 2,048 rollouts a step on
    # v5p-64 are 64 a chip in one fixed batch (rl.sample_slots=0), 8 a chip
    # in 8 rounds; each row holds its own 10k-token KV cache (~1 GB bf16).
    # Prefill and decode (and the sync, for the pod model) at each: their
    # memory and bytes
    # (docs/results/archive/plan_rollout_rows_2026-12-06).
    c.update(get_config('qwen3_30b_a3b'))
    c.steps, c.only = 'prefill,decode,sync', 'v5p-64'
    # (One write index, as these were compiled before row_index.)
    c.variants = ml_collections.ConfigDict({
        f'{r} rows': dict(rollout_rows=r, row_index=0)
        for r in (8, 16, 32, 64)})
  elif arg == 'qwen3_30b_a3b_prefill_rows':
    # Continuous batching's first fill in chunks (rl.prefill_rows): the
    # prefill of 4, 8 or 16 rows a chip into the 32-row cache, and of 8 into
    # a 64-row one (the code's fixed batch there), against the whole 32-row
    # prefill (docs/results/archive/plan_prefill_rows_2026-12-07).
    c.update(get_config('qwen3_30b_a3b'))
    c.steps, c.only = 'prefill', 'v5p-64'
    c.variants = ml_collections.ConfigDict({
        f'{r} rows, prefill {k}': dict(rollout_rows=r, prefill_rows=k)
        for r, k in ((32, 4), (32, 8), (32, 16), (64, 8))})
  elif arg == 'qwen3_30b_a3b_rows64':
    # 64 sampler rows a chip (the recipe's 2,048 rollouts in one round on
    # v5p-64) with the first fill in 16-row chunks: the 64-row decode step
    # (first compiled here: 13 GB of host memory alone), the chunked
    # prefill and the sync (the pod model's rows)
    # (docs/results/plan/rows64_2026-12-07).
    c.update(get_config('qwen3_30b_a3b'))
    c.steps, c.only = 'prefill,decode,sync', 'v5p-64'
    c.variants = ml_collections.ConfigDict({   # one write index (as run)
        '64 rows': dict(rollout_rows=64, prefill_rows=16, row_index=0)})
  elif arg == 'qwen3_30b_a3b_feed':
    # Episode slots' in-place observation feed (rl.episode_slots) at the
    # plan's 64 rows a chip: every row's 16-token block through the model
    # into the 64-row, 10k-token cache, donated
    # (docs/results/plan/feed_2026-12-07).
    c.update(get_config('qwen3_30b_a3b'))
    c.steps, c.only = 'feed', 'v5p-64'
    c.variants = ml_collections.ConfigDict({
        '64 rows': dict(rollout_rows=64, prefill_rows=16)})
  elif arg == 'qwen3_30b_a3b_row_index':
    # The 64-row decode with an index a row (continuous batching's and
    # episode slots' decode), and the sync for the pod model
    # (docs/results/plan/row_index_2026-12-07; the one-index decode:
    # docs/results/plan/rows64_2026-12-07).
    c.update(get_config('qwen3_30b_a3b'))
    c.steps, c.only = 'decode,sync', 'v5p-64'
    c.variants = ml_collections.ConfigDict({
        '64 rows, an index a row': dict(rollout_rows=64, prefill_rows=16,
                                        row_index=1)})
  elif arg == 'qwen3_30b_a3b_fsdp_expert':
    # The non-expert weights (attention, norms, embeddings) sharded over the
    # expert axis too, not replicated across it: `embed` -> fsdp x expert
    # (an expert weight keeps expert for its expert axis, fsdp for embed).
    c.update(get_config('qwen3_30b_a3b'))
    c.steps, c.only, c.cost_meshes = 'sft,grpo', 'v5p-64,v5p-256', 'none'
    c.rules.embed = 'fsdp,expert'
  elif arg == 'nemotron3_nano_30b_a3b':
    # The paper's base model: 23 Mamba-2, 23 MoE, 6 attention layers. Its
    # first 35 layers are 5 x MEMEM*E (scanned over their stacked weights),
    # the other 17 run unrolled (ModelConfig.layer_groups).
    c.model = ml_collections.ConfigDict(dict(
        preset='nemotron3_nano_30b_a3b',
        overrides=ml_collections.ConfigDict(dict(
            param_dtype='float32', dtype='bfloat16',
            # The preset's 52 layers; a shorter one (the same unit, fewer
            # repeats, with or without the unrolled tail) splits what the
            # compiled step's memory grows with:
            # --config.model.overrides.pattern=MEMEM*EMEMEM*E
            pattern=model.NEMOTRON3_NANO_PATTERN,
            # The expert-parallel receive buffer, x the mean load (the
            # default, as Qwen3's: docs/results/archive/plan_nemotron_depth_2026-12-04).
            moe=dict(ragged_buffer_factor=2.0)))))
    c.memory.update(dict(remat='full', scan_layers=True, logits_chunk=1024))
    c.meshes = ml_collections.ConfigDict(MESHES_30B)
    c.sampler_dtype = 'bfloat16'      # the sampler reads a bf16 copy
    c.shapes = ml_collections.ConfigDict(dict(
        sft_rows=1, sft_seq=8192, rl_rows=1, rl_seq=RL_SEQ_30B,
        rl_micro_batches=1, rollout_rows=8, prompt_len=2048,
        cache_len=RL_SEQ_30B + 1))
    # Its prefill needed 16.25 MB of scoped VMEM against the 16 MB default
    # (2026-12-01); MaxText's MoE runs raise the limit so.
    c.tpu_compiler_options = ml_collections.ConfigDict(dict(
        xla_tpu_scoped_vmem_limit_kib=65536))
  elif arg == 'nemotron3_nano_30b_a3b_ep':
    # Nemotron-3-Nano's SFT and GRPO on 8 chips with the experts split over
    # them (expert 8, each chip 16 whole experts) instead of FSDP: no
    # expert weight is ever all-gathered (on fsdp 8 each MoE layer gathers
    # 1.28B expert parameters); the non-expert weights are sharded over the
    # same axis (`embed` -> fsdp x expert), so nothing is replicated.
    c.update(get_config('nemotron3_nano_30b_a3b'))
    c.steps, c.cost_meshes = 'sft,grpo', 'none'
    c.meshes = ml_collections.ConfigDict({
        'v5p-16': dict(fsdp=1, expert=8, topology='v5p:2x2x2')})
    c.rules.embed = 'fsdp,expert'
    # What fits 8 v5p chips (docs/results/plan/nemotron_v5p16_bf16_moments_2026-12-04):
    # Adam's moments in bf16 (state 47.4 -> 31.6 GB a chip), the receive
    # buffer at 1.25 x the mean load, the output head 512 positions at a
    # time. SFT peaks at 88.4 GB; GRPO at 94.9 GB, 0.1 GB under 95.
    c.moment_dtype = 'bfloat16'
    c.model.overrides.moe.ragged_buffer_factor = 1.25
    c.memory.logits_chunk = 512
  elif arg == 'small_hybrid':
    # The hybrid main job's model on 8 fake devices (the test size).
    c.platform = 'cpu'
    c.model = ml_collections.ConfigDict(dict(
        preset='small_hybrid', overrides=ml_collections.ConfigDict(dict(
            vocab_size=1024, pattern='ME*E' * 2))))
    c.memory.update(dict(remat='full', scan_layers=True, logits_chunk=32))
    c.meshes = ml_collections.ConfigDict({
        'fsdp2_tensor2_expert2': dict(fsdp=2, tensor=2, expert=2)})
    c.shapes = ml_collections.ConfigDict(dict(
        sft_rows=1, sft_seq=128, rl_rows=1, rl_seq=64, rl_micro_batches=1,
        rollout_rows=2,
        prompt_len=32, cache_len=64))
  elif arg == 'small':
    # The main job's model on 8 fake devices, two meshes (the test size).
    c.platform = 'cpu'
    c.model = ml_collections.ConfigDict(dict(
        preset='small', overrides=ml_collections.ConfigDict(dict(
            vocab_size=1024, pattern='*E*E'))))
    c.memory.update(dict(remat='full', scan_layers=True, logits_chunk=32))
    c.meshes = ml_collections.ConfigDict({
        'data2_expert4': dict(data=2, expert=4),
        'fsdp2_tensor2_expert2': dict(fsdp=2, tensor=2, expert=2)})
    c.shapes = ml_collections.ConfigDict(dict(
        sft_rows=1, sft_seq=128, rl_rows=1, rl_seq=64, rl_micro_batches=1,
        rollout_rows=2,
        prompt_len=32, cache_len=64))
  else:
    raise ValueError(f'configs/plan.py: unknown argument {arg!r} (known: '
                     'qwen3_30b_a3b, qwen3_30b_a3b_micro, '
                     'qwen3_30b_a3b_rollout_rows, qwen3_30b_a3b_prefill_rows, '
                     'qwen3_30b_a3b_rows64, qwen3_30b_a3b_feed, '
                     'qwen3_30b_a3b_row_index, '
                     'qwen3_30b_a3b_recipe_batch, qwen3_30b_a3b_fsdp_expert, '
                     'nemotron3_nano_30b_a3b, nemotron3_nano_30b_a3b_ep, '
                     'small, small_hybrid)')
  return c
