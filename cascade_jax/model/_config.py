"""Model configs: frozen dataclasses, validated up front, with named presets."""

from __future__ import annotations

import dataclasses

# Layer kinds, one letter each, as in Nemotron-H's `layers_block_type` string.
ATTENTION, MOE, MLP, MAMBA = '*', 'E', '-', 'M'
PATTERN_LETTERS = {ATTENTION: 'attention', MOE: 'moe', MLP: 'mlp',
                   MAMBA: 'mamba2'}
ACTIVATIONS = ('swiglu', 'relu2')
SCORE_FNS = ('softmax', 'sigmoid')
DISPATCHES = ('ragged', 'capacity', 'dense', 'dropless')
DTYPES = ('float32', 'bfloat16')
# What a block's backward pass keeps from its forward (`ModelConfig.remat`):
# 'none' keeps everything; 'full' keeps only the block's input and recomputes
# the rest; 'save_dots' keeps matmul outputs, 'save_dots_no_batch' only
# those without batch dimensions (the weights-side products).
REMAT_POLICIES = ('none', 'full', 'save_dots', 'save_dots_no_batch')


def _check(cond: bool, field: str, msg: str) -> None:
  if not cond:
    raise ValueError(f'{field}: {msg}')


@dataclasses.dataclass(frozen=True)
class MoEConfig:
  """A routed-expert FFN: router, experts, optional shared expert."""
  num_experts: int
  top_k: int
  expert_dim: int
  activation: str = 'swiglu'
  score_fn: str = 'softmax'
  renormalize: bool = True
  routed_scale: float = 1.0
  # Aux-loss-free balancing: a per-expert bias added to the scores only when
  # choosing experts, updated outside the optimizer (see update_expert_bias).
  use_expert_bias: bool = False
  seq_aux_loss_coef: float = 0.0
  z_loss_coef: float = 0.0
  num_shared_experts: int = 0
  shared_expert_dim: int = 0
  dispatch: str = 'capacity'
  capacity_factor: float = 1.25
  # `ragged` under expert parallelism: each shard's receive buffer in
  # multiples of the mean load (MaxText's ragged_buffer_factor); exact
  # either way (an overflow runs a chunked exchange, counted as the router
  # stat 'spilled'). <= 0: the worst case, ep x tokens x top_k rows.
  ragged_buffer_factor: float = 2.0

  def __post_init__(self):
    _check(self.num_experts > 0, 'moe.num_experts', 'must be positive')
    _check(0 < self.top_k <= self.num_experts, 'moe.top_k',
           f'must be in [1, num_experts={self.num_experts}], got {self.top_k}')
    _check(self.expert_dim > 0, 'moe.expert_dim', 'must be positive')
    _check(self.activation in ACTIVATIONS, 'moe.activation',
           f'{self.activation!r} not in {ACTIVATIONS}')
    _check(self.score_fn in SCORE_FNS, 'moe.score_fn',
           f'{self.score_fn!r} not in {SCORE_FNS}')
    _check(self.dispatch in DISPATCHES, 'moe.dispatch',
           f'{self.dispatch!r} not in {DISPATCHES}')
    _check(self.capacity_factor > 0, 'moe.capacity_factor', 'must be > 0')
    _check(self.num_shared_experts >= 0, 'moe.num_shared_experts', 'must be >= 0')
    _check(self.num_shared_experts == 0 or self.shared_expert_dim > 0,
           'moe.shared_expert_dim', 'must be positive when shared experts exist')


