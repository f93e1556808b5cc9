"""Verifiable domains: generators, JSONL loaders, verifiers, per-domain evaluation.

A new domain is one module defining `DOMAIN = Domain(...)` plus one line in
`_ALL` below.
"""

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
)
for _d in _ALL:
  register(_d)


def generate(domain: str, *, split: str, n: int, seed: int = 0, **options):
  """Records of a generated domain, e.g. generate('math', split='eval', n=512)."""
  return get(domain).generate(split=split, n=n, seed=seed, **options)
