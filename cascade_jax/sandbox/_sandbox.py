"""Running untrusted, model-written Python: limits, isolation, verdicts, a parallel pool.

What the sandbox guarantees when the trainer runs as root on Linux (as on
these machines and in CI):

- Each program runs in a fresh process (forked from a small fork server
  that never runs untrusted code, or started as an interpreter of its own:
  `Sandbox(fork_server=...)`), in new network, mount, IPC, UTS and
  PID namespaces: no network at all (not even loopback is up), every
  existing mount re-mounted read-only, a private size-capped tmpfs as its
  working directory and /tmp, which disappears with it; it sees only its
  own processes (its /proc is its namespace's), and everything it started
  dies with the namespace's init when it ends.
- It runs under a uid of its own (one per pool slot, never shared with the
  trainer or another slot), with no supplementary groups and
  no_new_privs set, so it cannot signal, ptrace or write to the trainer,
  and setuid binaries do not help it.
- rlimits: address space, CPU seconds, processes (per uid: fork bombs stop
  at the limit), file size (which also caps its stdout / stderr), open files,
  no core dumps; a wall-clock limit on top.
- A minimal environment: nothing from the trainer's environment leaks in.
- Afterwards every process of its uid is killed (`kill(-1)` as that uid), so
  daemonised or re-sessioned children do not survive the verdict.
- A process whose set-up failed (namespaces, mounts, limits) reports it on a
  pipe that is closed before the program runs: the result's status is
  `SANDBOX_ERROR`, never a verdict on the program.
- Verdicts come from a separate judge process (another uid) that runs the
  tests and calls the program's functions over pipes; values cross as plain
  builtin data only. Exiting early, `sys.exit`, `os._exit`, printing
  "PASSED", patching the test helpers or returning objects with a lying
  `__eq__` cannot produce a pass.

What it does not do: it is not a VM. The program shares the kernel (a
kernel exploit escapes), can read world-readable files and can use the CPU
and memory up to its limits. Without root, it falls back to an unprivileged
user namespace for network / filesystem / PID isolation and to
process-group kills; in that mode the program runs as the trainer's uid
(outside its PID namespace it could not name the trainer's processes, but
shares its rlimits' accounting). Where even user namespaces are unavailable
it refuses to run (unless `require_isolation=False`, which also gives up
the network ban and the PID namespace: then processes that start a new
session can outlive the verdict).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import queue
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

from absl import logging

_BOOT = open(os.path.join(os.path.dirname(__file__), '_boot.py')).read()
_ENV = {'PATH': '/usr/bin:/bin', 'LANG': 'C.UTF-8', 'HOME': '/tmp',
        'TMPDIR': '/tmp', 'PYTHONDONTWRITEBYTECODE': '1',
        'PYTHONHASHSEED': '0'}
_MAX_SLOTS = 64
_KILL = shutil.which('kill', path='/usr/bin:/bin') or '/bin/kill'


@dataclasses.dataclass(frozen=True)
class Limits:
  wall_seconds: float = 10.0
  cpu_seconds: int = 10
  memory_bytes: int = 1 << 30
  processes: int = 32
  output_bytes: int = 1 << 20     # stdout, stderr and any file it writes
  tmpfs_bytes: int = 32 << 20     # its working directory


# The sandbox itself failed to start a process (namespaces, mounts, limits):
# says nothing about the program, and may not happen on a second try.
SANDBOX_ERROR = 'sandbox_error'


class _Child:
  """A process the fork server started: `pid` and `wait` as `Popen`'s."""

  def __init__(self, server: '_ForkServer', pid: int, generation: int):
    self.pid, self._server, self._generation = pid, server, generation
    self.returncode = None

  def wait(self, timeout: float | None = None) -> int:
    if self.returncode is None:
      self.returncode = self._server.wait(self.pid, self._generation, timeout)
    return self.returncode


