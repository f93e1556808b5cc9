"""The Nemotron-Cascade 2 pipeline as data, scaled down to run on a laptop CPU.

  python -m experiments.cascade --config=configs/cascade.py --workdir=runs/cascade
  python -m experiments.cascade --config=configs/cascade.py:quick --workdir=/tmp/c
  python -m experiments.cascade --config=configs/cascade.py:judge --workdir=runs/j

Stages run in `order`; each is its runner's full config (configs/sft.py,
configs/rl.py, configs/reward_model.py) plus `kind`, `init_from` (a stage;
default: the previous main-line stage) and `branch` (off the main line).
Reorder, drop or add stages from the command line or a copy of this file:

  --config.order=sft,rm,rlhf,if_rl,multi_domain_rl,code_rl,swe_rl   # Cascade 1
  --config.stages.code_rl.steps=40 --config.stages.code_rl.optim.lr=1e-4

MOPD names its teachers by domain -> stage (math: the SFT checkpoint; IF:
IF-RL; multi-domain: multi-domain RL; preference: the RLHF side branch),
as in the paper. RLHF uses the Bradley-Terry reward model with a KL penalty
(the paper's 0.03; 0.1 at this scale, see RLHF_KL); `:judge` (or a stage's
`reward=generative_judge` with a `judge` stage in the order) uses the
paper's generative pairwise judge instead (see RLHF_REWARD).
"""

import ml_collections

from cascade_jax import train

from configs import judge as judge_config
from configs import reward_model as rm_config
from configs import rl as rl_config
from configs import sft as sft_config

DEFAULT_ORDER = ('sft,rm,rlhf_branch,if_rl,multi_domain_rl,mopd,rlhf,'
                 'long_context_rl,code_rl,swe_rl,swe_agent_rl')

# The paper's RLHF KL coefficient is 0.03. At this scale the policy found
# what the reward model over-rewards within 30 steps at 0.03: its score
# rose 1.9 -> 4.3 while the judge's pass rate fell 0.52 -> 0.48 (from one
# MOPD checkpoint, 256 prompts x 2 samples; 0.05: 0.52 -> 0.52); at 0.1 the
# same stage went 0.52 -> 0.74 and 0.77 (two seeds), the RLHF branch from
# SFT 0.52 -> 0.74 (0.67 at 0.03). --config.stages.rlhf.rl.kl_coef=0.03
# restores the paper's value. On 2026-12-02 (15 steps from one MOPD
# checkpoint, 3 seeds, docs/results/claims/2026-12-02/rlhf/) 0.03 gave
# +0.282 against 0.1's +0.250, higher in every seed. The main job at 0.03
# (3 seeds, 2026-12-04, docs/results/claims/2026-12-04/rlhf_kl_main/, rule
# registered first) did worse: preference after rlhf lower in every seed
# (-0.057, -0.021, -0.123; beyond 2 paired SE in two), so the default
# stays 0.1.
RLHF_KL = 0.1
# The RLHF stages' reward: 'bradley_terry' (the `rm` stage's scalar score)
# or 'generative_judge' (the paper's: the `judge` stage compares each
# rollout with the others of its group, both orders; configs/cascade.py:judge
# adds the judge stage and makes it both RLHF stages' reward).
# Bradley-Terry at this scale. Measured 2026-12-02 from one cascade's MOPD
# checkpoint, 15 RLHF steps, KL 0.1, 3 seeds each (docs/results/
# claims_2026-12-02/rlhf/): the judge's policies settle on a template it
# likes ("Music can be and and rich.") and gain little on the rule judge;
# the Bradley-Terry model's gain several times more. Both rank pairs of
# SFT samples about equally (judge_agreement/), so the judge's weakness is
# in what RL finds against it, not in its held-out agreement.
RLHF_REWARD = 'bradley_terry'
# A response cut at max_new_tokens, per stage (RLConfig.overlong). The
# recipe filters (masks out of the loss) for multi-domain, long-context and
# code RL: a cut answer there says nothing about the answer the model would
# have finished. RECIPE.md is silent on the others; chosen here:
# - IF-RL: penalty. Its constraints are about the whole response (length,
#   closing phrase): a cut response does not follow them, so 0 is its true
#   reward, and the penalty teaches the model to finish.
# - RLHF (both): penalty, which for a reward model's scores means the lowest
#   score of the response's group (0 means nothing on an RM's scale): an
#   unfinished reply is never preferred to a finished one.
# - SWE (both halves): penalty: a cut patch does not apply, and a cut tool
#   call does not run, so either fails anyway; the penalty only says so.
#   Multi-domain's tool-use episodes follow the stage (filter).
# - MOPD: none: its signal is the teacher's per-token log-prob, which is as
#   valid on the first 48 tokens of a cut response as on a finished one (no
#   outcome reward unless mopd_reward_weight > 0).
OVERLONG = {'rlhf_branch': 'penalty', 'if_rl': 'penalty',
            'multi_domain_rl': 'filter', 'rlhf': 'penalty',
            'long_context_rl': 'filter', 'code_rl': 'filter',
            'swe_rl': 'penalty', 'swe_agent_rl': 'penalty', 'mopd': 'none',
            'math_rl': 'filter'}
