"""Code that runs inside a sandboxed process (stdlib only; passed to `python -I -S -c`).

The trainer starts this as root (or as itself, in fallback mode) with a
control pipe whose fd number is argv[1]. It reads its job from there, confines itself, drops to
its sandbox uid, then plays one of three roles:

- `solution`: executes the untrusted program, then serves calls to its
  functions over two pipes. Values cross only as plain builtin data
  (`encode` rejects anything else), so an object whose `__eq__` always says
  True cannot leave the process.
- `judge`: runs the (trusted) tests with each entry point bound to a proxy
  that calls into the solution process, and writes the verdict to its own
  result pipe, which the solution process does not hold.
- `script`: executes the program and exits; stdout / stderr are captured.

Each sandboxed process is forked from a fork server (`serve`: this file
started once per trainer process, `python -I -S -c _boot.py serve SOCK
STATUS`) instead of starting an interpreter of its own: the trainer sends
a job's file descriptors over a Unix socket, the server forks, and the
child runs `main` as an exec'd process would, from its control pipe on.
The server never runs untrusted code and holds nothing but this file: a
child confines itself after the fork exactly as it would after an exec.

This file is executed as a script, so it must not import cascade_jax.
"""

import builtins
import ctypes
import json
import os
import resource
import signal
import struct
import sys

_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_PR_SET_NO_NEW_PRIVS = 38


# ------------------------------------------------------------ wire format


def read_exact(fd, n):
  buf = b''
  while len(buf) < n:
    chunk = os.read(fd, n - len(buf))
    if not chunk:
      raise EOFError('peer closed the pipe')
    buf += chunk
  return buf


def send(fd, obj):
  data = json.dumps(obj).encode()
  msg = struct.pack('>I', len(data)) + data
  while msg:
    msg = msg[os.write(fd, msg):]


def recv(fd, limit=64 << 20):
  (n,) = struct.unpack('>I', read_exact(fd, 4))
  if n > limit:
    raise ValueError(f'message of {n} bytes exceeds {limit}')
  return json.loads(read_exact(fd, n))


def encode(x, depth=0):
  """Plain builtin data to tagged JSON. Subclasses (e.g. an int whose
  __eq__ lies) are refused: `type(x) is int`, never isinstance."""
  if depth > 100:
    raise ValueError('value nested deeper than 100 levels')
  t = type(x)
  if x is None or t is bool or t is int or t is str:
    return x
  if t is float:
    return x if x == x and x not in (float('inf'), float('-inf')) else {
        'f': repr(x)}
  if t is list:
    return [encode(v, depth + 1) for v in x]
  if t is tuple:
    return {'t': [encode(v, depth + 1) for v in x]}
  if t is dict:
    return {'d': [[encode(k, depth + 1), encode(v, depth + 1)]
                  for k, v in x.items()]}
  if t is set or t is frozenset:
    return {'s' if t is set else 'fs': [encode(v, depth + 1) for v in x]}
  if t is bytes:
    return {'b': x.hex()}
  if t is complex:
    return {'c': [x.real, x.imag]}
  raise TypeError(f'value of type {t.__module__}.{t.__qualname__} is not '
                  'plain builtin data')


def decode(x):
  if isinstance(x, list):
    return [decode(v) for v in x]
  if isinstance(x, dict):
    (tag, v), = x.items()
    if tag == 'f':
      return float(v)
    if tag == 't':
      return tuple(decode(e) for e in v)
    if tag == 'd':
      return {_hashable(decode(k)): decode(val) for k, val in v}
    if tag in ('s', 'fs'):
      items = [_hashable(decode(e)) for e in v]
      return set(items) if tag == 's' else frozenset(items)
    if tag == 'b':
      return bytes.fromhex(v)
    if tag == 'c':
      return complex(*v)
    raise ValueError(f'unknown tag {tag!r}')
  return x


def _hashable(v):
  return tuple(_hashable(e) for e in v) if isinstance(v, list) else v


# ------------------------------------------------------------- confinement


def _libc():
  return ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
  if ret != 0:
    err = ctypes.get_errno()
    raise OSError(err, f'{what}: {os.strerror(err)}')


def _write(path, text):
  with open(path, 'w') as f:
    f.write(text)


def _keep_only_fds(*keep):
  """Closes every fd but stdin / stdout / stderr and `keep`."""
  lo = 3
  for fd in sorted(keep):
    os.closerange(lo, fd)
    lo = fd + 1
  os.closerange(lo, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _wait(pid):
  return os.waitpid(pid, 0)[1]


def _end_as(status):
  """Exits as a process with wait status `status` did (its signal re-raised)."""
  if os.WIFSIGNALED(status):
    sig = os.WTERMSIG(status)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if sig not in (signal.SIGKILL, signal.SIGSTOP):  # these cannot be handled
      signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
  os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 70)  # pylint: disable=protected-access