@dataclasses.dataclass(frozen=True)
class MambaConfig:
  """Mamba-2 mixer ('M' layers, Nemotron-H): heads x head_dim inner width."""
  num_heads: int
  head_dim: int
  state_dim: int
  num_groups: int                  # B / C groups; heads per group = H / G
  conv_kernel: int = 4
  chunk_size: int = 128            # SSD chunk (training, prefill)
  conv_bias: bool = True
  # dt = max(softplus(dt + dt_bias), dt_min), in the chunked scan and in the
  # one-token step alike. 0 disables the clamp (Nemotron-H checkpoints:
  # their time_step_limit is (0, inf)).
  dt_min: float = 0.001
  dt_init_min: float = 0.001       # dt_bias init: dt log-uniform in this range
  dt_init_max: float = 0.1

  def __post_init__(self):
    for name in ('num_heads', 'head_dim', 'state_dim', 'num_groups',
                 'conv_kernel'):
      _check(getattr(self, name) > 0, f'mamba.{name}', 'must be positive')
    _check(self.num_heads % self.num_groups == 0, 'mamba.num_groups',
           f'num_heads={self.num_heads} is not divisible by '
           f'num_groups={self.num_groups} (each group serves H / G heads)')
    _check(self.chunk_size > 0, 'mamba.chunk_size',
           f'must be positive, got {self.chunk_size}')
    _check(self.dt_min >= 0, 'mamba.dt_min', 'must be >= 0')
    _check(0 < self.dt_init_min <= self.dt_init_max, 'mamba.dt_init_min',
           f'need 0 < dt_init_min <= dt_init_max, got {self.dt_init_min}, '
           f'{self.dt_init_max}')


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A decoder-only model; `pattern` gives one mixer per layer, in order."""
  vocab_size: int
  embed_dim: int
  pattern: str
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int = 0                 # width of dense '-' layers
  mlp_activation: str = 'swiglu'
  moe: MoEConfig | None = None
  mamba: MambaConfig | None = None
  use_rope: bool = True
  rope_theta: float = 10_000.0
  qk_norm: bool = False
  tie_embeddings: bool = False
  norm_eps: float = 1e-6
  dtype: str = 'float32'           # activations
  param_dtype: str = 'float32'
  # How the model computes, not what it is (checkpoints do not depend on
  # these): each of `layer_groups` that repeats run as one `lax.scan` over
  # its stacked weights (compile time independent of depth), each block's (or scanned unit's)
  # rematerialisation policy, and the output head's logits computed this
  # many positions at a time by the losses (0: all at once).
  scan_layers: bool = False
  remat: str = 'none'
  logits_chunk: int = 0

  def __post_init__(self):
    _check(self.vocab_size > 0, 'vocab_size', 'must be positive')
    _check(self.embed_dim > 0, 'embed_dim', 'must be positive')
    _check(len(self.pattern) > 0, 'pattern', 'must name at least one layer')
    bad = sorted(set(self.pattern) - set(PATTERN_LETTERS))
    _check(not bad, 'pattern',
           f'unknown layer letter(s) {bad}; known: {PATTERN_LETTERS}')
    _check(self.num_heads > 0 and self.num_kv_heads > 0, 'num_heads',
           'num_heads and num_kv_heads must be positive')
    _check(self.num_heads % self.num_kv_heads == 0, 'num_kv_heads',
           f'num_heads={self.num_heads} is not divisible by '
           f'num_kv_heads={self.num_kv_heads}')
    _check(self.head_dim > 0, 'head_dim', 'must be positive')
    _check(not (self.use_rope and self.head_dim % 2), 'head_dim',
           f'RoPE needs an even head_dim, got {self.head_dim}')
    _check(self.mlp_activation in ACTIVATIONS, 'mlp_activation',
           f'{self.mlp_activation!r} not in {ACTIVATIONS}')
    _check(MLP not in self.pattern or self.mlp_dim > 0, 'mlp_dim',
           "pattern has dense '-' layers, so mlp_dim must be positive")
    _check(MOE not in self.pattern or self.moe is not None, 'moe',
           "pattern has MoE 'E' layers, so a MoEConfig is required")
    _check(MAMBA not in self.pattern or self.mamba is not None, 'mamba',
           "pattern has Mamba-2 'M' layers, so a MambaConfig is required")
    _check(self.dtype in DTYPES, 'dtype', f'{self.dtype!r} not in {DTYPES}')
    _check(self.param_dtype in DTYPES, 'param_dtype',
           f'{self.param_dtype!r} not in {DTYPES}')
    _check(self.remat in REMAT_POLICIES, 'remat',
           f'{self.remat!r} not in {REMAT_POLICIES}')
    _check(self.logits_chunk >= 0, 'logits_chunk',
           f'must be >= 0 (0: no chunking), got {self.logits_chunk}')

  @property
  def layer_groups(self) -> tuple[tuple[str, int], ...]:
    """The layers as (unit, repeats) groups, in order: how they are stored and scanned.

    The first group is the prefix of `pattern` that the most layers repeat
    (at least twice, the shortest such unit on a tie): '*E' x 48 for Qwen3,
    'MEMEM*E' x 5 for Nemotron-3-Nano's first 35 of 52 layers. What follows
    is one group repeated once (stored with a leading axis of 1, unrolled).
    A pattern with no repeated prefix is a single group repeated once.
    """
    n = len(self.pattern)
    best, unit = 0, self.pattern
    for p in range(1, n // 2 + 1):
      r = 1
      while self.pattern[r * p:(r + 1) * p] == self.pattern[:p]:
        r += 1
      if r >= 2 and p * r > best:
        best, unit = p * r, self.pattern[:p]
    if not best:
      return ((self.pattern, 1),)
    rest = self.pattern[best:]
    return ((unit, best // len(unit)),) + (((rest, 1),) if rest else ())

  @property
  def layer_slots(self) -> tuple[tuple[int, int, int], ...]:
    """(group, position in its unit, repeat) of every layer, in pattern order."""
    out = []
    for g, (unit, r) in enumerate(self.layer_groups):
      out += [(g, j, k) for k in range(r) for j in range(len(unit))]
    return tuple(out)

  @property
  def num_layers(self) -> int:
    return len(self.pattern)

  def replace(self, **kw) -> 'ModelConfig':
    return dataclasses.replace(self, **kw)

  def replace_moe(self, **kw) -> 'ModelConfig':
    return dataclasses.replace(self, moe=dataclasses.replace(self.moe, **kw))

  def replace_mamba(self, **kw) -> 'ModelConfig':
    return dataclasses.replace(self, mamba=dataclasses.replace(self.mamba, **kw))


# ---------------------------------------------------------------- presets


def tiny(**kw) -> ModelConfig:
  """Unit-test size: vocab 32, embed 16, 4 experts top-2, two blocks."""
  base = dict(
      vocab_size=32, embed_dim=16, pattern='*E*-', num_heads=4,
      num_kv_heads=2, head_dim=8, mlp_dim=32,
      moe=MoEConfig(num_experts=4, top_k=2, expert_dim=16,
                    dispatch='dense'))
  return ModelConfig(**{**base, **kw})


def small(**kw) -> ModelConfig:
  """The CPU main-job model: ~2M params, 8 experts top-2, trains in minutes."""
  base = dict(
      vocab_size=512, embed_dim=128, pattern='*E' * 4, num_heads=4,
      num_kv_heads=2, head_dim=32, qk_norm=True,
      moe=MoEConfig(num_experts=8, top_k=2, expert_dim=128,
                    score_fn='sigmoid', use_expert_bias=True,
                    routed_scale=1.0, num_shared_experts=1,
                    shared_expert_dim=128, dispatch='capacity'))
  return ModelConfig(**{**base, **kw})


def small_hybrid(**kw) -> ModelConfig:
  """`small` with Mamba-2 layers: the CPU main job's Nemotron-H-style hybrid.

  Pattern 'ME*E' x 2 (Mamba-2, MoE, attention, MoE): two of `small`'s four
  attention layers become Mamba-2 (8 heads x 32, state 16, 2 groups);
  squared-ReLU experts and sigmoid routing scaled by 2.5, as Nemotron-H.
  """
  base = dict(
      vocab_size=512, embed_dim=128, pattern='ME*E' * 2, num_heads=4,
      num_kv_heads=2, head_dim=32, use_rope=False, norm_eps=1e-5,
      moe=MoEConfig(num_experts=8, top_k=2, expert_dim=128,
                    activation='relu2', score_fn='sigmoid', renormalize=True,
                    routed_scale=2.5, use_expert_bias=True,
                    num_shared_experts=1, shared_expert_dim=128,
                    dispatch='capacity'),
      mamba=MambaConfig(num_heads=8, head_dim=32, state_dim=16, num_groups=2,
                        conv_kernel=4, chunk_size=32))
  return ModelConfig(**{**base, **kw})


def qwen3_30b_a3b(**kw) -> ModelConfig:
  """Qwen3-30B-A3B: 48 x (attention + MoE), softmax top-8 of 128, SwiGLU."""
  base = dict(
      vocab_size=151_936, embed_dim=2048, pattern='*E' * 48, num_heads=32,
      num_kv_heads=4, head_dim=128, use_rope=True, rope_theta=1e6,
      qk_norm=True, norm_eps=1e-6, dtype='bfloat16', param_dtype='bfloat16',
      moe=MoEConfig(num_experts=128, top_k=8, expert_dim=768,
                    score_fn='softmax', renormalize=True, dispatch='ragged'))
  return ModelConfig(**{**base, **kw})


NEMOTRON3_NANO_PATTERN = (
    'MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME')


def nemotron3_nano_30b_a3b(**kw) -> ModelConfig:
  """Nemotron-3-Nano-30B-A3B: 23 Mamba-2, 23 MoE, 6 attention layers, no RoPE."""
  base = dict(
      vocab_size=131_072, embed_dim=2688, pattern=NEMOTRON3_NANO_PATTERN,
      num_heads=32, num_kv_heads=2, head_dim=128, use_rope=False,
      norm_eps=1e-5, dtype='bfloat16', param_dtype='bfloat16',
      moe=MoEConfig(num_experts=128, top_k=6, expert_dim=1856,
                    activation='relu2', score_fn='sigmoid', renormalize=True,
                    routed_scale=2.5, use_expert_bias=True,
                    seq_aux_loss_coef=1e-4, num_shared_experts=1,
                    shared_expert_dim=3712, dispatch='ragged'),
      # dt unclamped: its time_step_limit is (0, inf).
      mamba=MambaConfig(num_heads=64, head_dim=64, state_dim=128,
                        num_groups=8, conv_kernel=4, chunk_size=128,
                        dt_min=0.0))
  return ModelConfig(**{**base, **kw})


PRESETS = {
    'tiny': tiny,
    'small': small,
    'small_hybrid': small_hybrid,
    'qwen3_30b_a3b': qwen3_30b_a3b,
    'nemotron3_nano_30b_a3b': nemotron3_nano_30b_a3b,
}


def preset(name: str, **kw) -> ModelConfig:
  if name not in PRESETS:
    raise ValueError(f'unknown model preset {name!r}; known: {sorted(PRESETS)}')
  return PRESETS[name](**kw)
