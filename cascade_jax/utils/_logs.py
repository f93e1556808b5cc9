"""Launcher log level: library info lines (Orbax, XLA) off unless --verbosity asks for them."""

from absl import flags
from absl import logging


def quiet_logs() -> None:
  """Call at the top of an absl main: warnings and errors only, by default."""
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
