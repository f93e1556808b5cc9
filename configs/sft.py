"""SFT of the small MoE from scratch on the generated domains (the recipe's first stage).

Launch (about 4 minutes on 2 CPU cores, greedy evaluation included):

  python -m experiments.sft --config=configs/sft.py --workdir=runs/sft
  python -m experiments.sft --config=configs/sft.py:quick --workdir=/tmp/sft
  python -m experiments.sft --config=configs/sft.py --workdir=runs/sft \
      --config.steps=1200 --config.data.sources.math.weight=3

Killing the run and starting the same command again resumes it from its
last checkpoint, data position included. Point a source at your own data
with e.g. --config.data.sources.math.jsonl=/data/math.jsonl (see
docs/DATA.md for the record format), or add chat-messages files (the
public SFT set's format) with
--config.data.chat_files=/data/math.parquet=2,/data/chat.jsonl=1
(--config.data.generated_sources=False to train on them alone).
"""

import ml_collections

from cascade_jax import train

# Domain -> (weight, levels, generator options). Levels the model can part-
# learn in a few minutes (CPU_SCALE.md: RL needs a non-zero pass rate to
# learn from): IF with one or two constraints, multi-domain at levels 1-2.
# Math: levels 1-3 (counting on and back, one-denominator fractions,
# one-step equations), weight 1.5. Measured from one SFT each (2026-12-02,
# pass@1 at T=1 over 2 samples, 256 prompts): weight 1 gave 0.25, weight
# 2 gave 0.68; the old levels (all single-digit and two-digit sums,
# unlike fractions) stayed at 0.05 after every stage.
# Math, code and SWE split by prompt: a model this
# small cannot derive arithmetic facts or function specs it never saw, so
# their eval prompts are new phrasings / examples / tests of problems that
# may recur in training. `response_quality` is the fraction of reference
# responses that are right; the rest are each domain's typical mistake
# (an ignored constraint, another record's value, the task's usual bug, the
# buggy function handed back, a rejected answer; docs/DATA.md). SFT then
# leaves every RL domain answered right only part of the time, and each
# RL stage has its domain's mistake to unlearn, as in the paper, whose SFT
# data also comes from imperfect teachers.
# Long context: counts over 8 records. Lookups and needles need induction
# heads that a model this size has not formed after a few minutes of SFT
# (measured: lookups at chance, needles 0%), and so do presence checks
# ('has': 0.50 -> 0.55 through long-context RL, i.e. chance), so RL has
# nothing to sharpen there; counting it can part-learn.
LONG_CONTEXT_KINDS = ('count',)
# Multi-domain: the recipe's mix is 55% multiple choice, which this model
# answers at chance (4 options) before and after RL; tool calls and
# structured output (copying values from the prompt) it part-learns, so
# they get most of the weight here.
MULTI_DOMAIN_KINDS = {'mcq': 0.3, 'tool_call': 0.35, 'structured': 0.35}
SOURCES = {
    'instruction_following': (1.0, (1, 2), {'response_quality': 0.5}),
    'multi_domain': (1.0, (1, 2), {'response_quality': 0.5,
                                   'kinds': MULTI_DOMAIN_KINDS}),
    'math': (1.5, (1, 2, 3), {'split_by': 'prompt'}),
    'code': (1.0, (1, 2, 3), {'split_by': 'prompt', 'response_quality': 0.5}),
    'long_context': (2.0, (1,), {'response_quality': 0.75,
                                   'kinds': LONG_CONTEXT_KINDS}),
    'swe': (1.0, (1, 2, 3), {'split_by': 'prompt', 'response_quality': 0.5}),
    'preference': (0.5, (1, 2, 3), {'response_quality': 0.3}),
    # Multi-turn: demonstrations are whole episodes (tool calls, the
    # environment's answers, the final answer); half of them fail as a weak
    # teacher's would (a guess instead of the tool call, or a conversion
    # skipped; a submit without the fix). Tool use weighs 3: at 0.75 the
    # model called the right tool but copied neither the prompt's arguments
    # nor the tool's result (SFT 0.010, multi-domain RL +0.006, within
    # noise); at 3.0 it copies (SFT 0.297, RL +0.361; 2026-12-01, see
    # docs/results/perf/agentic_main_job_2026-12-01/). The SFT scores of the others
    # moved by up to 0.1 (preference 0.508 -> 0.348 as its share of the
    # mix fell from 5.1% to 4.2%; RLHF lifts it back). Copying from an
    # observation is a lookup: it takes data.
    'tool_use': (3.0, (1, 2, 3), {'response_quality': 0.5}),
    'swe_agent': (0.75, (1, 2), {'split_by': 'prompt',
                                'response_quality': 0.5}),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  # Start from a run's weights and tokenizer instead of a new model: a run
  # directory (e.g. one experiments.import_hf wrote), or 'hf:DIR', a Hugging
  # Face checkpoint imported into this run's `imported/` first. '' builds
  # `model` from scratch with a sentencepiece tokenizer trained here.
  c.init_from = ''
  c.model = ml_collections.ConfigDict(dict(
      preset='small', overrides=ml_collections.ConfigDict(
          {'vocab_size': 1024, 'pattern': '*E*E'})))
  # mesh, rules (logical axis -> mesh axes) and memory (remat, scan_layers,
  # logits_chunk, compute_dtype): see cascade_jax/train/_setup.py.
  c.update(train.placement_defaults())
  c.tokenizer = ml_collections.ConfigDict(dict(path='', corpus_per_source=2000))
  c.data = ml_collections.ConfigDict(dict(
      # 320: swe_agent's level-2 episodes run up to 283 tokens.
      seq_len=320, batch_size=16, loss_on='assistant', too_long='error',
      empty_response='error',
      # Chat-messages files (the public SFT set's schema, JSONL or Parquet),
      # 'PATH=WEIGHT,PATH=WEIGHT': each a source named after its file,
      # mixed by weight with the generated sources (or alone, with
      # generated_sources=False). See cascade_jax/data/_chat_rows.py.
      chat_files='', generated_sources=True,
      sources=ml_collections.ConfigDict({
          name: dict(weight=w, n=4000, levels=levels, options=options)
          for name, (w, levels, options) in SOURCES.items()})))
  c.optim = ml_collections.ConfigDict(dict(
      lr=2e-3, warmup_steps=50, decay_steps=400, end_lr_frac=0.1, b1=0.9,
      b2=0.98, weight_decay=0.1, clip_norm=1.0, schedule='cosine',
      warmup_init_frac=0.0, moment_dtype='float32'))
  c.accum_steps = 1
  c.expert_bias_rate = 1e-3
  c.steps = 400
  c.log_every = 25
  c.eval_every = 0          # 0: evaluate at the end only
  c.eval_n = 256            # eval prompts per domain
  c.checkpoint_every = 100
  c.keep_checkpoints = 3

  if arg == 'quick':        # ~1 minute: the end-to-end test size
    c.model.overrides = ml_collections.ConfigDict(dict(
        vocab_size=512, embed_dim=64, pattern='*E*E', head_dim=16,
        # dispatch: the small preset's, here to be overridden by a flag
        # (--config.model.overrides.moe.dispatch=dropless).
        moe=dict(expert_dim=64, shared_expert_dim=64, dispatch='capacity')))
    c.data.seq_len = 320
    c.data.batch_size = 8
    for s in c.data.sources.values():
      s.n = 300
    c.tokenizer.corpus_per_source = 300
    c.steps, c.optim.decay_steps, c.optim.warmup_steps = 30, 30, 5
    c.log_every, c.checkpoint_every, c.eval_n = 5, 10, 8
  elif arg:
    raise ValueError(f'configs/sft.py: unknown argument {arg!r} (known: quick)')
  return c


def sweep():
  """Learning rate x steps."""
  for lr in (1e-3, 2e-3, 4e-3):
    for steps in (400, 800):
      yield {'config.optim.lr': lr, 'config.steps': steps,
             'config.optim.decay_steps': steps}
