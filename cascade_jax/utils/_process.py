"""Helper processes (a sampler, an evaluation) and their queues."""

import queue
import time


def stop_process(proc, inbox, outbox, *, timeout_s: float = 30.0) -> None:
  """Asks a helper process to stop (`('stop',)` on its `inbox`), reading
  what it still sends on `outbox` so that it can exit (a process blocked on
  a full pipe never does), ends it if it has not within `timeout_s`, then
  closes both queues."""
  if proc.is_alive():
    inbox.put(('stop',))
    deadline = time.monotonic() + timeout_s
    while proc.is_alive() and time.monotonic() < deadline:
      try:
        outbox.get(timeout=0.1)
      except queue.Empty:
        pass
    if proc.is_alive():
      proc.terminate()
  proc.join()
  for q in (inbox, outbox):
    q.cancel_join_thread()
    q.close()
