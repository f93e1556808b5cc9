"""The chat template (ChatML-like), applied identically in SFT, rollouts and evaluation.

  <|im_start|>system\n{...}<|im_end|>\n
  <|im_start|>user\n{...}<|im_end|>\n
  <|im_start|>assistant\n{response}<|im_end|>

A response may hold a <think>...</think> block; verifiers ignore it.
Generation stops at <|im_end|>.
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
