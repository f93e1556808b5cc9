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
The environment's contents (tool output: untrusted) are encoded as plain
text (`Tokenizer.encode_text`): a `<|im_end|>` a program prints stays
characters and cannot end the tool's turn.

A Hugging Face tokenizer (`HFTokenizer`) brings its checkpoint's own chat
template instead: the prompt is the template's rendering with the
generation prompt (transformers' `apply_chat_template(messages,
add_generation_prompt=True)`, token for token); a reply is what the
template writes for the assistant message after that prompt, through its
stop token; an observation is what it writes after the last stop token,
with the environment's contents (untrusted) encoded as plain text, never as
special tokens. Templates that re-render history (Qwen3 drops earlier
<think> blocks) are used only for what is new at each turn: the episode
keeps every token as sampled.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cascade_jax.data._hf_tokenizer import HFTokenizer
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
  if isinstance(tok, HFTokenizer):
    return tok.encode(tok.prompt_text(messages))
  return tok.encode(render_prompt(messages))


def render_observation(messages: Sequence[dict]) -> str:
  """What follows an assistant's <|im_end|>: the environment's turns, then
  the next assistant turn's opening."""
  return '\n' + render_prompt(messages)


# The turn an observation follows, for templates that need one before it.
_BEFORE_OBSERVATION = ({'role': 'user', 'content': 'x'},
                       {'role': 'assistant', 'content': 'x'})


def encode_observation(tok: Tokenizer, messages: Sequence[dict], *,
                       history: Sequence[dict] = _BEFORE_OBSERVATION
                       ) -> list[int]:
  """The tokens after an assistant turn's stop token: the environment's
  `messages`, then the next assistant turn's opening."""
  if not isinstance(tok, HFTokenizer):
    # `render_observation`'s text, the contents (untrusted) as plain text:
    # the chat tags around them are symbols of their own, so the tokens are
    # `encode(render_observation(messages))` for contents without tags.
    ids = tok.encode('\n')
    for m in messages:
      ids += (tok.encode(f"{IM_START}{m['role']}\n") +
              tok.encode_text(m['content']) + tok.encode(f'{IM_END}\n'))
    return ids + tok.encode(f'{IM_START}assistant\n')
  # The template's text around placeholder contents, the contents (tool
  # output: untrusted) encoded as plain text between its pieces.
  marks = [f'\x00{i}\x00' for i in range(len(messages))]
  text = tok.observation_text(
      history, [dict(m, content=k) for m, k in zip(messages, marks)])
  ids = []
  for m, k in zip(messages, marks):
    head, sep, text = text.partition(k)
    if not sep:
      raise ValueError(f'{tok.directory}: the chat template does not write '
                       f"a {m['role']} message's content as it is")
    ids += tok.encode(head) + tok.encode_text(m['content'])
  return ids + tok.encode(text)


def _reply(tok: Tokenizer, history: Sequence[dict], content: str) -> list[int]:
  """An assistant reply's tokens, through the end of its turn."""
  if isinstance(tok, HFTokenizer):
    return tok.encode(tok.reply_text(history, {'role': 'assistant',
                                               'content': content}))
  return tok.encode(content) + [tok.im_end]


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
  history, pending = list(messages), []
  for m in turns:
    if m['role'] != 'assistant':
      pending.append(m)
      continue
    if pending:
      # Rendered after a stand-in turn, not the real history: a template
      # that re-renders history (Qwen3 drops <think> blocks before the last
      # user message) would otherwise change tokens already written.
      obs = encode_observation(tok, pending)
      ids += obs
      learn += [0] * len(obs)
      history += pending
      pending = []
    reply = _reply(tok, history, m['content'])
    ids += reply
    learn += [1] * len(reply)
    history.append(m)
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
  answer = _reply(tok, messages, response)
  ids = np.asarray(prompt + answer, np.int32)
  mask = np.zeros(len(ids), np.int32)
  mask[len(prompt):] = 1
  if loss_on == 'all':
    mask[:] = 1
  return dict(inputs=ids[:-1], targets=ids[1:], mask=mask[1:])


def encode_record(tok: Tokenizer, rec: dict, *, loss_on: str):
  """A record's tokenised example (a multi-turn demonstration, or one
  reply), or None when it has no response."""
  turns, resp = rec.get('turns'), rec.get('response')
  if turns:
    return encode_conversation(tok, rec['messages'], turns, loss_on=loss_on)
  if resp is None or not resp.strip():
    return None
  return encode_example(tok, rec['messages'], resp, loss_on=loss_on)