class _ForkServer:
  """Starts sandbox processes by forking a small interpreter (`_boot.serve`).

  An interpreter's start (with the modules `_boot` imports) is about 18 ms
  of CPU on a laptop core, two of them a verdict; a fork of the server is
  well under one. One server per trainer process and interpreter, started
  at first use; requests are serialised (a fork each), exits come back on
  a pipe read by a thread. A server that died is replaced at the next
  request; what it had started is then waited for no longer (`wait` says
  killed).
  """

  def __init__(self, python: str):
    self.python = python
    self._lock = threading.Lock()       # one request at a time
    self._cond = threading.Condition()  # exit codes
    self._codes: dict[int, int] = {}
    self._dead: set[int] = set()        # generations whose server ended
    self._generation = 0
    self._sock = self._proc = None

  def _start(self):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    status_r, status_w = os.pipe()
    try:
      proc = subprocess.Popen(
          [self.python, '-I', '-S', '-c', _BOOT, 'serve',
           str(theirs.fileno()), str(status_w)],
          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
          pass_fds=(theirs.fileno(), status_w), env=_ENV,
          start_new_session=True, close_fds=True)
    except BaseException:
      ours.close()
      os.close(status_r)
      raise
    finally:
      theirs.close()
      os.close(status_w)
    self._generation += 1
    self._sock, self._proc = ours, proc
    threading.Thread(target=self._read_exits,
                     args=(status_r, self._generation, proc), daemon=True,
                     name='sandbox-fork-server').start()

  def _stop(self):
    if self._sock is not None:
      self._sock.close()
    if self._proc is not None:
      try:
        self._proc.kill()
      except OSError:
        pass
    self._sock = self._proc = None

  def _read_exits(self, fd: int, generation: int, proc: subprocess.Popen):
    buf = b''
    while True:
      chunk = os.read(fd, 4096)
      if not chunk:
        break
      buf += chunk
      done = len(buf) // 8 * 8
      with self._cond:
        for i in range(0, done, 8):
          pid, status = struct.unpack('>ii', buf[i:i + 8])
          self._codes[pid] = os.waitstatus_to_exitcode(status)
        self._cond.notify_all()
      buf = buf[done:]
    os.close(fd)
    proc.wait()
    with self._cond:
      self._dead.add(generation)
      self._cond.notify_all()

  def spawn(self, fds: Sequence[int]) -> _Child:
    """Forks a child holding `fds` (control pipe, stdin, stdout, stderr,
    set-up pipe, the job's pipes); a dead server is replaced, once."""
    with self._lock:
      for _ in range(2):
        if self._proc is None or self._proc.poll() is not None:
          self._stop()
          self._start()
        try:
          socket.send_fds(self._sock, [b'j'], list(fds))
          data = self._sock.recv(4)
        except OSError:
          data = b''
        if len(data) == 4:
          return _Child(self, struct.unpack('>i', data)[0], self._generation)
        logging.warning('sandbox: the fork server ended; starting another')
        self._stop()
    raise RuntimeError('sandbox: the fork server could not start a process')

  def wait(self, pid: int, generation: int, timeout: float | None) -> int:
    """`pid`'s exit code (-N: signal N), as `Popen.wait`."""
    end = None if timeout is None else time.monotonic() + timeout
    with self._cond:
      while pid not in self._codes:
        if generation in self._dead:   # nobody left to report it
          return -signal.SIGKILL
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
          raise subprocess.TimeoutExpired(f'sandbox process {pid}', timeout)
        self._cond.wait(left)
      return self._codes.pop(pid)


_SERVERS: dict[tuple[int, str], _ForkServer] = {}
_SERVERS_LOCK = threading.Lock()


def _fork_server(python: str) -> _ForkServer:
  """This process's fork server for `python` (a forked trainer makes its
  own: the parent's socket is the parent's)."""
  with _SERVERS_LOCK:
    key = (os.getpid(), python)
    if key not in _SERVERS:
      _SERVERS[key] = _ForkServer(python)
    return _SERVERS[key]


@dataclasses.dataclass
class _Proc:
  """A started sandbox process: its set-up pipe says whether set-up failed."""
  popen: subprocess.Popen | _Child
  uid: int
  workdir: str | None
  setup_r: int

  def setup_error(self) -> str:
    """What failed in its set-up ('' if it ran); call once it has ended."""
    try:
      return os.read(self.setup_r, 4096).decode(errors='replace')
    except BlockingIOError:     # set-up went on: the pipe was closed unwritten
      return ''                 # or a leftover holds it open


