"""The environment interface: `reset(record) -> messages`, `step(assistant text) -> Step`.

An environment plays the other side of a multi-turn episode: it hands the
model its first messages, reads each assistant message (tool calls
included), answers with observation messages (role `tool` or `user`), and
says when the episode is over and what it earned. The rollout engine
(`rollout.run_episodes`) owns the token side: the turn limit, the token
budget, the KV cache across turns and the masks that keep observation
tokens out of the loss; an environment sees text only.

Anything an environment executes (the model's code, its edits' tests) runs
in the sandbox; an environment keeps no state between episodes (a new one
per episode, `Domain.env(record, sandbox)`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

Message = dict[str, str]


@dataclasses.dataclass(frozen=True)
class Step:
  """What an environment answers to one assistant message."""
  messages: tuple[Message, ...] = ()   # observations (empty when done)
  reward: float = 0.0                   # counts only when `done`
  done: bool = False
  info: dict[str, Any] = dataclasses.field(default_factory=dict)


class Environment(Protocol):
  def reset(self, record: dict) -> list[Message]:
    """The episode's first messages (system / user), from its record."""

  def step(self, assistant: str) -> Step:
    """Reads one assistant message (its text, no stop token)."""


class SingleTurn:
  """A one-turn domain as an environment: its verifier scores the first answer.

  Lets a stage mix single-turn domains with multi-turn ones: every record
  runs as an episode, and a single-turn one ends after one message with the
  verifier's reward, exactly as `domains.score` gives it.
  """

  def __init__(self, verify, sandbox=None):
    self._verify = verify
    self._sandbox = sandbox
    self._record: dict | None = None

  def reset(self, record: dict) -> list[Message]:
    self._record = record
    return list(record['messages'])

  def step(self, assistant: str) -> Step:
    if self._record is None:
      raise RuntimeError('SingleTurn.step before reset')
    score = self._verify([self._record], [assistant],
                         sandbox=self._sandbox)[0]
    return Step(reward=score.reward, done=True,
                info=dict(passed=score.passed, **score.details))


def run_scripted(env: Environment, record: dict, replies: Sequence[str],
                 *, max_turns: int = 16) -> tuple[list[Message], Step]:
  """Drives `env` with fixed assistant messages (tests, demonstrations).

  Returns (the whole conversation, the last step). Stops at `done`, after
  the replies run out, or at `max_turns` (then the last step is not done).
  """
  convo = list(env.reset(record))
  step = Step()
  for reply in list(replies)[:max_turns]:
    convo.append({'role': 'assistant', 'content': reply})
    step = env.step(reply)
    convo.extend(step.messages)
    if step.done:
      break
  return convo, step
