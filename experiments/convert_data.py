"""Converts chat-messages SFT files (JSONL / Parquet) into one ArrayRecord file of tokenised examples.

  python -m experiments.convert_data --chat=/data/sft/math.parquet,/data/sft/chat.jsonl \
      --run=runs/qwen3 --seq_len=16384 --out=/data/sft/mix.array_record

then train on it like any chat file:

  python -m experiments.sft --config=configs/sft.py --config.init_from=runs/qwen3 \
      --config.data.chat_files=/data/sft/mix.array_record=1 --config.data.seq_len=16384

The tokenizer is the run's (`--run`: tokenizer.model or hf_tokenizer/, the
weights are not read) or a file (`--tokenizer`: a sentencepiece .model or a
Hugging Face tokenizer directory). Rows are read one at a time; records
longer than --seq_len or with no response are skipped and counted (or
refused with --too_long=error / --empty=error). Writes OUT and OUT.json
(tokenizer fingerprint, seq_len, loss_on, per file: rows, skipped, examples,
tokens), which a run checks before reading (cascade_jax/data/_array_record.py).
"""

import json
import os

from absl import app
from absl import flags

from cascade_jax import data
from cascade_jax import train
from cascade_jax import utils

_CHAT = flags.DEFINE_list('chat', None, 'Chat-messages files (.jsonl, .json, '
                          '.parquet).', required=True)
_OUT = flags.DEFINE_string('out', None, 'The .array_record file to write.',
                           required=True)
_RUN = flags.DEFINE_string('run', '', 'A run whose tokenizer to use.')
_TOKENIZER = flags.DEFINE_string('tokenizer', '', 'A sentencepiece .model '
                                 'file or a Hugging Face tokenizer directory.')
_SEQ_LEN = flags.DEFINE_integer('seq_len', None, 'The longest example kept '
                                '(a run reading the file needs data.seq_len '
                                'at least this).', required=True)
_LOSS_ON = flags.DEFINE_enum('loss_on', 'assistant', ['assistant', 'all'],
                             'Which tokens the loss is on (as data.loss_on).')
_TOO_LONG = flags.DEFINE_enum('too_long', 'skip', ['skip', 'error'],
                              'Records over --seq_len.')
_EMPTY = flags.DEFINE_enum('empty', 'skip', ['skip', 'error'],
                           'Records with no response.')
_ON_ERROR = flags.DEFINE_enum('on_error', 'raise', ['raise', 'skip'],
                              'Malformed rows.')


def tokenizer(run: str, path: str):
  if bool(run) == bool(path):
    raise app.UsageError('give one of --run and --tokenizer')
  if run:
    tok = train.run_tokenizer(run)
    if tok is None:
      raise FileNotFoundError(f'{run} has no tokenizer (tokenizer.model or '
                              'hf_tokenizer/)')
    return tok
  return (data.load_hf_tokenizer(path) if os.path.isdir(path)
          else data.load_tokenizer(path))


def main(argv):
  del argv
  utils.quiet_logs()
  if not _OUT.value.endswith('.array_record'):
    raise app.UsageError('--out must end in .array_record (how a run tells '
                         'a converted file from a chat file)')
  meta = data.convert_chat_rows(
      tokenizer(_RUN.value, _TOKENIZER.value), _CHAT.value, _OUT.value,
      seq_len=_SEQ_LEN.value, loss_on=_LOSS_ON.value,
      too_long=_TOO_LONG.value, empty=_EMPTY.value, on_error=_ON_ERROR.value)
  meta['provenance'] = utils.provenance()
  with open(_OUT.value + '.json', 'w') as f:
    json.dump(meta, f, indent=1)
  print(utils.format_table(
      ['file', 'rows', 'malformed', 'too long', 'empty', 'examples', 'tokens'],
      [[os.path.basename(r['file']), r['rows'], r['malformed'], r['too_long'],
        r['empty'], r['examples'], r['tokens']] for r in meta['files']]))
  print(f"[convert_data] wrote {meta['examples']} examples to {_OUT.value} "
        f"({meta['seconds']} s)")


if __name__ == '__main__':
  app.run(main)
