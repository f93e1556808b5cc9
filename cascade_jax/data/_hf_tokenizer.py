"""Hugging Face tokenizers (`tokenizer.json`) with the checkpoint's own chat template.

A released checkpoint (Qwen3, Nemotron) ships a `tokenizers` BPE model, its
special tokens (`tokenizer_config.json`), a jinja chat template (there or in
`chat_template.jinja`) and its stop ids (`generation_config.json`).
`HFTokenizer` reads them behind the interface of the sentencepiece
`Tokenizer` (encode / decode / vocab_size / im_end / pad_id), and renders
conversations with the template as transformers does (a sandboxed jinja
environment with `trim_blocks` and `lstrip_blocks`, `tojson`,
`raise_exception`, `strftime_now`, the special tokens as variables).

`encode` parses special tokens written in the text (transformers'
`encode(text, add_special_tokens=False)`); `encode_text` never yields a
special id (for untrusted text: tool output, observations); `decode` keeps
special tokens (transformers' `decode`).
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Sequence
from typing import Any

import jinja2
import tokenizers
from jinja2 import sandbox


class TemplateError(ValueError):
  """The chat template cannot render what was asked, or not in a way the
  encoder can split into prompt, reply and observation tokens."""


def _read_json(path: str) -> dict:
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _token_text(value) -> str | None:
  """A special token in tokenizer_config.json: a string or {'content': ...}."""
  if isinstance(value, dict):
    return value.get('content')
  return value


def _environment() -> jinja2.Environment:
  env = sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True,
      extensions=['jinja2.ext.loopcontrols'])

  def tojson(x, ensure_ascii=False, indent=None, separators=None,
             sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)

  def raise_exception(message):
    raise TemplateError(f'chat template: {message}')

  env.filters['tojson'] = tojson
  env.globals['raise_exception'] = raise_exception
  env.globals['strftime_now'] = (
      lambda fmt: datetime.datetime.now().strftime(fmt))
  return env


class HFTokenizer:
  """`tokenizer.json` + its special tokens + its chat template."""

  def __init__(self, directory: str):
    path = os.path.join(directory, 'tokenizer.json')
    if not os.path.exists(path):
      raise FileNotFoundError(f'{directory}: no tokenizer.json')
    self.directory = directory
    self._tok = tokenizers.Tokenizer.from_file(path)
    self._plain = tokenizers.Tokenizer.from_file(path)
    self._plain.encode_special_tokens = True     # special text stays text
    config = _read_json(os.path.join(directory, 'tokenizer_config.json'))
    jinja_file = os.path.join(directory, 'chat_template.jinja')
    if os.path.exists(jinja_file):
      with open(jinja_file) as f:
        self.chat_template = f.read()
    else:
      self.chat_template = config.get('chat_template')
    if isinstance(self.chat_template, list):   # named templates
      named = {t['name']: t['template'] for t in self.chat_template}
      self.chat_template = named.get('default')
    self.specials = {k: _token_text(config[k]) for k in
                     ('bos_token', 'eos_token', 'pad_token', 'unk_token')
                     if _token_text(config.get(k))}
    gen = _read_json(os.path.join(directory, 'generation_config.json'))
    eos = gen.get('eos_token_id')
    if eos is None and 'eos_token' in self.specials:
      eos = self._tok.token_to_id(self.specials['eos_token'])
    if eos is None:
      raise ValueError(f'{directory}: no stop token (generation_config.json '
                       "eos_token_id or tokenizer_config.json's eos_token)")
    self.stop_ids = tuple(eos) if isinstance(eos, list) else (int(eos),)
    # The end of an assistant turn: the first stop id (Qwen3: <|im_end|>).
    self.im_end = self.stop_ids[0]
    pad = self.specials.get('pad_token')
    self.pad_id = (self._tok.token_to_id(pad) if pad is not None else
                   gen.get('pad_token_id', self.im_end))
    self._template = None
    if self.chat_template:
      try:
        self._template = _environment().from_string(self.chat_template)
      except jinja2.TemplateError as e:
        raise TemplateError(f'{directory}: the chat template does not '
                            f'compile: {e}') from e

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_text(self, text: str) -> list[int]:
    """Untrusted text: a special token written in it is encoded as text."""
    return self._plain.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

  def token_text(self, token_id: int) -> str:
    return self._tok.id_to_token(int(token_id))

  def save(self, path: str) -> None:
    raise ValueError('a Hugging Face tokenizer is kept as its files '
                     f'({self.directory}), not saved as one model file')

  # -------------------------------------------------------------- chat

  def render(self, messages: Sequence[dict], *, add_generation_prompt: bool,
             **kwargs: Any) -> str:
    """The conversation as the checkpoint's chat template writes it."""
    if self._template is None:
      raise TemplateError(f'{self.directory}: the tokenizer has no chat '
                          'template (tokenizer_config.json chat_template or '
                          'chat_template.jinja)')
    try:
      return self._template.render(
          messages=list(messages), add_generation_prompt=add_generation_prompt,
          **self.specials, **kwargs)
    except jinja2.TemplateError as e:
      raise TemplateError(f'{self.directory}: the chat template failed: '
                          f'{e}') from e

  def _through_stop(self, text: str, what: str) -> str:
    """`text` up to and including the first stop token written in it."""
    cut = [text.find(s) + len(s) for s in map(self.token_text, self.stop_ids)
           if s and s in text]
    if not cut:
      raise TemplateError(f'{self.directory}: the template writes no stop '
                          f'token after {what}')
    return text[:min(cut)]

  def _suffix(self, before: str, after: str, what: str) -> str:
    if not after.startswith(before):
      raise TemplateError(
          f'{self.directory}: the chat template renders the conversation '
          f'before {what} differently once {what} follows (it re-renders '
          'history), so its tokens cannot be split into turns')
    return after[len(before):]

  def prompt_text(self, messages: Sequence[dict]) -> str:
    return self.render(messages, add_generation_prompt=True)

  def reply_text(self, history: Sequence[dict], message: dict) -> str:
    """An assistant `message` after `history`, as the template writes it,
    through its stop token (what a sampler would emit after the prompt)."""
    before = self.render(history, add_generation_prompt=True)
    after = self.render(list(history) + [message],
                        add_generation_prompt=False)
    return self._through_stop(self._suffix(before, after, 'a reply'),
                              'the reply')

  def observation_text(self, history: Sequence[dict],
                       messages: Sequence[dict]) -> str:
    """What follows the last assistant turn's stop token in `history`: the
    environment's `messages`, then the next assistant turn's opening."""
    full = self.render(history, add_generation_prompt=False)
    ends = [full.rfind(s) + len(s) for s in map(self.token_text, self.stop_ids)
            if s and s in full]
    if not ends:
      raise TemplateError(f'{self.directory}: no stop token after the last '
                          'assistant turn')
    before = full[:max(ends)]
    after = self.render(list(history) + list(messages),
                        add_generation_prompt=True)
    return self._suffix(before, after, 'an observation')


def load_hf_tokenizer(directory: str) -> HFTokenizer:
  return HFTokenizer(directory)
