"""The chat template (ChatML-like), applied identically in SFT, rollouts and evaluation.

  <|im_start|>system\n{...}<|im_end|>\n
  <|im_start|>user\n{...}<|im_end|>\n
  <|im_start|>assistant\n{response}<|im_end|>

A response may hold a <think>...</think> block; verifiers ignore it.
Generation stops at <|im_end|>.

A multi-turn episode continues after an assistant's <|im_end|> with the
environment's messages (role `tool` or `user`) and a new assistant turn:

  ...{response}<|im_end|>\n<|im_start|>tool\n{...}<|im_end|>\n<|im_start|>assistant\n

Each piece is tokenised on its own (`encode_observation`), in SFT as in
rollouts, so the tokens a model trains on are the tokens it samples after.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cascade_jax.data._tokenizer import IM_END
from cascade_jax.data._tokenizer import IM_START
from cascade_jax.data._tokenizer import Tokenizer

LOSS_ON = ('assistant', 'all')


def render_prompt(messages: Sequence[dict]) -> str:
  """The conversation so far, ending with an open assistant turn."""
  turns = ''.join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n"
                  for m in messages)
  return turns + f'{IM_START}assistant\n'


def encode_prompt(tok: Tokenizer, messages: Sequence[dict]) -> list[int]:
  return tok.encode(render_prompt(messages))


def render_observation(messages: Sequence[dict]) -> str:
  """What follows an assistant's <|im_end|>: the environment's turns, then
  the next assistant turn's opening."""
  return '\n' + render_prompt(messages)


def encode_observation(tok: Tokenizer, messages: Sequence[dict]) -> list[int]:
  return tok.encode(render_observation(messages))


def encode_conversation(tok: Tokenizer, messages: Sequence[dict],
                        turns: Sequence[dict], *, loss_on: str = 'assistant'
                        ) -> dict[str, np.ndarray]:
  """`encode_example` for a multi-turn episode: `turns` follow the prompt
  `messages` (assistant turns and, between them, the environment's).

  The tokens are those a rollout of the same episode holds (prompt, each
  reply + <|im_end|>, each observation as `encode_observation`); the loss
  covers the assistant turns (and their <|im_end|>) only, unless 'all'.
  """
  if loss_on not in LOSS_ON:
    raise ValueError(f'loss_on must be one of {LOSS_ON}, got {loss_on!r}')
  if not turns or turns[-1]['role'] != 'assistant':
    raise ValueError('a conversation ends with an assistant turn')
  ids = encode_prompt(tok, messages)
  learn = [0] * len(ids)
  pending: list[dict] = []
  for m in turns:
    if m['role'] != 'assistant':
      pending.append(m)
      continue
    if pending:
      obs = encode_observation(tok, pending)
      ids += obs
      learn += [0] * len(obs)
      pending = []
    reply = tok.encode(m['content']) + [tok.im_end]
    ids += reply
    learn += [1] * len(reply)
  ids, mask = np.asarray(ids, np.int32), np.asarray(learn, np.int32)
  if loss_on == 'all':
    mask[:] = 1
  return dict(inputs=ids[:-1], targets=ids[1:], mask=mask[1:])


def encode_example(tok: Tokenizer, messages: Sequence[dict], response: str,
                   *, loss_on: str = 'assistant') -> dict[str, np.ndarray]:
  """Next-token training example: inputs, targets and the loss mask.

  The mask is on targets: with loss_on='assistant' only the response and
  its closing <|im_end|> are learned; 'all' learns the prompt too.
  """
  if loss_on not in LOSS_ON:
    raise ValueError(f'loss_on must be one of {LOSS_ON}, got {loss_on!r}')
  prompt = encode_prompt(tok, messages)
  answer = tok.encode(response) + [tok.im_end]
  ids = np.asarray(prompt + answer, np.int32)
  mask = np.zeros(len(ids), np.int32)
  mask[len(prompt):] = 1
  if loss_on == 'all':
    mask[:] = 1
  return dict(inputs=ids[:-1], targets=ids[1:], mask=mask[1:])