def _enter_pid_namespace(libc):
  """Called after unshare(CLONE_NEWPID): returns in a process of the new PID
  namespace, which sees only its own processes (a fresh /proc).

  This process (outside) forks the namespace's init, which mounts /proc,
  forks the process that returns here and reaps it; when init exits, the
  kernel kills whatever is left in the namespace (daemonised children too).
  The program is not init itself: init ignores signals it has no handler
  for (SIGXCPU from the CPU limit among them). The wait status travels
  back, so this process ends as the program did (exit code or signal), as
  the trainer sees it.
  """
  r, w = os.pipe()
  init = os.fork()
  if init:
    _keep_only_fds(r)
    status = _wait(init)
    data = os.read(r, 4)
    _end_as(struct.unpack('>i', data)[0] if len(data) == 4 else status)
  os.close(r)
  _check(libc.mount(b'proc', b'/proc', b'proc',
                    _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None), 'mount /proc')
  child = os.fork()
  if child:
    _keep_only_fds(w)
    os.write(w, struct.pack('>i', _wait(child)))
    os._exit(0)  # pylint: disable=protected-access
  os.close(w)


def confine(job):
  """Namespaces, a private read-only filesystem, rlimits, then drop to uid."""
  libc = _libc()
  lim = job['limits']
  root = os.geteuid() == 0
  flags = (_CLONE_NEWNET | _CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWUTS |
           _CLONE_NEWPID)
  isolated = False
  if job['namespaces']:
    outer_uid, outer_gid = os.geteuid(), os.getegid()
    if not root:
      flags |= _CLONE_NEWUSER
    if libc.unshare(flags) == 0:
      isolated = True
      if not root:  # become root of the new user namespace, for the mounts
        _write('/proc/self/setgroups', 'deny')
        _write('/proc/self/uid_map', f'0 {outer_uid} 1')
        _write('/proc/self/gid_map', f'0 {outer_gid} 1')
    elif job['require_isolation']:
      raise OSError(ctypes.get_errno(), 'unshare (network / mount / PID '
                    'namespaces) failed and isolation is required')
  uid = job['uid'] if root else os.getuid()
  if isolated:
    _check(libc.mount(None, b'/', None, _MS_REC | _MS_PRIVATE, None),
           'make mounts private')
    _enter_pid_namespace(libc)
    # Every existing mount read-only: the program may write only to its
    # fresh /tmp (and /dev/shm), which vanish with its mount namespace.
    with open('/proc/self/mountinfo') as f:
      points = [line.split()[4] for line in f]
    for p in sorted(set(points), key=len):
      libc.mount(None, p.encode(), None,
                 _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_REC,
                 None)  # some (proc, sysfs) refuse; they are not writable anyway
    tmp_opts = f"size={lim['tmpfs_bytes']},mode=700,uid={uid},gid={uid}"
    _check(libc.mount(b'tmpfs', b'/tmp', b'tmpfs', _MS_NOSUID | _MS_NODEV,
                      tmp_opts.encode()), 'mount /tmp')
    if os.path.isdir('/dev/shm'):
      libc.mount(b'tmpfs', b'/dev/shm', b'tmpfs', _MS_NOSUID | _MS_NODEV,
                 f'size=1m,mode=700,uid={uid},gid={uid}'.encode())
    os.chdir('/tmp')
  else:
    os.chdir(job['workdir'])
  rl = resource
  mem = lim['memory_bytes']
  for what, soft, hard in (
      (rl.RLIMIT_AS, mem, mem),
      (rl.RLIMIT_CPU, lim['cpu_seconds'], lim['cpu_seconds'] + 1),
      (rl.RLIMIT_FSIZE, lim['output_bytes'], lim['output_bytes']),
      (rl.RLIMIT_NOFILE, 64, 64),
      (rl.RLIMIT_CORE, 0, 0),
      (rl.RLIMIT_STACK, 64 << 20, 64 << 20)):
    rl.setrlimit(what, (soft, hard))
  if root:  # per-uid count: each sandbox slot has a uid of its own
    rl.setrlimit(rl.RLIMIT_NPROC, (lim['processes'], lim['processes']))
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
  _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 'no_new_privs')
  os.environ.clear()
  os.environ.update(job['env'])


# ------------------------------------------------------------------ roles


def _load(program):
  ns = {'__name__': '__solution__', '__builtins__': builtins}
  exec(compile(program, '<solution>', 'exec'), ns)  # pylint: disable=exec-used
  return ns


def role_solution(job):
  req, resp = job['fds']
  try:
    ns = _load(job['program'])
  except BaseException as e:  # pylint: disable=broad-except
    send(resp, {'load_error': f'{type(e).__name__}: {e}'[:2000]})
    return
  send(resp, {'ready': True})
  while True:
    try:
      call = recv(req)
    except EOFError:
      return
    try:
      fn = ns.get(call['name'])
      if not callable(fn):
        raise NameError(f"the program defines no function {call['name']!r}")
      out = {'value': encode(fn(*decode(call['args'])))}
    except BaseException as e:  # pylint: disable=broad-except
      out = {'raise': type(e).__name__ if type(e).__module__ == 'builtins'
             else 'Exception', 'msg': str(e)[:2000]}
    send(resp, out)


class SolutionError(Exception):
  """The solution process failed to answer (died, refused, bad data)."""


