"""sentencepiece tokenizers: train on a corpus (cached in the run directory) or load a .model file."""

from __future__ import annotations

import io
import itertools
import os
import re
from collections.abc import Iterable, Sequence

import sentencepiece as spm

IM_START, IM_END = '<|im_start|>', '<|im_end|>'
THINK_START, THINK_END = '<think>', '</think>'
TOOL_START, TOOL_END = '<tool_call>', '</tool_call>'
# Newline, a four-space indent and a single space are symbols of their own
# (sentencepiece writes a space as U+2581 before matching them). A space is
# never merged into the word after it, so a word has the same pieces wherever
# it stands: 'fine' in "End with the word 'fine'." is the 'fine' a response
# ends with, and a record's value in "abc: teal" is the one in \boxed{teal}.
# Copying from the prompt is then copying tokens, which a small model learns
# quickly; with '▁fine' vs 'fine' it has to learn every word pair. Costs about
# 30% more tokens on the generated corpus. decode(encode(x)) == x holds.
SPACE = '\u2581'
SPECIALS = (IM_START, IM_END, THINK_START, THINK_END, TOOL_START, TOOL_END,
            '\n', SPACE * 4, SPACE)
PAD_ID = 0
# The chat's tags (not its whitespace symbols): untrusted text never yields them.
_TAG = re.compile('|'.join(map(re.escape, SPECIALS[:6])))


class Tokenizer:
  """A sentencepiece model plus the chat special tokens."""

  def __init__(self, model_proto: bytes):
    self.proto = model_proto
    self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
    missing = [s for s in (IM_START, IM_END)
               if self.sp.piece_to_id(s) == self.sp.unk_id()]
    if missing:
      raise ValueError(f'tokenizer lacks the chat tokens {missing}')
    self.im_start = self.sp.piece_to_id(IM_START)
    self.im_end = self.sp.piece_to_id(IM_END)
    self.stop_ids = (self.im_end,)     # the ids a reply ends at
    self.pad_id = PAD_ID

  @property
  def vocab_size(self) -> int:
    return self.sp.vocab_size()

  def encode(self, text: str) -> list[int]:
    return self.sp.encode(text)

  def encode_text(self, text: str) -> list[int]:
    """Untrusted text (tool output): a chat tag written in it (`<|im_end|>`,
    `<tool_call>`, ...) is encoded as its characters, never as the tag's id,
    so an observation cannot end a turn or open one. Text without tags
    encodes as `encode` does; `decode` gives the text back."""
    ids, at = [], 0
    for m in _TAG.finditer(text):
      tag = m.group()
      ids += (self.sp.encode(text[at:m.start()]) + self.sp.encode(tag[0]) +
              self.sp.encode(tag[1:]))
      at = m.end()
    return ids + self.sp.encode(text[at:])

  def decode(self, ids: Sequence[int]) -> str:
    return self.sp.decode([int(i) for i in ids if int(i) != self.pad_id])

  def save(self, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + '.tmp'
    with open(tmp, 'wb') as f:
      f.write(self.proto)
    os.replace(tmp, path)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
  """BPE over `texts`, digits split one per token, whitespace kept as is."""
  buf = io.BytesIO()
  # Every printable ASCII character gets a piece even if the corpus lacks it
  # (no byte fallback: other characters become <unk>).
  ascii_line = ''.join(chr(c) for c in range(33, 127))
  spm.SentencePieceTrainer.train(
      sentence_iterator=itertools.chain(texts, [ascii_line] * 2), model_writer=buf, vocab_size=vocab_size,
      model_type='bpe', user_defined_symbols=list(SPECIALS), pad_id=PAD_ID,
      unk_id=1, bos_id=-1, eos_id=-1, split_digits=True,
      character_coverage=1.0, byte_fallback=False,
      normalization_rule_name='identity', remove_extra_whitespaces=False,
      add_dummy_prefix=False, max_sentence_length=1 << 20,
      hard_vocab_limit=True, minloglevel=2, num_threads=1)
  return Tokenizer(buf.getvalue())


def load_tokenizer(path: str) -> Tokenizer:
  if not os.path.exists(path):
    raise FileNotFoundError(f'tokenizer model {path} does not exist')
  with open(path, 'rb') as f:
    return Tokenizer(f.read())


def get_tokenizer(path: str, texts: Iterable[str] | None,
                  vocab_size: int) -> Tokenizer:
  """The tokenizer at `path`, trained on `texts` and saved there first if absent."""
  if os.path.exists(path):
    return load_tokenizer(path)
  if texts is None:
    raise FileNotFoundError(f'tokenizer model {path} does not exist and no '
                            'corpus was given to train one')
  tok = train_tokenizer(texts, vocab_size)
  tok.save(path)
  return tok


def check_vocab(tok: Tokenizer, model_vocab_size: int) -> None:
  """A sentencepiece tokenizer must fill the model's vocabulary exactly; a
  Hugging Face one may be smaller (Qwen3: 151,669 ids, 151,936 rows)."""
  if not isinstance(tok, Tokenizer):
    if tok.vocab_size > model_vocab_size:
      raise ValueError(f'tokenizer has {tok.vocab_size} tokens, more than '
                       f'the model\'s vocab_size={model_vocab_size}')
    return
  if tok.vocab_size != model_vocab_size:
    raise ValueError(
        f'tokenizer has {tok.vocab_size} tokens but the model config has '
        f'vocab_size={model_vocab_size}; they must match')
