"""A small Hugging Face tokenizer directory for tests: a byte-level BPE
`tokenizer.json` trained here, a Qwen3-style chat template (tool results
grouped in user turns inside <tool_response>, <think> blocks dropped before
the last user query) and Qwen3's two stop ids."""

import json
import os

import tokenizers

SPECIALS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>', '<think>',
            '</think>', '<tool_call>', '</tool_call>', '<tool_response>',
            '</tool_response>']

TEMPLATE = """\
{%- set ns = namespace(last_query=messages|length - 1) %}
{%- for message in messages[::-1] %}
{%- set i = messages|length - 1 - loop.index0 %}
{%- if message.role == 'user' and ns.last_query == messages|length - 1 and \
not message.content.startswith('<tool_response>') %}
{%- set ns.last_query = i %}
{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- elif message.role == 'assistant' %}
{%- set content = message.content %}
{%- if '</think>' in content and loop.index0 < ns.last_query %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}
{%- endif %}
{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

CORPUS = ['What is 2 + 3? The answer is 5.', 'Call the tool with x = 4.',
          'def f(x):\n    return x * 2\n', 'The weather is fine today.',
          'Think step by step, then answer.'] * 20


def write_tokenizer(path: str) -> str:
  """Writes the tokenizer's files into `path`; returns it."""
  os.makedirs(path, exist_ok=True)
  bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
  bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=False)
  bpe.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=300, special_tokens=SPECIALS,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  bpe.train_from_iterator(CORPUS, trainer)
  bpe.save(os.path.join(path, 'tokenizer.json'))
  json.dump(dict(tokenizer_class='PreTrainedTokenizerFast',
                 eos_token='<|im_end|>', pad_token='<|endoftext|>',
                 chat_template=TEMPLATE),
            open(os.path.join(path, 'tokenizer_config.json'), 'w'))
  ids = {s: bpe.token_to_id(s) for s in SPECIALS}
  json.dump(dict(eos_token_id=[ids['<|im_end|>'], ids['<|endoftext|>']],
                 pad_token_id=ids['<|endoftext|>']),
            open(os.path.join(path, 'generation_config.json'), 'w'))
  return path
