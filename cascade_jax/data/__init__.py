"""Tokenizer, chat template and the Grain SFT pipeline with packing."""

from cascade_jax.data._array_record import convert_chat_rows
from cascade_jax.data._array_record import fingerprint as tokenizer_fingerprint
from cascade_jax.data._chat import encode_conversation
from cascade_jax.data._chat_rows import ChatRowError
from cascade_jax.data._chat_rows import iter_chat_rows
from cascade_jax.data._chat_rows import load_chat_rows
from cascade_jax.data._chat import encode_example
from cascade_jax.data._chat import encode_observation
from cascade_jax.data._chat import encode_prompt
from cascade_jax.data._chat import encode_record
from cascade_jax.data._chat import render_observation
from cascade_jax.data._chat import render_prompt
from cascade_jax.data._hf_tokenizer import HFTokenizer
from cascade_jax.data._hf_tokenizer import load_hf_tokenizer
from cascade_jax.data._hf_tokenizer import TemplateError
from cascade_jax.data._pipeline import build_dataset
from cascade_jax.data._pipeline import packing_efficiency
from cascade_jax.data._pipeline import source_records
from cascade_jax.data._pipeline import SourceReport
from cascade_jax.data._pipeline import tokenize_records
from cascade_jax.data._tokenizer import check_vocab
from cascade_jax.data._tokenizer import get_tokenizer
from cascade_jax.data._tokenizer import load_tokenizer
from cascade_jax.data._tokenizer import Tokenizer
from cascade_jax.data._tokenizer import train_tokenizer
