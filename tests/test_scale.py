"""The scale path: one stage set-up, the cascade on meshes and on two processes, the AOT plan."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from cascade_jax import aot
from cascade_jax import checkpoint
from cascade_jax import model
from cascade_jax import rollout
from cascade_jax import sharding
from cascade_jax import train
from cascade_jax import utils

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
# The tests' own helpers, also when a subprocess runs this file with runpy.
sys.path.insert(0, os.path.join(_ROOT, 'tests'))
from configs import cascade as cascade_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import plan as plan_config  # pylint: disable=g-import-not-at-top,wrong-import-position
import _run_helpers  # pylint: disable=g-import-not-at-top,wrong-import-position

MESHES = {'data2_expert4': dict(data=2, expert=4),
          'fsdp2_tensor2_expert2': dict(fsdp=2, tensor=2, expert=2)}


# ----------------------------------------------------------------- set-up


def test_placement_config_errors_name_their_cause():
  c = ml_collections.ConfigDict(train.placement_defaults())
  c.memory.unknown = 1
  with pytest.raises(ValueError, match=r"memory: unknown keys \['unknown'\]"):
    train.memory_overrides(c)
  with pytest.raises(ValueError, match="unknown logical axes"):
    sharding.rules_from_config({'embedding': 'fsdp'})
  with pytest.raises(ValueError, match="unknown mesh axis"):
    sharding.rules_from_config({'embed': 'fsdq'})
  rules = dict(sharding.rules_from_config({'embed': '', 'exp': 'expert,fsdp'}))
  assert rules['embed'] is None and rules['exp'] == ('expert', 'fsdp')
  assert rules['batch'] == ('data', 'fsdp', 'expert')
  c = ml_collections.ConfigDict(dict(train.placement_defaults()))
  c.mesh.data, c.mesh.expert = 3, 4
  with pytest.raises(ValueError, match='need 12 devices, but 8'):
    train.mesh_ctx(c)


@pytest.mark.slow
def test_setup_places_batches_and_records_the_model(tmp_path):
  c = ml_collections.ConfigDict(train.placement_defaults())
  c.mesh.data, c.mesh.expert = 2, 4
  c.memory.remat, c.memory.compute_dtype = 'full', 'bfloat16'
  setup = train.Setup.create(c, str(tmp_path), name='x')
  spec = dict(preset='tiny', overrides={'pattern': '*E*E'})
  cfg, m = setup.new_model(spec, seed=0)
  assert (cfg.remat, cfg.dtype, cfg.param_dtype) == ('full', 'bfloat16',
                                                     'float32')
  assert json.load(open(tmp_path / 'model.json')) == spec
  assert json.load(open(tmp_path / 'config.json'))['mesh']['expert'] == 4
  b = setup.put({'inputs': np.zeros((8, 5), np.int32),
                 'expert_idx': np.zeros((8, 5, 2, 2), np.int32)})
  assert b['inputs'].sharding.spec == jax.sharding.PartitionSpec(
      ('data', 'expert'), None)
  # Routing is batch-major like every other array of a batch.
  assert b['expert_idx'].sharding.spec[0] == ('data', 'expert')
  with pytest.raises(ValueError, match="6 rows, not a multiple of the 8"):
    setup.put({'inputs': np.zeros((6, 5), np.int32)})
  setup.close()


def test_a_run_is_restored_straight_into_the_stages_shardings(tmp_path):
  # A saved run (model.json, tokenizer, checkpoint), restored on a mesh:
  # every weight arrives with the rules' sharding, equal to what was saved.
  from cascade_jax import data  # pylint: disable=g-import-outside-toplevel
  tok = data.train_tokenizer(['aaa bbb ccc', 'abc cab bca', 'write letters',
                              'a b c d e'] * 20, 160)
  spec = dict(preset='tiny', overrides={'vocab_size': tok.vocab_size,
                                        'pattern': '*E*E'})
  cfg = train.model_config(spec['preset'], spec['overrides'])
  m = model.Transformer(cfg, rngs=nnx.Rngs(3))
  graph, state = train.init_state(m, train.make_optimizer(train.OptimConfig()))
  os.makedirs(tmp_path / 'run')
  tok.save(str(tmp_path / 'run' / 'tokenizer.model'))
  json.dump({}, open(tmp_path / 'run' / 'config.json', 'w'))
  json.dump(spec, open(tmp_path / 'run' / 'model.json', 'w'))
  ck = checkpoint.Checkpointer(str(tmp_path / 'run' / 'checkpoints'))
  ck.save(1, state.to_checkpoint())
  ck.close()
  ctx = sharding.ShardingCtx(sharding.make_mesh(dict(fsdp=2, expert=4)))
  _, restored, _ = train.restore_run(str(tmp_path / 'run'), ctx=ctx,
                                     memory={'scan_layers': True})
  assert restored.cfg.scan_layers
  want = sharding.state_shardings(ctx, nnx.state(restored))
  for (path, got), w in zip(
      jax.tree_util.tree_leaves_with_path(nnx.state(restored)),
      jax.tree.leaves(want)):
    assert got.sharding.is_equivalent_to(w, got.ndim), path
  for a, b in zip(jax.tree.leaves(nnx.state(restored, nnx.Param)),
                  jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_distributed_launch_modes(monkeypatch):
  for k in ('SLURM_JOB_ID', 'SLURM_NTASKS', 'SLURM_NPROCS',
            'TPU_WORKER_HOSTNAMES', 'MEGASCALE_COORDINATOR_ADDRESS'):
    monkeypatch.delenv(k, raising=False)
  assert utils.cluster_environment() == ''
  assert utils.initialize_distributed('auto') == ''     # one process
  assert utils.initialize_distributed('off', coordinator_address='x:1') == ''
  with pytest.raises(ValueError, match='no SLURM job or TPU pod'):
    utils.initialize_distributed('on')
  with pytest.raises(ValueError, match='needs --num_processes'):
    utils.initialize_distributed('auto', coordinator_address='127.0.0.1:1')
  with pytest.raises(ValueError, match=r'process_id 2 not in \[0, 2\)'):
    utils.initialize_distributed('auto', coordinator_address='127.0.0.1:1',
                                 num_processes=2, process_id=2)
  monkeypatch.setenv('SLURM_JOB_ID', '7')
  monkeypatch.setenv('SLURM_NTASKS', '4')
  assert utils.cluster_environment() == 'slurm'
  monkeypatch.setenv('SLURM_NTASKS', '1')
  assert utils.cluster_environment() == ''
  monkeypatch.setenv('TPU_WORKER_HOSTNAMES', 'w0,w1,w2,w3')
  assert utils.cluster_environment() == 'tpu_pod'


# ---------------------------------------------------------------- AOT plan


@pytest.mark.slow
@pytest.mark.xdist_group('heavy')
def test_plan_on_a_small_preset_reports_consistent_bytes():
  c = plan_config.get_config('small')
  c.only, c.steps = 'fsdp2_tensor2_expert2', 'sft,decode'
  costs = aot.run(c, progress=lambda s: None)
  assert [x.step for x in costs] == ['sft', 'decode']
  sft, decode = costs
  assert sft.platform == 'cpu (fake devices)' and sft.devices == 8
  # The compiled step's arguments are the state the shapes and shardings
  # say one device holds, plus its share of the batch (5 int32 [1, 128]).
  batch = 5 * 128 * 4
  assert sft.argument_bytes == pytest.approx(sft.state_bytes + batch,
                                             rel=0.01)
  # fsdp 2 x tensor 2 x expert 2 shards the weights: a device holds less
  # than a third of params + Adam (12 bytes per parameter).
  n = model.count_params(aot.model_config(c)).total
  assert sft.state_bytes < 12 * n / 3
  # The sampler holds no optimizer state, its weights in the inference
  # layout (the non-expert ones not split over fsdp).
  from cascade_jax import rl  # pylint: disable=g-import-not-at-top
  ctx = sharding.ShardingCtx(sharding.make_mesh(
      dict(fsdp=2, tensor=2, expert=2), jax.devices()[:8]))
  _, params, rest = nnx.split(train.abstract_model(aot.model_config(c), ctx),
                              nnx.Param, ...)
  assert decode.state_bytes == sum(
      np.prod(sh.shard_shape(x.shape)) * x.dtype.itemsize
      for x, sh in zip(jax.tree.leaves((params, rest)), jax.tree.leaves(
          rl.inference_layout(aot.model_config(c), ctx)[1:])))
  assert decode.state_bytes < sft.state_bytes / 1.5
  # Cost at the model's depth (two repeats of '*E', scanned): at least the
  # counted FLOPs of the weights' matmuls, and a training step costs more
  # than a decode. The counted figure adds attention's (an estimate: half
  # of each causal row; at this toy size it comes to 2 % above XLA's
  # count, which does not recompute everything under remat).
  weights = aot.model_flops('sft', aot.model_config(c), sft.tokens) / 8
  assert sft.flops >= weights > 0 and sft.model_flops > weights
  # (decode's MoE is the `ragged` exchange; XLA:CPU's ragged_dot is counted
  # as every group over every row, k x a dense product's FLOPs.)
  assert decode.flops > 0 and sft.flops > 50 * decode.flops
  assert sft.fits('v5p') and sft.fits('h200')
  # What each step ran: a mesh's cache attention is XLA's on the CPU (the
  # CPU kernel has no SPMD rule; the Pallas kernel is a TPU's).
  assert 'attention=xla' in sft.ops.split(', '), sft.ops
  assert 'cache_attention=xla' in decode.ops.split(', '), decode.ops
  header, rows = aot.table(costs)
  assert len(rows) == 2 and len(rows[0]) == len(header)
  # What is left of the chip beside the peak, per accelerator.
  row = dict(zip(header, rows[0]))
  assert row['v5p free GB'] == pytest.approx(95 - sft.peak_bytes / 1e9)
  assert row['H200 free GB'] == pytest.approx(141 - sft.peak_bytes / 1e9)


@pytest.mark.slow
@pytest.mark.xdist_group('heavy')
def test_plan_with_bf16_moments_holds_two_thirds_of_the_state():
  # --config.moment_dtype=bfloat16: Adam's moments 4 bytes a parameter
  # instead of 8, so a training step's state (fp32 weights + moments) is
  # 8 / 12 of the fp32 moments' state, and the compiled arguments shrink
  # with it.
  c = plan_config.get_config('small')
  c.only, c.steps, c.cost_meshes = 'fsdp2_tensor2_expert2', 'sft', 'none'
  fp32, = aot.run(c, progress=lambda s: None)
  c.moment_dtype = 'bfloat16'
  bf16, = aot.run(c, progress=lambda s: None)
  assert bf16.state_bytes / fp32.state_bytes == pytest.approx(8 / 12, rel=0.01)
  assert fp32.argument_bytes - bf16.argument_bytes == pytest.approx(
      fp32.state_bytes - bf16.state_bytes, rel=0.01)


@pytest.mark.slow
@pytest.mark.xdist_group('heavy')
def test_plan_weight_sync_and_a_bf16_sampler_inference_layout():
  # The sync reads the fp32 weights a device holds in the learner's layout
  # and writes the bf16 copy in the sampler's (no FSDP; experts over fsdp x
  # expert): the bytes the shardings say. The sampler's steps hold that
  # copy.
  from cascade_jax import rl  # pylint: disable=g-import-not-at-top
  c = plan_config.get_config('small')
  c.only, c.steps = 'fsdp2_tensor2_expert2', 'decode,sync'
  c.sampler_dtype = 'bfloat16'           # the main job's config: '' (fp32)
  # No depth extrapolation: the sampler's steps are unrolled, so their
  # costs are their compiled programs' even where train steps get none.
  c.cost_meshes = 'none'
  bf16 = aot.run(c, progress=lambda s: None)
  c.sampler_dtype, c.sampler_layout = '', 'train'
  fp32_train = aot.run(c, progress=lambda s: None)
  decode, sync = bf16
  assert sync.step == 'sync' and sync.tokens == 0 and sync.model_flops == 0
  # It reads every weight it holds and writes the copy.
  assert np.isfinite(decode.flops) and np.isfinite(decode.bytes_accessed)
  assert np.isfinite(sync.flops) and sync.flops >= 0
  assert sync.bytes_accessed >= sync.argument_bytes + 0.9 * sync.output_bytes
  cfg = aot.model_config(c)
  ctx = sharding.ShardingCtx(sharding.make_mesh(
      dict(fsdp=2, tensor=2, expert=2), jax.devices()[:8]))
  _, params, rest = nnx.split(train.abstract_model(cfg, ctx), nnx.Param, ...)
  assert sync.state_bytes == sync.argument_bytes == aot.per_device_bytes(
      (params, rest))
  # The sampler's model: the config at bf16 (the router stays fp32), in the
  # inference layout; the decode step holds it, the sync writes it.
  _, ps, rs = rl.sampler_state(cfg, 'bfloat16', ctx.for_inference(
      cfg.moe.num_experts))
  assert decode.state_bytes == aot.per_device_bytes((ps, rs))
  # (XLA's output size also counts the result tuple's table: rel 1e-3)
  assert sync.output_bytes == pytest.approx(decode.state_bytes, rel=1e-3)
  ps = jax.tree.map(lambda x: x.sharding, ps)
  # Experts: fsdp x expert ways, whole; the rest: not split over fsdp.
  w = [x for x in jax.tree.leaves(ps) if len(x.spec) == 4 and
       'expert' in (x.spec[1] or ())]
  assert len(w) == 3 and all(x.spec[1] == ('fsdp', 'expert') for x in w)
  uses_fsdp = lambda e: e == 'fsdp' or isinstance(e, tuple) and 'fsdp' in e
  assert not [x for x in jax.tree.leaves(ps) for i, e in enumerate(x.spec)
              if uses_fsdp(e) and not (x in w and i == 1)]
  # The train-layout fp32 sampler's decode reads twice the weight bytes and
  # all-gathers its FSDP-split weights: it accesses more (here 1.65 x; on
  # CPU the ragged exchange's counted bytes are inflated as its FLOPs are).
  assert decode.bytes_accessed < fp32_train[0].bytes_accessed



def test_plan_decode_reads_the_weight_layout_the_weight_sync_writes():
  # sampler_weight_layout='decode' (TPU's 'auto'): the plan compiles the
  # sync writing the attention's input projections with the embed axis
  # minor and the decode step reading them so, every other weight as the
  # learner's layout has it; on CPU 'auto' keeps the learner's layout.
  from cascade_jax import rl  # pylint: disable=g-import-not-at-top
  from cascade_jax.aot import _plan  # pylint: disable=g-import-not-at-top
  from cascade_jax.aot import _steps  # pylint: disable=g-import-not-at-top
  c = plan_config.get_config('small')
  cfg = aot.model_config(c)
  ctx = sharding.ShardingCtx(sharding.make_mesh(
      dict(fsdp=2, expert=2), jax.devices()[:4]))
  shapes = dict(_plan.mesh_shapes(c.shapes.to_dict(), 4),
                sampler_dtype='bfloat16', sampler_layout='inference')
  assert _steps._weight_layout(ctx, shapes) == 'default'   # CPU's 'auto'
  shapes['sampler_weight_layout'] = 'decode'

  def minor(formats):
    out = {}
    for path, f in jax.tree_util.tree_flatten_with_path(formats)[0]:
      name = jax.tree_util.keystr(path).split("['")[-1].split("']")[0]
      out[name] = f.layout.major_to_minor
    return out

  decode = minor(_plan._compile('decode', cfg, ctx, None, shapes)[0]
                 .input_formats[0][0])
  sync = minor(_plan._compile('sync', cfg, ctx, None, shapes)[0]
               .output_formats)
  for name in ('w_q_dnh', 'w_k_dkh', 'w_v_dkh'):
    want = rl.embed_minor(len(decode[name])).major_to_minor
    assert decode[name] == sync[name] == want, name
  assert decode['w_o_nhd'] == sync['w_o_nhd'] == tuple(
      range(len(decode['w_o_nhd'])))


def test_plan_table_shows_what_each_chip_has_left_beside_the_peak():
  # 60 GB of arguments + 10 of outputs + 30 of temporaries, 10 of the
  # outputs written into donated arguments: a 90 GB peak leaves 5 GB of a
  # v5p and 51 of an H200; 100 GB more temporaries leave neither.
  from cascade_jax.aot import _report  # pylint: disable=g-import-not-at-top
  gb = 10**9
  cost = _report.StepCost(
      step='grpo', mesh='v5p-64', devices=32, platform='tpu', tokens=1,
      argument_bytes=60 * gb, output_bytes=10 * gb, temp_bytes=30 * gb,
      alias_bytes=10 * gb, flops=1.0, bytes_accessed=1.0, compile_s=1.0,
      state_bytes=50 * gb, model_flops=1.0)
  over = dataclasses.replace(cost, temp_bytes=130 * gb)
  header, rows = aot.table([cost, over])
  fits, tight = (dict(zip(header, r)) for r in rows)
  assert (fits['peak GB'], fits['v5p free GB'], fits['H200 free GB']) == (
      90, 5, 51)
  assert (fits['fits v5p'], fits['fits H200']) == ('yes', 'yes')
  assert (tight['v5p free GB'], tight['H200 free GB']) == (-95, -49)
  assert (tight['fits v5p'], tight['fits H200']) == ('NO', 'NO')

def test_a_refused_step_keeps_the_compilers_whole_message():
  from cascade_jax.aot import _plan  # pylint: disable=g-import-not-at-top
  c = plan_config.get_config('small')
  ctx = sharding.ShardingCtx(sharding.make_mesh(dict(fsdp=8)))
  shapes = {k: int(v) * (8 if k.endswith('_rows') else 1)
            for k, v in c.shapes.items()}
  error = ('XlaRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory on HBM, '
           'the total memory required for HLO temporaries (110.70G) exceeds '
           'available HBM (95.74G). Largest buffers: 1. Size: 30.00G '
           'Operator: op_name="jit(train_step)/scan" ' + 'x' * 500)
  cost = _plan._out_of_memory('grpo', aot.model_config(c), ctx,
                              train.make_optimizer(train.OptimConfig()),
                              shapes, 'cpu', 'm', error, 1.0)
  assert cost.temp_bytes == int(110.70e9) and not cost.fits('h200')
  assert cost.note.endswith('exceeds available HBM (95.74G).')
  assert cost.error.startswith('RESOURCE_EXHAUSTED') and 'Largest buffers' in (
      cost.error) and cost.error.endswith('x' * 500)


@pytest.mark.slow
@pytest.mark.xdist_group('heavy')
def test_plan_compiles_the_grpo_update_in_micro_batches():
  # Rollouts per device x micro-batches: 4 rollouts in 4 micro-batches need
  # about what 1 does (one micro-batch's activations, plus the gradient
  # accumulator), 4 in one several times that.
  c = plan_config.get_config('small')
  c.only, c.steps, c.shapes.rl_seq = 'fsdp2_tensor2_expert2', 'grpo', 256
  c.variants = ml_collections.ConfigDict({
      f'{r}x{k}': dict(rl_rows=r, rl_micro_batches=k)
      for r, k in ((1, 1), (4, 1), (4, 4))})
  costs = {x.variant: x for x in aot.run(c, progress=lambda s: None)}
  assert list(costs) == ['1x1', '4x1', '4x4']
  assert costs['4x1'].temp_bytes > 2.5 * costs['1x1'].temp_bytes
  assert costs['4x4'].peak_bytes < 1.3 * costs['1x1'].peak_bytes
  assert costs['4x4'].tokens == 4 * costs['1x1'].tokens
  c.variants = ml_collections.ConfigDict({'x': dict(rl_micro=2)})
  with pytest.raises(ValueError, match="variant 'x' sets \\['rl_micro'\\]"):
    aot.run(c, progress=lambda s: None)


def test_plan_prefill_in_chunks_writes_into_the_whole_cache():
  # shapes.prefill_rows (rl.prefill_rows): continuous batching's prefill of
  # 1 row a device written into the 4-row cache (donated, in place) needs
  # fewer temporaries than the whole 4-row prefill; the cache is an argument
  # of both, the tokens those of the rows prefilled.
  c = plan_config.get_config('small')
  c.only, c.steps = 'data2_expert4', 'prefill'
  c.shapes.prefill_rows = 0
  c.variants = ml_collections.ConfigDict({
      'whole': dict(rollout_rows=4, prefill_rows=0),
      'chunk': dict(rollout_rows=4, prefill_rows=1)})
  whole, chunk = aot.run(c, progress=lambda s: None)
  assert (whole.variant, chunk.variant) == ('whole', 'chunk')
  assert chunk.tokens * 4 == whole.tokens == 4 * 8 * 32   # rows x 8 devices
  assert chunk.temp_bytes < 0.6 * whole.temp_bytes, (chunk, whole)
  assert chunk.argument_bytes == pytest.approx(whole.argument_bytes, rel=1e-3)
  assert chunk.alias_bytes >= whole.alias_bytes > 0     # the cache, in place


def test_plan_feed_compiles_the_episode_slots_feed_in_place():
  # The `feed` step: episode slots' observation block (APPEND_BUCKET tokens
  # a row, every row) fed in place into the decode step's cache (each row
  # its own write index): the cache an argument and donated, the block's
  # tokens counted; on the hybrid the column-by-column feed
  # (`rollout.feed_fn`).
  c = plan_config.get_config('small')
  c.only, c.steps = 'data2_expert4', 'decode,feed'
  decode, feed = aot.run(c, progress=lambda s: None)
  assert (decode.step, feed.step) == ('decode', 'feed')
  rows = c.shapes.rollout_rows * 8
  assert feed.tokens == rollout.APPEND_BUCKET * decode.tokens == (
      rollout.APPEND_BUCKET * rows)
  # The same weights and cache, plus the block and the rows' logits.
  assert 0 < feed.argument_bytes - decode.argument_bytes < 0.1 * (
      decode.argument_bytes)
  assert feed.alias_bytes >= decode.alias_bytes > 0     # the cache, in place
  assert feed.model_flops == pytest.approx(
      decode.model_flops * rollout.APPEND_BUCKET)
  assert rollout.feed_fn(model.small_hybrid()) is not rollout.feed_fn(
      model.small())


def test_plan_decode_writes_one_index_or_one_a_row():
  # shapes.row_index: continuous batching's and episode slots' decode, each
  # row writing at its own slot (the cache's index [B]), against a fixed
  # batch's one index: the same step otherwise, the cache donated in both.
  c = plan_config.get_config('small')
  c.only, c.steps = 'data2_expert4', 'decode'
  c.shapes.row_index = 0
  c.variants = ml_collections.ConfigDict({
      'one': dict(row_index=0), 'per row': dict(row_index=1)})
  one, per_row = aot.run(c, progress=lambda s: None)
  assert (one.variant, per_row.variant) == ('one', 'per row')
  rows = c.shapes.rollout_rows * 8
  assert one.tokens == per_row.tokens == rows
  # The per-row index: 4 bytes a row more (on a device: its rows').
  assert 0 < per_row.argument_bytes - one.argument_bytes <= 4 * rows
  assert per_row.alias_bytes >= one.alias_bytes > 0


def test_counted_flops_include_attention():
  cfg = aot.model_config(plan_config.get_config('qwen3_30b_a3b'))
  shapes = plan_config.get_config('qwen3_30b_a3b').shapes.to_dict()
  ctx = aot.attention_context('grpo', shapes)
  assert ctx == (2048 + 8192 - 1) / 2
  weights = aot.model_flops('grpo', cfg, 10239)
  per_token = 4 * cfg.num_heads * cfg.head_dim * ctx * 48 * 4   # x4: remat
  assert aot.model_flops('grpo', cfg, 10239, ctx) == pytest.approx(
      weights + per_token * 10239)
  # At the recipe's length attention is no rounding error: ~2/3 of the
  # weights' FLOPs for Qwen3-30B-A3B (32 heads x 128, 48 layers).
  assert 0.5 < per_token * 10239 / weights < 0.8
  assert aot.attention_context('decode', shapes) == shapes['cache_len']


def test_nemotron_plan_is_the_preset_and_its_depth_and_buffer_override():
  # The plan's model is the preset's 52 layers with the expert-parallel
  # receive buffer at 2 x the mean load; the command line can shorten the
  # pattern (a proxy that compiles in minutes) and change the factor.
  c = plan_config.get_config('nemotron3_nano_30b_a3b')
  cfg = aot.model_config(c)
  assert cfg.pattern == model.nemotron3_nano_30b_a3b().pattern
  assert len(cfg.pattern) == 52 and cfg.moe.ragged_buffer_factor == 2.0
  assert cfg.moe.num_experts == 128 and cfg.param_dtype == 'float32'
  c = plan_config.get_config('nemotron3_nano_30b_a3b_ep')
  # The 8-chip config: bf16 moments, buffer 1.25 x, head 512 at a time.
  assert (c.moment_dtype, c.model.overrides.moe.ragged_buffer_factor,
          c.memory.logits_chunk) == ('bfloat16', 1.25, 512)
  c.model.overrides.pattern = 'MEMEM*E'
  c.model.overrides.moe.ragged_buffer_factor = 1.5
  short = aot.model_config(c)
  assert len(short.pattern) == 7     # stored as ME x 2 (scanned), then M*E
  assert short.layer_groups == (('ME', 2), ('M*E', 1))
  assert short.moe.ragged_buffer_factor == 1.5
  assert short.moe.top_k == cfg.moe.top_k and short.mamba == cfg.mamba


def test_a_rule_shards_non_expert_weights_over_the_expert_axis():
  c = plan_config.get_config('qwen3_30b_a3b_fsdp_expert')
  mesh = sharding.make_mesh(dict(fsdp=2, expert=4))
  ctx = sharding.ShardingCtx(mesh, sharding.rules_from_config(c.rules.to_dict()))
  assert ctx.spec(('embed', 'heads', 'head_dim')) == P(('fsdp', 'expert'), None, None)
  assert ctx.spec(('exp', 'embed', 'mlp')) == P('expert', 'fsdp', None)
  default = sharding.ShardingCtx(mesh)
  assert default.spec(('embed', 'heads', 'head_dim')) == P('fsdp', None, None)


def test_plan_splits_the_recipes_rl_batch_over_a_mesh():
  # 2,048 rollouts a step: 256 per chip on 8 chips, 16 on 128, each device's
  # share one rollout a micro-batch; other rows stay per device.
  shapes = dict(sft_rows=1, rl_rows=1, rl_micro_batches=1, rl_batch=2048,
                rl_rows_per_micro=1, rl_seq=10239)
  assert aot.mesh_shapes(shapes, 8) == dict(
      sft_rows=8, rl_rows=2048, rl_micro_batches=256, rl_seq=10239)
  assert aot.mesh_shapes({**shapes, 'rl_rows_per_micro': 4}, 128)[
      'rl_micro_batches'] == 4
  assert aot.mesh_shapes({**shapes, 'rl_batch': 0}, 8)['rl_rows'] == 8
  with pytest.raises(ValueError, match='rl_batch 2048 does not split'):
    aot.mesh_shapes({**shapes, 'rl_rows_per_micro': 3}, 8)
  c = plan_config.get_config('qwen3_30b_a3b_recipe_batch')
  assert sorted(c.meshes) == ['v5p-16', 'v5p-256', 'v5p-64']
  assert c.ops_strict and c.shapes.rl_seq == 2048 + 8192 - 1


@pytest.mark.slow
@pytest.mark.xdist_group('heavy')
def test_plan_on_the_hybrid_preset_compiles_every_step():
  # Mamba-2 layers in every step: training, RL updates, the sampler's
  # chunked prefill and its one-token step (the cache's Mamba states
  # sharded over `tensor`).
  c = plan_config.get_config('small_hybrid')
  costs = aot.run(c, progress=lambda s: None)
  assert [x.step for x in costs] == ['sft', 'grpo', 'mopd', 'prefill',
                                     'decode', 'feed', 'sync']
  sft = costs[0]
  batch = 5 * 128 * 4
  assert sft.argument_bytes == pytest.approx(sft.state_bytes + batch,
                                             rel=0.01)
  assert sft.flops >= sft.model_flops > 0
  assert all(x.fits('h200') for x in costs)


@pytest.mark.slow
@pytest.mark.xdist_group('heavy')
def test_plan_launcher_on_every_small_mesh_and_step(tmp_path):
  out = subprocess.run(
      [sys.executable, '-m', 'experiments.plan',
       '--config=configs/plan.py:small', f'--workdir={tmp_path}'],
      cwd=_ROOT, capture_output=True, text=True, timeout=1200,
      env=_run_helpers.child_env())
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  rows = json.load(open(tmp_path / 'results.json'))
  assert len(rows) == 2 * len(aot.STEPS)
  assert {r['step'] for r in rows} == set(aot.STEPS)
  for r in rows:
    # The main job's sampler reads the fp32 weights: its sync copies nothing.
    assert r['fits v5p'] == 'yes' and (r['flops'] > 0) != (r['step'] == 'sync')
  table = open(tmp_path / 'table.txt').read()
  again = subprocess.run(
      [sys.executable, '-m', 'experiments.plan',
       '--config=configs/plan.py:small',
       f'--from_results={tmp_path / "results.json"}'],
      cwd=_ROOT, capture_output=True, text=True, timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  assert table.split('\n\n')[0] in again.stdout


# ------------------------------------------ the cascade on meshes, 2 processes


def _mini_cascade(mesh: dict | None = None):
  """The quick cascade's SFT -> IF-RL -> MOPD (teachers: SFT for math,
  IF-RL for instruction following), SFT with `dropless` dispatch.

  `capacity` (the quick model's) drops the tokens that overflow an expert
  within each shard's tokens (GShard's groups): sharded, other tokens drop
  than on one device. Every later forward (sampler, learner, reference,
  teachers, reward model) is exact whatever the dispatch.
  """
  c = cascade_config.get_config('quick')
  c.order = 'sft,if_rl,mopd'
  c.stages.mopd.teachers = dict(math='sft', instruction_following='if_rl',
                                multi_domain='', preference='')
  c.stages.mopd.data.domain = 'math,instruction_following'
  c.stages.sft.model.overrides.moe = dict(
      expert_dim=64, shared_expert_dim=64, dispatch='dropless')
  # What the meshes must show needs few steps and prompts: 10 SFT steps,
  # 4 eval prompts a domain (2 episodes), as `_MINI_FLAGS` say it.
  sft = c.stages.sft
  sft.steps = sft.optim.decay_steps = 10
  sft.optim.warmup_steps = 2
  c.eval_n, c.eval_n_episodes = 4, 2
  c.mesh = ml_collections.ConfigDict(mesh or {})
  return c


# `_mini_cascade` as command-line flags (the two-process launch).
_MINI_FLAGS = ('--config.stages.sft.steps=10',
               '--config.stages.sft.optim.decay_steps=10',
               '--config.stages.sft.optim.warmup_steps=2',
               '--config.eval_n=4', '--config.eval_n_episodes=2')


def _final_params(run_dir):
  _, m, _ = train.restore_run(str(run_dir))
  return {jax.tree_util.keystr(p): np.asarray(v) for p, v in
          jax.tree_util.tree_leaves_with_path(nnx.state(m, nnx.Param))}


def _assert_same_cascade(want_dir, got_dir, want_recs, got_recs, atol,
                         max_abs=1e-3):
  assert [r['name'] for r in got_recs] == [r['name'] for r in want_recs]
  for w, g in zip(want_recs, got_recs):
    assert g['scores'].keys() == w['scores'].keys()
    for d in w['scores']:
      assert g['scores'][d]['prompt_pass'] == w['scores'][d]['prompt_pass'], (
          w['name'], d)
    pw, pg = _final_params(want_dir / w['name']), _final_params(
        got_dir / g['name'])
    for k in pw:
      # Adam divides by sqrt(v): where a gradient is near 0, summation-order
      # noise moves a weight by up to ~lr a step. So: each weight within
      # `max_abs`, each tensor within `atol` in relative norm.
      np.testing.assert_allclose(pg[k], pw[k], atol=max_abs, rtol=0,
                                 err_msg=f"{w['name']} {k}")
      rel = np.linalg.norm(pg[k] - pw[k]) / max(np.linalg.norm(pw[k]), 1e-12)
      assert rel <= atol, (w['name'], k, rel)
  for name in ('if_rl', 'mopd'):
    rows = lambda d: [json.loads(l) for l in open(d / name / 'rl_metrics.jsonl')
                      if 'reward_mean' in l]
    learned = 0
    for i, (a, b) in enumerate(zip(rows(want_dir), rows(got_dir))):
      assert a['reward_mean'] == b['reward_mean'], name
      assert a.get('token_count') == b.get('token_count'), name
      if 'loss' not in a:      # every group filtered: no update, both ways
        assert 'loss' not in b, (name, i)
        continue
      # Until a stage's first update its batches are sampled from weights
      # within float noise of each other: the loss agrees to 1e-4. Later
      # batches come after an update, where that noise can flip a sampled
      # token without changing the rewards or lengths: MOPD's second loss
      # (101 tokens both ways) measured 0.020207 (one device) against
      # 0.020379 (data 2 x expert 4) on 2026-12-02, after a one-ulp change
      # in SFT's gradient norm, and 0.004964 against 0.005172 (fsdp 2 x
      # tensor 2 x expert 2) on 2026-12-03: 1.7e-4 and 2.1e-4 apart. The
      # weights above are the check; a later loss only has to agree to 1e-3.
      np.testing.assert_allclose(
          b['loss'], a['loss'], err_msg=f'{name} batch {i}',
          **(dict(atol=1e-4) if not learned else dict(rtol=2e-2, atol=1e-3)))
      learned += 1
    assert learned, f'{name}: no step updated the model'


@pytest.fixture(scope='module')
def mesh_cascades(tmp_path_factory):
  """The mini cascade on one device and on each of MESHES, each in a process
  of its own, as a user runs it (in CI's test worker, after hundreds of other
  tests, one crashed without a trace): {name: (workdir, stage records)}.

  IF-RL runs 4 steps so that the two-process test can kill it mid-stage and
  compare with the data 2 x expert 4 run here (one cascade fewer in CI).
  """
  root = tmp_path_factory.mktemp('cascades')
  return {name: (root / name, _cascade_in_a_process(mesh, root / name,
                                                    if_rl_steps=4))
          for name, mesh in {'one': None, **MESHES}.items()}


@pytest.mark.slow
@pytest.mark.xdist_group('heavy')
def test_quick_cascade_on_two_meshes_and_two_processes_equals_one_device(
    mesh_cascades, tmp_path):
  # One test, not two: the cascades are shared, and pytest-xdist's
  # xdist_group does not keep two tests on one worker here (xdist 3.8 with
  # pytest 9: checked on a file of 4 tests), which would run them twice.
  _check_meshes_equal_one_device(mesh_cascades)
  _check_two_processes_resume_after_a_kill(mesh_cascades, tmp_path)


def _check_meshes_equal_one_device(mesh_cascades):
  # Tolerance, every weight after SFT (30 AdamW steps), IF-RL and MOPD:
  # 1e-4 relative in norm per tensor, 1e-3 for any one weight (measured:
  # 7e-6 max on data 2 x expert 4; 1.1e-4 for one MOPD weight of 32,768
  # with tensor parallelism's other summation order); the sampled
  # responses, and so every score, exactly equal.
  one, want = mesh_cascades['one']
  for name, mesh in MESHES.items():
    work, got = mesh_cascades[name]
    _assert_same_cascade(one, work, want, got, atol=1e-4)
    stage = json.load(open(work / 'if_rl' / 'config.json'))
    assert stage['mesh'] == mesh
    assert stage['init_from'] == 'sft'    # relative to the cascade's dir


def _cascade_in_a_process(mesh, workdir, if_rl_steps=None) -> list[dict]:
  """`cascade.run(_mini_cascade(mesh), workdir)` in a fresh Python process
  (this file's 8 CPU devices); its stage records."""
  out_json = f'{workdir}.json'
  code = ('import json, runpy\n'
          'from cascade_jax import cascade\n'
          f'ns = runpy.run_path({__file__!r})\n'
          f'c = ns["_mini_cascade"]({mesh!r})\n'
          f'if {if_rl_steps!r}: c.stages.if_rl.steps = {if_rl_steps!r}\n'
          f'recs = cascade.run(c, {str(workdir)!r})\n'
          f'json.dump(recs, open({out_json!r}, "w"))\n')
  out = subprocess.run([sys.executable, '-X', 'faulthandler', '-c', code],
                       cwd=_ROOT, capture_output=True, text=True, timeout=1500)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
  return json.load(open(out_json))


def _launch(workdir, i, port, log):
  env = _run_helpers.child_env(
      XLA_FLAGS='--xla_force_host_platform_device_count=4',
      JAX_PLATFORMS='cpu', CASCADE_JAX_XLA_CACHE='0')
  args = [sys.executable, '-m', 'experiments.cascade',
          '--config=configs/cascade.py:quick', '--config.order=sft,if_rl,mopd',
          '--config.stages.mopd.teachers.multi_domain=',
          '--config.stages.mopd.teachers.preference=',
          '--config.stages.mopd.data.domain=math,instruction_following',
          '--config.stages.sft.model.overrides.moe.dispatch=dropless',
          '--config.stages.if_rl.steps=4', *_MINI_FLAGS,
          '--config.mesh.data=2',
          '--config.mesh.expert=4', f'--workdir={workdir}',
          f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
          f'--process_id={i}']
  return subprocess.Popen(args, cwd=_ROOT, env=env, stdout=log,
                          stderr=subprocess.STDOUT)


def _check_two_processes_resume_after_a_kill(mesh_cascades, tmp_path):
  # 2 processes x 4 CPU devices = one data 2 x expert 4 mesh. Process 1 is
  # killed mid IF-RL (after its step-1 checkpoint); both are restarted and
  # the run ends where one process on the same mesh ends.
  work = tmp_path / 'two'
  logs = [open(tmp_path / f'p{i}.log', 'w') for i in range(2)]
  port = _run_helpers.free_port()
  procs = [_launch(work, i, port, logs[i]) for i in range(2)]
  ckpt = work / 'if_rl' / 'checkpoints' / '1'
  deadline = time.time() + 1500
  while not ckpt.is_dir() and time.time() < deadline:
    assert all(p.poll() is None for p in procs), open(tmp_path / 'p0.log').read()[-3000:]
    time.sleep(0.5)
  assert ckpt.is_dir(), 'IF-RL never checkpointed'
  assert not (work / 'if_rl' / 'stage.json').exists()
  procs[1].send_signal(signal.SIGKILL)
  procs[1].wait()
  # Process 0 is left waiting for its peer: stopped too (as a scheduler
  # would restart the job).
  time.sleep(2)
  procs[0].kill()
  procs[0].wait()
  port = _run_helpers.free_port()
  procs = [_launch(work, i, port, logs[i]) for i in range(2)]
  for p in procs:
    assert p.wait(timeout=1500) == 0, open(tmp_path / 'p0.log').read()[-3000:]
  log0 = open(tmp_path / 'p0.log').read()
  assert 'sft (sft): done earlier, skipped' in log0
  assert '[rl] resumed from step 1' in log0
  # One process, the same mesh (8 devices in a process of its own).
  one, want = mesh_cascades['data2_expert4']
  got = [json.load(open(work / r['name'] / 'stage.json')) for r in want]
  _assert_same_cascade(one, work, want, got, atol=1e-4)