# RL stage -> (domain(s), levels, generator options, steps, lr, extra rl).
# max_new_tokens is 48 unless a stage's answers are short (the learner's
# sequences are prompt + budget long).
RL_STAGES = {
    'rlhf_branch': ('preference', (1, 2, 3), {}, 20, 2e-4,
                    dict(kl_coef=RLHF_KL, dynamic_filtering=False,
                         max_new_tokens=32)),
    # 16 prompts a step: IF's reward is a fraction of constraints, and the
    # doubled batch raised pass@1 +0.055 where 8 prompts gave +0.010 (30
    # steps from one SFT checkpoint, 256 prompts x 2 samples).
    'if_rl': ('instruction_following', (1, 2), {}, 30, 2e-4,
              dict(max_new_tokens=32, prompts_per_step=16)),
    # Multi-domain: the single-reply kinds and executed tool calls
    # (multi-turn episodes: call, read the result, answer), half each.
    'multi_domain_rl': ('multi_domain,tool_use', (1, 2),
                        {'per_domain': {
                            'multi_domain': {
                                'kinds': sft_config.MULTI_DOMAIN_KINDS},
                            'tool_use': {'levels': (1, 2, 3)}}},
                        30, 2e-4, dict(prompts_per_step=16, pack_width=256)),
    # RLHF from MOPD: 15 steps. The reward model is over-optimised past
    # that: from one MOPD checkpoint (2026-12-01, rerun_stage, 256 prompts x
    # 2), preference +0.100 at 15 steps, +0.039 at 20, -0.227 at 30 (the
    # RM's score still rising, KL 0.66); at 30 steps, KL 0.3 gave -0.061
    # and lr 1e-4 +0.033 (docs/results/perf/agentic_main_job_2026-12-01/rlhf_steps/).
    'rlhf': ('preference', (1, 2, 3), {}, 15, 2e-4,
             dict(kl_coef=RLHF_KL, dynamic_filtering=False, max_new_tokens=32)),
    'long_context_rl': ('long_context', (1,),
                        {'kinds': sft_config.LONG_CONTEXT_KINDS}, 30, 2e-4,
                        dict(max_new_tokens=16)),
    # Code and SWE run every rollout in the sandbox (~40 programs/s on two
    # cores when this was chosen; ~56 since the fork server, docs/DATA.md):
    # groups of 4, fewer steps, one refill round.
    'code_rl': ('code', (1, 2, 3), {'split_by': 'prompt'}, 10, 2e-4,
                dict(top_p=0.95, rollouts_per_prompt=4, max_refill_rounds=1)),
    'swe_rl': ('swe', (1, 2, 3), {'split_by': 'prompt'}, 10, 2e-4,
               dict(rollouts_per_prompt=4, max_refill_rounds=1)),
    # SWE's agentic half, after the agentless one (the recipe's order):
    # episodes of tool calls on a small repository, up to 5 turns of 72
    # tokens; the hidden tests run in the sandbox after `submit`.
    # Episode stages pack the learner's batch (rl.pack_width: the episode
    # budget, several episodes a row) instead of a row per episode at the
    # whole budget, mostly padding. Its rows grow as its episodes lengthen
    # (40 -> 64 over 10 steps, a compile each); starting at 64
    # (rl.pack_rows=64) compiled twice instead of 4 times but made every
    # step slower by as much: the stage's update seconds 55.7 against 56.1
    # (docs/results/archive/main_job_refill_shapes_2026-12-05).
    'swe_agent_rl': ('swe_agent', (1, 2), {'split_by': 'prompt'}, 10, 2e-4,
                     dict(max_new_tokens=72, max_refill_rounds=1,
                          pack_width=448)),
    # Math RL (Nemotron-Cascade 1's stage; not in Cascade 2's order, where
    # MOPD keeps math): --config.order=sft,...,math_rl, or rerun_stage.
    'math_rl': ('math', (1, 2, 3), {'split_by': 'prompt'}, 30, 2e-4,
                dict(prompts_per_step=16)),
}
MOPD_TEACHERS = {'math': 'sft', 'instruction_following': 'if_rl',
                 'multi_domain': 'multi_domain_rl',
                 'preference': 'rlhf_branch'}


