"""Verifiable domains: generators, JSONL loaders, verifiers, per-domain evaluation.

A new domain is one module defining `DOMAIN = Domain(...)` plus one line in
`_ALL` below.
"""

import collections
import copy
import json

from cascade_jax.domains import code
from cascade_jax.domains import instruction_following
from cascade_jax.domains import long_context
from cascade_jax.domains import math
from cascade_jax.domains import multi_domain
from cascade_jax.domains import nemo_gym_rl
from cascade_jax.domains import preference
from cascade_jax.domains import swe
from cascade_jax.domains import swe_agent
from cascade_jax.domains import tool_use
from cascade_jax.domains._base import Domain
from cascade_jax.domains._base import episode_only
from cascade_jax.domains._base import extract_code
from cascade_jax.domains._base import get
from cascade_jax.domains._base import last_boxed
from cascade_jax.domains._base import names
from cascade_jax.domains._base import register
from cascade_jax.domains._base import Score
from cascade_jax.domains._base import split_of
from cascade_jax.domains._base import strip_think
from cascade_jax.domains._eval import DomainScore
from cascade_jax.domains._eval import evaluate
from cascade_jax.domains._eval import format_scores
from cascade_jax.domains._eval import paired_se
from cascade_jax.domains._eval import score
from cascade_jax.domains._eval import summarize
from cascade_jax.domains._records import load_jsonl
from cascade_jax.domains._records import LoadReport
from cascade_jax.domains._records import prompt_of
from cascade_jax.domains._records import RecordError
from cascade_jax.domains._records import save_jsonl
from cascade_jax.domains._records import validate

_ALL = (
    instruction_following.DOMAIN,
    multi_domain.DOMAIN,
    math.DOMAIN,
    code.DOMAIN,
    long_context.DOMAIN,
    swe.DOMAIN,
    swe_agent.DOMAIN,
    tool_use.DOMAIN,
    preference.DOMAIN,
    nemo_gym_rl.DOMAIN,
    nemo_gym_rl.PYTHON_DOMAIN,
    nemo_gym_rl.WORKPLACE_DOMAIN,
)
for _d in _ALL:
  register(_d)


_GENERATED: collections.OrderedDict = collections.OrderedDict()
_KEEP = 24   # the last generated sets kept (the main job's SFT uses 9)


def generate(domain: str, *, split: str, n: int, seed: int = 0, **options):
  """Records of a generated domain, e.g. generate('math', split='eval', n=512).

  Generation is a function of its arguments, and an SFT stage asks for the
  same sets twice (its tokenizer's corpus, then its data: 10 s of the main
  job's set-up): the last sets are kept and each call gets its own copy.
  """
  dom = get(domain)
  try:
    key = (domain, id(dom), split, n, seed,
           json.dumps(options, sort_keys=True))
  except TypeError:     # options that are not JSON: not kept
    return dom.generate(split=split, n=n, seed=seed, **options)
  if key not in _GENERATED:
    _GENERATED[key] = (dom, dom.generate(split=split, n=n, seed=seed,
                                         **options))
    while len(_GENERATED) > _KEEP:
      _GENERATED.popitem(last=False)
  _GENERATED.move_to_end(key)
  return copy.deepcopy(_GENERATED[key][1])