@dataclasses.dataclass(frozen=True)
class TestResult:
  """Outcome of running tests against a program."""
  passed: bool
  status: str        # 'passed' | 'failed' | 'timeout' | 'error' | SANDBOX_ERROR
  error: str = ''
  calls: int = 0     # calls the tests made into the program
  seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class ScriptResult:
  returncode: int | None
  status: str        # 'ok' | 'error' | 'timeout' | SANDBOX_ERROR
  stdout: str = ''
  stderr: str = ''
  seconds: float = 0.0


class _Slots:
  """Pool slots, process-wide: each slot owns two uids (program, judge)."""

  def __init__(self):
    self._free = queue.Queue()
    for i in range(_MAX_SLOTS):
      self._free.put(i)

  def uids(self, slot: int) -> tuple[int, int]:
    # Distinct per trainer process too, so that parallel test workers or
    # trainers on one machine never share (or kill) each other's uids.
    base = 1_000_000_000 + (os.getpid() % 1_000_000) * 2 * _MAX_SLOTS
    return base + 2 * slot, base + 2 * slot + 1

  def take(self) -> int:
    return self._free.get()

  def give(self, slot: int) -> None:
    self._free.put(slot)


_SLOTS = _Slots()


def _pids_of_uid(uid: int) -> list[int]:
  """Live (not zombie) processes whose real uid is `uid`."""
  pids = []
  for name in os.listdir('/proc'):
    if not name.isdigit():
      continue
    try:
      with open(f'/proc/{name}/status') as f:
        fields = dict(line.split(':', 1) for line in f if ':' in line)
    except OSError:
      continue
    if (int(fields.get('Uid', '-1 ').split()[0]) == uid and
        not fields.get('State', '').strip().startswith('Z')):
      pids.append(int(name))
  return pids


def _others_can_run(path: str) -> bool:
  """Whether a uid with no rights (other) can execute `path` and its stdlib."""
  path = os.path.realpath(path)
  d = path
  while d != '/':
    d = os.path.dirname(d)
    if not os.stat(d).st_mode & 0o001:
      return False
  return bool(os.stat(path).st_mode & 0o001)


def _find_python(is_root: bool) -> str:
  """An interpreter the sandbox uids can execute (the trainer's may live in
  /root, which they cannot enter)."""
  candidates = [sys.executable, sys._base_executable,  # pylint: disable=protected-access
                shutil.which('python3') or '', '/usr/bin/python3']
  for c in candidates:
    if c and os.path.exists(c) and (not is_root or _others_can_run(c)):
      return c
  raise RuntimeError(
      'sandbox: no Python interpreter that an unprivileged uid can execute '
      f'(tried {candidates}); install one (e.g. Debian python3) or pass '
      'python=')