def _stage(kind, base, **meta):
  c = ml_collections.ConfigDict(base.to_dict())
  for key in _PLACEMENT:   # the cascade's own, for every stage
    del c[key]
  c.kind = kind
  c.init_from = meta.get('init_from', '')
  c.branch = meta.get('branch', False)
  return c


_PLACEMENT = tuple(train.placement_defaults())


def _rl(name, quick):
  dom, levels, options, steps, lr, extra = RL_STAGES[name]
  c = _stage('grpo', rl_config.get_config('quick' if quick else None),
             init_from='sft' if name == 'rlhf_branch' else '',
             branch=name == 'rlhf_branch')
  c.data = ml_collections.ConfigDict(dict(
      domain=dom, n_train=2048, levels=levels, **options))
  c.rl.prompts_per_step, c.rl.rollouts_per_prompt = 8, 8
  c.rl.max_new_tokens = 48
  c.rl.overlong = OVERLONG[name]
  for k, v in extra.items():
    c.rl[k] = v
  c.optim.lr = lr
  c.optim.warmup_steps = 2     # stages are short: do not spend them warming up
  c.steps = steps
  c.checkpoint_every, c.keep_checkpoints, c.log_every = 10, 1, 5
  if dom == 'preference':
    c.reward = RLHF_REWARD
  if quick:
    c.steps, c.checkpoint_every = 2, 1
    c.rl.prompts_per_step, c.rl.rollouts_per_prompt = 2, 4
    c.rl.max_new_tokens = 16
    c.data.n_train = 64
  return c


# Recovering what a stage forgot (experiments.recover; not in the default
# order): from the damaging stage, MOPD on the damaged domains with each
# domain's best earlier checkpoint as its teacher, against GRPO on the same
# domains at the same sampled rollouts (16 prompts x 4, no refills), the
# same steps, learning rate and budget. Teachers and domains are set per
# run by the launcher.
RECOVER_DOMAINS = ('math', 'code')