def role_judge(job):
  req, resp, result = job['fds']
  verdict = {'passed': False, 'calls': 0}
  try:
    try:
      hello = recv(resp)
    except EOFError:
      raise SolutionError('solution process exited while loading') from None
    if 'load_error' in hello:
      raise SolutionError('program failed to load: ' + hello['load_error'])

    def proxy(name):
      def call(*args):
        send(req, {'name': name, 'args': encode(list(args))})
        verdict['calls'] += 1
        try:
          out = recv(resp)
        except EOFError:
          raise SolutionError('solution process died') from None
        if 'raise' in out:
          exc = getattr(builtins, out['raise'], None)
          if not (isinstance(exc, type) and issubclass(exc, Exception)):
            exc = SolutionError
          raise exc(out['msg'])
        return decode(out['value'])
      call.__name__ = name
      return call

    ns = {'__name__': '__judge__'}
    if job.get('setup'):
      exec(compile(job['setup'], '<setup>', 'exec'), ns)  # pylint: disable=exec-used
    for name in job['entry_points']:
      ns[name] = proxy(name)
    ns['candidate'] = ns[job['entry_points'][0]]
    exec(compile(job['tests'], '<tests>', 'exec'), ns)  # pylint: disable=exec-used
    if callable(ns.get('check')):
      ns['check'](ns[job['entry_points'][0]])
    verdict['passed'] = True
  except BaseException as e:  # pylint: disable=broad-except
    verdict['error'] = f'{type(e).__name__}: {e}'[:2000]
  send(result, verdict)


def role_script(job):
  ns = {'__name__': '__main__', '__builtins__': builtins}
  exec(compile(job['program'], '<program>', 'exec'), ns)  # pylint: disable=exec-used


# ------------------------------------------------------------ fork server


def _reap(status_fd):
  """Reports every ended child as (pid, wait status) on `status_fd`."""
  while True:
    try:
      pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return
    if not pid:
      return
    os.write(status_fd, struct.pack('>ii', pid, status))


def serve(sock_fd, status_fd):
  """The fork server's loop; returns only in a forked child.

  A request is one message on the socket (a SOCK_SEQPACKET Unix socket)
  carrying file descriptors: the job's control pipe, stdin, stdout,
  stderr, the set-up pipe, then the job's own pipes. The server forks and
  answers with the child's pid (in a process group of its own: the
  trainer kills the group); every child's end is reported on `status_fd`
  as (pid, wait status). The server ends when the trainer closes the
  socket. In the child: stdio in place, every other descriptor closed,
  signals as at start; returns (control fd, set-up fd, the job's fds).
  """
  import select        # pylint: disable=g-import-not-at-top
  import socket        # pylint: disable=g-import-not-at-top
  sock = socket.socket(fileno=sock_fd)
  wake_r, wake_w = os.pipe()
  os.set_blocking(wake_r, False)
  os.set_blocking(wake_w, False)
  signal.set_wakeup_fd(wake_w)
  signal.signal(signal.SIGCHLD, lambda *_: None)
  while True:
    ready = select.select([sock, wake_r], [], [])[0]
    if wake_r in ready:
      try:
        os.read(wake_r, 4096)
      except BlockingIOError:
        pass
    _reap(status_fd)
    if sock not in ready:
      continue
    msg, fds, _, _ = socket.recv_fds(sock, 16, 64)
    if not msg:             # the trainer is gone
      os._exit(0)  # pylint: disable=protected-access
    pid = os.fork()
    if pid == 0:
      sock.detach()         # closed below by number, not again when freed
      signal.set_wakeup_fd(-1)
      signal.signal(signal.SIGCHLD, signal.SIG_DFL)
      os.setpgid(0, 0)
      control, stdin, stdout, stderr, setup, *extra = fds
      for i, fd in enumerate((stdin, stdout, stderr)):
        os.dup2(fd, i)
      _keep_only_fds(control, setup, *extra)
      return control, setup, extra
    try:
      os.setpgid(pid, pid)  # the child does too: whichever runs first
    except OSError:         # it has already ended
      pass
    for fd in fds:
      os.close(fd)
    sock.send(struct.pack('>i', pid))


def main():
  if sys.argv[1] == 'serve':
    control, setup_fd, fds = serve(int(sys.argv[2]), int(sys.argv[3]))
    job = recv(control)
    job.update(setup_fd=setup_fd, fds=fds)
  else:
    control = int(sys.argv[1])
    job = recv(control)
  os.close(control)
  setup = job['setup_fd']
  try:
    confine(job)
  except BaseException as e:  # pylint: disable=broad-except
    # On the set-up pipe (closed below, before any untrusted code runs, so
    # a program cannot fake it): the trainer tells a sandbox that failed to
    # start from a program that failed.
    msg = f'{type(e).__name__}: {e}'
    os.write(setup, msg.encode()[:4096])
    sys.stderr.write(f'sandbox set-up failed: {msg}\n')
    os._exit(70)  # pylint: disable=protected-access
  os.close(setup)
  {'solution': role_solution, 'judge': role_judge,
   'script': role_script}[job['role']](job)


if __name__ == '__main__':
  main()