class Sandbox:
  """Runs untrusted Python under `limits`; thread-safe; `workers` at a time."""

  def __init__(self, limits: Limits = Limits(), *, workers: int | None = None,
               require_isolation: bool = True, namespaces: bool = True,
               python: str | None = None, fork_server: bool = True):
    """`fork_server`: start each process by forking a fork server (about
    20 ms less CPU per process) rather than as an interpreter of its own;
    the confinement is the same."""
    self.limits = limits
    self.fork_server = fork_server
    self.workers = min(workers or os.cpu_count() or 1, _MAX_SLOTS)
    self.require_isolation = require_isolation
    self.namespaces = namespaces
    self.is_root = os.geteuid() == 0
    self._python = python or _find_python(self.is_root)
    self._pool = concurrent.futures.ThreadPoolExecutor(self.workers)

  # ----------------------------------------------------------- public API

  def run_tests(self, program: str, tests: str, entry_points: Sequence[str],
                *, setup: str = '') -> TestResult:
    """Runs `tests` (asserts, or a `check(candidate)` function) against `program`.

    `entry_points[0]` is also bound to `candidate`. `setup` is trusted code
    executed in the judge before the tests (helpers the tests use).
    """
    if not entry_points:
      raise ValueError('run_tests: at least one entry point is needed')
    t0 = time.perf_counter()
    slot = _SLOTS.take()
    try:
      return self._run_tests(program, tests, list(entry_points), setup, slot,
                             t0)
    finally:
      _SLOTS.give(slot)

  def run_tests_batch(self, jobs: Sequence[dict]) -> list[TestResult]:
    """Many `run_tests(**job)` in parallel on the pool, results in order."""
    return list(self._pool.map(lambda j: self.run_tests(**j), jobs))

  def run_scripts_batch(self, programs: Sequence[str]) -> list[ScriptResult]:
    """Many `run_script(program)` in parallel on the pool, results in order."""
    return list(self._pool.map(self.run_script, programs))

  def run_script(self, program: str, stdin: str = '') -> ScriptResult:
    """Runs `program` as __main__ with `stdin` as its standard input: exit
    code and capped stdout / stderr.

    Its exit code and output are the program's to choose: a verdict from
    them (stdin / stdout tests) compares the output with what is expected.
    """
    t0 = time.perf_counter()
    slot = _SLOTS.take()
    outdir = tempfile.mkdtemp(prefix='sandbox-out-')
    procs = []
    try:
      uid = _SLOTS.uids(slot)[0]
      with open(os.path.join(outdir, 'in'), 'w') as f:
        f.write(stdin)
      in_f = open(os.path.join(outdir, 'in'), 'rb')
      out_f = open(os.path.join(outdir, 'out'), 'wb')
      err_f = open(os.path.join(outdir, 'err'), 'wb')
      with in_f, out_f, err_f:
        proc = self._spawn(dict(role='script', program=program), uid, (),
                           out_f, err_f, stdin=in_f)
        procs.append(proc)
      try:
        rc = proc.popen.wait(timeout=self.limits.wall_seconds)
        status = 'ok' if rc == 0 else 'error'
      except subprocess.TimeoutExpired:
        rc, status = None, 'timeout'
      cap = self.limits.output_bytes
      read = lambda n: open(os.path.join(outdir, n), 'rb').read(cap).decode(
          errors='replace')
      out, err = read('out'), read('err')
    finally:
      setup_errors = self._cleanup(procs)
      shutil.rmtree(outdir, ignore_errors=True)
      _SLOTS.give(slot)
    if status == 'error' and setup_errors[0]:
      status, err = SANDBOX_ERROR, f'sandbox set-up failed: {setup_errors[0]}'
    return ScriptResult(rc, status, out, err, time.perf_counter() - t0)

  def close(self):
    self._pool.shutdown()

  # ---------------------------------------------------------- internals

  def _run_tests(self, program, tests, entry_points, setup, slot, t0):
    sol_uid, judge_uid = _SLOTS.uids(slot)
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    res_r, res_w = os.pipe()
    procs = []
    try:
      procs.append(self._spawn(
          dict(role='solution', program=program),
          sol_uid, (req_r, resp_w)))
      procs.append(self._spawn(
          dict(role='judge', tests=tests, setup=setup,
               entry_points=entry_points),
          judge_uid, (req_w, resp_r, res_w)))
      for fd in (req_r, req_w, resp_r, resp_w, res_w):
        os.close(fd)
      req_r = req_w = resp_r = resp_w = res_w = -1
      verdict = self._read_verdict(res_r, t0 + self.limits.wall_seconds)
    finally:
      for fd in (req_r, req_w, resp_r, resp_w, res_w, res_r):
        if fd >= 0:
          os.close(fd)
      setup_errors = self._cleanup(procs)
    dt = time.perf_counter() - t0
    why = [f'({role}): {e}' for role, e in zip(('program', 'judge'),
                                              setup_errors) if e]
    if why and not (verdict or {}).get('passed'):
      return TestResult(False, SANDBOX_ERROR,
                        f'sandbox set-up failed {why[0]}', 0, dt)
    if verdict is None:
      return TestResult(False, 'timeout',
                        f'no verdict within {self.limits.wall_seconds}s', 0, dt)
    if 'passed' not in verdict:
      return TestResult(False, 'error', verdict.get('error', ''), 0, dt)
    return TestResult(bool(verdict['passed']),
                      'passed' if verdict['passed'] else 'failed',
                      verdict.get('error', ''), verdict.get('calls', 0), dt)

  @staticmethod
  def _read_verdict(fd, deadline):
    buf = b''
    while True:
      left = deadline - time.perf_counter()
      if left <= 0:
        return None
      ready, _, _ = select.select([fd], [], [], left)
      if not ready:
        return None
      chunk = os.read(fd, 65536)
      if not chunk:
        break
      buf += chunk
    if len(buf) < 4:
      return {'error': 'judge exited without a verdict'}
    (n,) = struct.unpack('>I', buf[:4])
    try:
      return json.loads(buf[4:4 + n])
    except ValueError:
      return {'error': 'judge wrote a malformed verdict'}

  def _spawn(self, job, uid, fds, stdout=subprocess.DEVNULL,
             stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL):
    lim = self.limits
    workdir = None
    if not self.namespaces:
      workdir = tempfile.mkdtemp(prefix='sandbox-')
      if self.is_root:
        os.chown(workdir, uid, uid)
    job = dict(job, uid=uid, env=_ENV, namespaces=self.namespaces,
               require_isolation=self.require_isolation, workdir=workdir,
               limits=dict(cpu_seconds=int(lim.cpu_seconds),
                           memory_bytes=int(lim.memory_bytes),
                           processes=int(lim.processes),
                           output_bytes=int(lim.output_bytes),
                           tmpfs_bytes=int(lim.tmpfs_bytes)))
    ctl_r, ctl_w = os.pipe()
    setup_r, setup_w = os.pipe()
    os.set_blocking(setup_r, False)
    # `fds`: the job's pipes, in the order its role reads them.
    job['setup_fd'], job['fds'] = setup_w, list(fds)
    devnull = None
    try:
      if self.fork_server:
        std = []
        for f in (stdin, stdout, stderr):
          if f == subprocess.DEVNULL:
            if devnull is None:
              devnull = os.open(os.devnull, os.O_RDWR)
            f = devnull
          std.append(f if isinstance(f, int) else f.fileno())
        popen = _fork_server(self._python).spawn(
            [ctl_r, *std, setup_w, *fds])
      else:
        popen = subprocess.Popen(
            [self._python, '-I', '-S', '-c', _BOOT, str(ctl_r)],
            stdin=stdin, stdout=stdout, stderr=stderr,
            pass_fds=(ctl_r, setup_w, *fds), env=_ENV,
            start_new_session=True, close_fds=True)
    except BaseException:
      os.close(setup_r)
      os.close(ctl_w)
      raise
    finally:
      os.close(ctl_r)
      os.close(setup_w)
      if devnull is not None:
        os.close(devnull)
    data = json.dumps(job).encode()
    try:
      with os.fdopen(ctl_w, 'wb') as f:
        f.write(struct.pack('>I', len(data)) + data)
    except BrokenPipeError:
      pass  # it died at start; the verdict will say so
    return _Proc(popen, uid, workdir, setup_r)

  def _cleanup(self, procs) -> list[str]:
    """Kills `procs` and all they left; each one's set-up error ('' if none)."""
    for proc in procs:
      try:
        os.killpg(proc.popen.pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
    for proc in procs:
      try:
        proc.popen.wait(timeout=5)
      except subprocess.TimeoutExpired:
        pass
      if self.is_root:  # whatever escaped the process group
        self._kill_uid(proc.uid)
      if proc.workdir:
        shutil.rmtree(proc.workdir, ignore_errors=True)
    errors = [proc.setup_error() for proc in procs]
    for proc in procs:
      os.close(proc.setup_r)
    return errors

  def _kill_uid(self, uid, deadline_s: float = 10.0):
    """SIGKILL every process of `uid` (kill(-1) sent as that uid) until none
    is left: a process forked while the signal went out, or one slow to die
    on a loaded machine, is killed by a later round (10 rounds of 10 ms let
    a daemonised grandchild survive under load). Past `deadline_s` the
    survivors are named in the log."""
    end = time.monotonic() + deadline_s
    while True:
      pids = _pids_of_uid(uid)
      if not pids:
        return
      if time.monotonic() > end:
        logging.warning('sandbox: processes of uid %d survive SIGKILL: %s',
                        uid, pids)
        return
      subprocess.run(
          [_KILL, '-9', '-1'], user=uid, group=uid, extra_groups=[], env=_ENV,
          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
      time.sleep(0.01)
