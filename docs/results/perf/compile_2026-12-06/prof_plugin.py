"""Per-test compile profile: JAX's monitoring events summed per test."""
import collections, json, os, time
import pytest

_cur = collections.Counter()
_OUT = os.environ.get('PROF_OUT', '/tmp/prof')

def _dur(event, secs, **kw):
  _cur[event] += secs

def _evt(event, **kw):
  _cur['n:' + event] += 1

_registered = False

def _register():
  global _registered
  if _registered:
    return
  import jax
  jax.monitoring.register_event_duration_secs_listener(_dur)
  jax.monitoring.register_event_listener(_evt)
  _registered = True

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  _register()
  _cur.clear()
  t = time.time()
  yield
  rec = {'test': item.nodeid, 'wall': time.time() - t}
  rec.update({k: round(v, 3) for k, v in _cur.items()})
  os.makedirs(_OUT, exist_ok=True)
  with open(os.path.join(_OUT, f'{os.getpid()}.jsonl'), 'a') as f:
    f.write(json.dumps(rec) + '\n')
