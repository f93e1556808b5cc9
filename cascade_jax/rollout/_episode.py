"""One episode's state and what a turn does to it: the environment's reset, the model's reply taken in, the environment's answer fed back or the episode ended.

Both players of episodes use it: the fixed batch (`_episodes`) and the
continuous slots (`_episode_slots`).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from cascade_jax import data
from cascade_jax import domains
from cascade_jax import envs as envs_lib
from cascade_jax.rollout._turns import APPEND_BUCKET

ENDS = ('done', 'turns', 'budget', 'cut')


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
  max_turns: int = 4
  max_new_tokens: int = 48          # one reply's budget
  max_observation_tokens: int = 96  # an observation beyond this is cut
  max_tokens: int = 384             # the whole episode, prompt included

  def __post_init__(self):
    for k in ('max_turns', 'max_new_tokens', 'max_observation_tokens',
              'max_tokens'):
      if getattr(self, k) < 1:
        raise ValueError(f'episodes.{k} must be >= 1, got {getattr(self, k)}')

  def slots(self, prompt_width: int) -> int:
    """Cache slots for episodes whose prompts are `prompt_width` wide."""
    block = -(-(self.max_observation_tokens + 1) // APPEND_BUCKET
              ) * APPEND_BUCKET
    return (prompt_width + self.max_turns * self.max_new_tokens +
            (self.max_turns - 1) * block)


@dataclasses.dataclass
class Episode:
  """One episode: its tokens (contiguous), what the model sampled of them, its outcome."""
  record: dict
  tokens: list[int]
  model: list[int]              # 1 for a token the model sampled
  logprobs: list[float]         # the sampler's, 0 elsewhere
  kept: list[int]               # the sampler's kept-set sizes, 0 elsewhere
  experts: list[np.ndarray]     # per token [L_moe, k] (empty lists: none)
  reward: float = 0.0
  passed: bool = False
  end: str = ''                 # one of ENDS
  turns: int = 0
  messages: list[dict] = dataclasses.field(default_factory=list)

  @property
  def truncated(self) -> bool:
    return self.end == 'cut'


def make_env(record: dict, sandbox=None):
  """The environment of a record's domain (a single-turn domain: its verifier)."""
  dom = domains.get(record['domain'])
  if dom.env is not None:
    return dom.env(record, sandbox)
  return envs_lib.SingleTurn(dom.verify, sandbox)


_SANDBOX = []


def _tool_sandbox():
  """One sandbox for the environments' tool calls, per process."""
  if not _SANDBOX:
    from cascade_jax.sandbox import Sandbox  # pylint: disable=g-import-not-at-top
    _SANDBOX.append(Sandbox(envs_lib.TOOL_LIMITS))
  return _SANDBOX[0]


def fit_observation(tok, messages, limit: int) -> list[int]:
  """The observation's tokens, its messages' contents cut until it fits `limit`."""
  ids = data.encode_observation(tok, messages)
  messages = [dict(m) for m in messages]
  while len(ids) > limit:
    longest = max(messages, key=lambda m: len(m['content']))
    text = longest['content']
    cut = text[:int(len(text) * 0.75)] + ' [cut]'
    if len(cut) >= len(text):   # short contents: the marker outgrows the cut
      raise ValueError(f'episodes.max_observation_tokens={limit} is too '
                       'small for the chat template around an observation '
                       f'({len(ids)} tokens with contents of at most '
                       f'{len(text)} characters)')
    longest['content'] = cut
    ids = data.encode_observation(tok, messages)
  return ids


def start_episodes(tok, records, cfg: EpisodeConfig, sandbox, make):
  """Each record's environment and its episode's first tokens."""
  need_sandbox = any(domains.get(r['domain']).needs_sandbox for r in records)
  if need_sandbox and sandbox is None:
    sandbox = _tool_sandbox()
  envs = [make(r, sandbox) for r in records]
  eps = []
  for r, env in zip(records, envs):
    first = env.reset(r)
    ids = data.encode_prompt(tok, first)
    if len(ids) + cfg.max_new_tokens > cfg.max_tokens:
      raise ValueError(
          f"record {r.get('id')}: its prompt is {len(ids)} tokens; with a "
          f'reply of {cfg.max_new_tokens} it exceeds episodes.max_tokens='
          f'{cfg.max_tokens}')
    eps.append(Episode(r, list(ids), [0] * len(ids), [0.0] * len(ids),
                       [0] * len(ids), [], messages=list(first)))
  return envs, eps


def take_reply(e: Episode, tok, tokens, logprobs, kept, experts, n: int
                ) -> str:
  """Appends a turn's reply (its first `n` tokens) to `e`; returns its text."""
  e.turns += 1
  e.tokens += tokens[:n].tolist()
  e.model += [1] * n
  e.logprobs += logprobs[:n].tolist()
  e.kept += kept[:n].tolist()
  if experts is not None:
    # The reply's last token is fed with the next observation (if any).
    e.experts += list(experts[:n - 1])
    e.experts.append(np.zeros_like(experts[0]))
  text = tok.decode([t for t in tokens[:n] if t not in tok.stop_ids])
  e.messages.append({'role': 'assistant', 'content': text})
  return text


def after_step(e: Episode, tok, cfg: EpisodeConfig, stopped: bool, step
                ) -> list[int] | None:
  """Ends `e` or appends the environment's observation to it: the tokens
  to feed (the reply's last token, then the observation) or None."""
  if not stopped:
    e.end = 'cut'
  elif step.done:
    e.end, e.reward = 'done', float(step.reward)
    e.passed = bool(step.info.get('passed', e.reward >= 1.0))
  else:
    e.messages += list(step.messages)
    obs = fit_observation(tok, step.messages, cfg.max_observation_tokens)
    if e.turns == cfg.max_turns:
      e.end = 'turns'
    elif len(e.tokens) + len(obs) + cfg.max_new_tokens > cfg.max_tokens:
      e.end = 'budget'
    else:
      feed = [e.tokens[-1]] + obs
      e.tokens += obs
      e.model += [0] * len(obs)
      e.logprobs += [0.0] * len(obs)
      e.kept += [0] * len(obs)
      return feed
  return None


def take_block(e: Episode, block) -> None:
  """The experts of a fed block (the reply's last token, then the observation)."""
  e.experts[-1] = block[0]
  e.experts += list(block[1:])


def step_envs(pool, envs, texts: dict, timing: dict) -> dict:
  t0 = time.perf_counter()
  steps = dict(zip(texts, pool.map(lambda i: envs[i].step(texts[i]), texts)))
  timing['env_s'] += time.perf_counter() - t0
  return steps


def turn_keys(keys: jax.Array, turn) -> jax.Array:
  """Each episode's key for its turn `turn` ([] or [R]: each its own):
  `fold_in(keys[i], turn[i])`; token t of the turn is drawn with `fold_in`
  of that and t (`row_keys`)."""
  return jax.vmap(jax.random.fold_in)(keys, jnp.broadcast_to(turn, keys.shape))