def _recovery_stages(c, quick):
  for name, kind in (('mopd_recover', 'mopd'), ('grpo_recover', 'grpo')):
    r = _stage(kind, rl_config.get_config('mopd' if kind == 'mopd' else
                                          'quick' if quick else None),
               init_from='long_context_rl', branch=True)
    r.data = ml_collections.ConfigDict(dict(
        domain=','.join(RECOVER_DOMAINS), n_train=2048, levels=(1, 2, 3),
        per_domain={d: {'split_by': 'prompt'} for d in RECOVER_DOMAINS}))
    r.rl.prompts_per_step, r.rl.rollouts_per_prompt = 16, 4
    r.rl.max_new_tokens, r.rl.max_refill_rounds = 48, 0
    r.rl.overlong = 'none' if kind == 'mopd' else 'filter'
    r.optim.lr, r.optim.warmup_steps = 2e-4, 2
    r.steps, r.checkpoint_every, r.keep_checkpoints, r.log_every = 12, 6, 1, 4
    if kind == 'mopd':
      r.teachers = ml_collections.ConfigDict(
          {d: 'sft' for d in RECOVER_DOMAINS})
    if quick:
      r.steps, r.checkpoint_every = 2, 1
      r.rl.prompts_per_step, r.rl.max_new_tokens, r.data.n_train = 2, 16, 64
    c.stages[name] = r


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  quick = arg in ('quick', 'judge_quick')
  if arg not in (None, '', 'quick', 'judge', 'judge_quick'):
    raise ValueError(f'configs/cascade.py: unknown argument {arg!r} '
                     '(known: quick, judge, judge_quick)')
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.order = DEFAULT_ORDER
  # The model every SFT stage trains, by name (later stages start from it):
  # '' keeps the SFT config's (`small`, attention + MoE); 'hybrid' is the
  # Nemotron-H-style Mamba-2 + attention + MoE model of the same width.
  # A model's `stages` are the stage settings measured for it, set over the
  # stages' own when it is chosen, so a --config.stages.* flag does not
  # change them: change them here, e.g.
  # --config.models.hybrid.stages.sft.data.sources.preference.weight=0.5.
  # The hybrid's SFT at preference weight 1.5 (rule 33,
  # docs/claims/33_sft_pref_hybrid.json: the cascade ends ahead in macro
  # pass@1 beyond 2 SE in 2 of 3 seeds, no domain lower that far in two;
  # six lower in one seed each).
  c.model = ''
  c.models = ml_collections.ConfigDict(dict(
      hybrid=dict(preset='small_hybrid', overrides=dict(pattern='ME*E'),
                  stages=dict(sft=dict(data=dict(sources=dict(
                      preference=dict(weight=1.5))))))))
  # Forces cascade_jax.ops implementations, e.g. 'attention=xla,argmax=xla'
  # (empty: each op picks by backend and dtype; CASCADE_JAX_OPS likewise).
  c.ops = ''
  # True: a kernel that would fall back to XLA at some shape (splash, the
  # grouped matmul, cuDNN) stops the run with the op, the shape and the
  # reason (CASCADE_JAX_OPS_STRICT=1 likewise). On the CPU nothing falls back.
  c.ops_strict = False
  # Every stage's mesh, sharding rules and memory settings (see
  # cascade_jax/train/_setup.py), and the evaluation's: e.g.
  # --config.mesh.data=2 --config.mesh.expert=4 --config.memory.remat=full
  c.update(train.placement_defaults())
  # Eval prompts per domain after each stage: at 128 two paired standard
  # errors of a stage's change were ~0.05-0.07, at 256 ~0.035-0.04.
  c.eval_n = 8 if quick else 256
  # Multi-turn domains (swe_agent, tool_use): 128 prompts. Their episodes
  # cost most of an evaluation (swe_agent's 512 took 27-37 s of a stage's
  # ~33-44 s, measured on 2026-12-01); their RL changes are large
  # (+0.27-0.36) against two paired standard errors of ~0.06-0.08 at 128.
  c.eval_n_episodes = 8 if quick else 128
  # Multi-turn episode limits for the evaluation and for every RL stage
  # that does not set its own (rl.max_turns, rl.max_observation_tokens,
  # rl.max_episode_tokens); 0 keeps each domain's. The domains' limits count
  # the tiny job's sentencepiece tokens: a checkpoint's own tokenizer and
  # chat template (an import) may need more, e.g. Qwen3's wraps a tool's
  # output in ~20 tokens of turn markers.
  c.episodes = ml_collections.ConfigDict(dict(
      max_turns=0, max_observation_tokens=0, max_tokens=0))
  # The policy as RL trains it: pass@1 at the sampling temperature, the mean
  # over 2 samples per prompt (greedy decoding hides most of what RL does at
  # this size: it moves probability mass before it flips the argmax).
  c.eval_temperature = 1.0           # 0: greedy
  c.eval_samples = 2
  # Where a stage is scored: 'inline' (after its training, in the cascade's
  # process), 'process' (in an evaluation process while the next stages
  # train: same scores, the wall time of the evaluations mostly hidden) or
  # 'auto': 'process' on a single-process CPU run whose evaluation samples
  # at least 64 responses a domain (this one; not :quick), else 'inline'.
  c.eval_worker = 'auto'
  # The CPU cores the evaluation process is pinned to ('1', '2,3'; '': any).
  c.eval_cpus = ''
  c.stages = ml_collections.ConfigDict()

  c.stages.sft = _stage('sft', sft_config.get_config('quick' if quick else None))

  rm = _stage('reward_model', rm_config.get_config('quick' if quick else None),
              init_from='sft', branch=True)
  if not quick:
    # Fewer steps left a reward model that RLHF learned to exploit (its
    # score up, the judge's pass rate from 0.68 to 0.04).
    rm.steps, rm.eval_n = 40, 256
  c.stages.rm = rm
  c.stages.judge = _stage('judge', judge_config.get_config(
      'quick' if quick else None), init_from='sft', branch=True)

  for name in RL_STAGES:
    c.stages[name] = _rl(name, quick)

  m = _stage('mopd', rl_config.get_config('mopd'))
  m.data = ml_collections.ConfigDict(dict(
      domain=','.join(MOPD_TEACHERS), n_train=2048, levels=(1, 2, 3)))
  m.teachers = ml_collections.ConfigDict(MOPD_TEACHERS)
  m.rl.prompts_per_step, m.rl.rollouts_per_prompt = 16, 4
  m.rl.max_new_tokens = 48
  m.rl.overlong = OVERLONG['mopd']
  m.optim.lr, m.optim.warmup_steps = 2e-4, 2
  m.steps, m.checkpoint_every, m.keep_checkpoints, m.log_every = 12, 6, 1, 4
  if quick:
    m.steps, m.checkpoint_every = 2, 1
    m.rl.prompts_per_step, m.rl.max_new_tokens, m.data.n_train = 2, 16, 64
  c.stages.mopd = m
  _recovery_stages(c, quick)
  # Long-context RL with math and code mixed into its prompts (the same
  # steps, rollouts a step and budget; not in the default order): does
  # mixing keep what long-context RL alone forgets? experiments.rerun_stage
  # with --config.order=...,rlhf,long_context_mixed.
  lc = _rl('long_context_rl', quick)
  lc.data = ml_collections.ConfigDict(dict(
      domain='long_context,math,code', n_train=lc.data.n_train,
      levels=(1, 2, 3), per_domain=dict(
          long_context=dict(kinds=sft_config.LONG_CONTEXT_KINDS, levels=(1,)),
          math=dict(split_by='prompt'), code=dict(split_by='prompt'))))
  lc.rl.max_new_tokens = c.stages.code_rl.rl.max_new_tokens
  c.stages.long_context_mixed = lc
  if arg in ('judge', 'judge_quick'):   # the paper's RLHF reward
    c.order = c.order.replace('sft,rm,', 'sft,rm,judge,', 1)
    for name, (dom, *_) in RL_STAGES.items():
      if dom == 'preference':
        c.stages[name].reward = 'generative_judge'
  return c


def sweep():
  """The default cascade over three seeds (the forgetting matrix's spread)."""
  for seed in (0, 1, 2):
    yield {'config.seed': seed}
