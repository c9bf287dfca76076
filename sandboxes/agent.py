"""The in-sandbox agent: PID 1 of every sandbox, serving JSON-lines requests on stdin/stdout.

This file runs *inside* the sandbox (``python3 -c <this source> <config json>``) with the standard
library only, under the sandbox's non-root user. One agent per sandbox keeps a process alive, so an
exec costs one fork+exec instead of a Docker exec round trip. It:

* runs each exec in its own session with capped, drained output and a hard deadline, then kills
  every process the exec left behind (daemonized ones too): all processes except itself and the
  live interpreter sessions' process trees;
* keeps stateful Python interpreters (``session_server.py``) on private pipes, restarting one that
  crashed or overran its deadline and saying so;
* puts/gets files under the writable roots only, refusing ``..`` escapes and symlinks;
* ignores signals (it is PID 1) and is not dumpable, so sandboxed code cannot ptrace it;
* when started as root (Docker), keeps no capability but setuid/setgid/kill, runs every exec and
  interpreter as the sandbox uid and touches files as that uid (``setfsuid``): sandboxed code then
  cannot signal, limit, re-nice, pin or re-prioritise it. Under bubblewrap it shares the sandbox
  uid, and each reset puts its state back or fails (``agent_clean.py``).

Requests: ``{"id", "op": exec|py|put|get|reset|inspect|ping, ...}``; every reply carries the same id.
"""

import base64
import json
import os
import resource
import select
import selectors
import signal
import stat
import subprocess
import sys
import time

if "scrub" not in globals():  # on a host (imports, linters); in the box base.py prepends the source
    from agentrl.sandboxes.agent_clean import (
        IPC_KINDS,
        MQUEUE_DIR,
        OverBudget,
        agent_state,
        clear_keyrings,
        key_list,
        net_state,
        own_threads,
        remove_ipc,
        restore_agent_state,
        root_state,
        scrub,
        sysv_ids,
        task_count,
        tree,
    )

CONFIG = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
WORK = CONFIG.get("work", "/work")
ROOTS = CONFIG.get("writable", [WORK, "/tmp"])
CLEAN_DIRS = CONFIG.get("clean", ROOTS + ["/dev/shm"])
OUTPUT_LIMIT = int(CONFIG.get("output_limit", 65536))
MEMORY_BYTES = CONFIG.get("memory_bytes")  # for the RSS watchdog (no cgroup, i.e. bubblewrap)
WATCHDOG = bool(CONFIG.get("watchdog", False))
RLIMITS = CONFIG.get("rlimits", {})  # name -> value, set on the agent and so inherited by every child
ENV = CONFIG.get("env", {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORK, "LANG": "C.UTF-8"})
GET_LIMIT = int(CONFIG.get("get_limit", 64 << 20))
RESET_BUDGET_S = float(CONFIG.get("reset_budget_s", 2.0))  # past it a reset fails: the box is replaced
SANDBOX_UID = int(CONFIG.get("sandbox_uid", 1000))
# tasks in the box's pids cgroup outside its pid namespace (bwrap's own monitor process)
OUTSIDE_TASKS = int(CONFIG.get("outside_tasks", 0))
# Set in main(): the uid that runs sandboxed code when the agent itself is root (Docker), else None.
RUN_AS = None
OWNER = SANDBOX_UID  # the uid that owns every file an episode can make
EMPTY_RESULT = {"ok": True, "stdout": "", "stderr": "", "exit_code": 0, "timed_out": False, "oom_killed": False,
                "truncated": False, "wall_s": 0.0, "cpu_s": 0.0, "peak_mem_bytes": 0}  # fmt: skip

SESSION_SOURCE = CONFIG.get("session_source", "")  # session_server.py, sent by the host


def bait_oom_killer(pid):
    """Make ``pid`` the kernel OOM killer's first choice, so a memory bomb dies, never the agent.

    Done from the parent after the spawn: a ``preexec_fn`` would force a slow fork+Python re-init
    in every child (~5-10 ms per exec, measured).
    """
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as handle:
            handle.write("1000")
    except OSError:
        pass


def process_table():
    """pid -> (ppid, state) for every process in this pid namespace."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        table[int(name)] = (int(fields[1]), fields[0].decode())
    return table


class Agent:
    def __init__(self):
        self.sessions = {}  # sid -> Popen of a live interpreter
        self.oom_flag = False
        self.unchecked = set()  # sessions that may have been killed since they last answered
        self.reaped = {}  # pid -> (status, rusage) of our own children reaped while waiting for others
        self.children = set()  # pids of execs and interpreters whose status someone will ask for
        self.selector = selectors.DefaultSelector()
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select() through the wakeup fd

    # ---------------------------------------------------------------- processes
    def reap(self):
        """Reap every exited child; keep the status only of our own execs and interpreters (an
        orphan's is dropped: kept, a later exec given the same pid would read it as its own)."""
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                self.children.discard(pid)
                self.reaped[pid] = (status, usage)

    def spawn(self, argv, **kwargs):
        """Popen as the sandbox uid (when the agent is root), remembered as our own child."""
        if RUN_AS is not None:
            kwargs.update(user=RUN_AS, group=RUN_AS, extra_groups=[])
        proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
        self.reaped.pop(proc.pid, None)
        self.children.add(proc.pid)
        bait_oom_killer(proc.pid)
        return proc

    def protected(self, table):
        keep = {os.getpid(), 1}
        frontier = [proc.pid for proc in self.sessions.values() if proc.pid in table]
        children = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        while frontier:
            pid = frontier.pop()
            keep.add(pid)
            frontier.extend(children.get(pid, ()))
        return keep

    def sweep(self):
        """Kill every process except the agent and live sessions' trees, until none is left.

        Zombies are not skipped: a thread group whose leader exited (raw ``exit`` while another
        thread runs) shows as one, and SIGKILL to its pid ends the whole group. A real zombie is
        gone once its parent dies and the agent (the pid namespace's init) reaps it."""
        if os.getpid() != 1:  # only ever inside the box's own pid namespace: never on a host
            raise SystemExit("agent: refusing to sweep processes when not PID 1")
        victims = []
        for _ in range(2000):
            self.reap()
            table = process_table()
            keep = self.protected(table)
            victims = [pid for pid in table if pid not in keep]
            if not victims:
                return []
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.001)
        return victims

    def sandbox_rss(self):
        """Memory of every process but the agent, shared pages counted once (PSS), like a cgroup."""
        total = 0
        for pid in process_table():
            if pid in (1, os.getpid()):
                continue
            try:
                with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
                    for line in handle:
                        if line.startswith(b"Pss:"):
                            total += int(line.split()[1]) * 1024
                            break
            except (OSError, ValueError, IndexError):
                pass
        return total

    # ---------------------------------------------------------------- output
    def pump(self, streams, deadline, done):
        """Read ``streams`` (fd -> Capture) until ``done()`` or the deadline; True on deadline."""
        for fd in streams:
            self.selector.register(fd, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        next_watch = time.monotonic()
        try:
            while True:
                if done():
                    return False
                now = time.monotonic()
                if now >= deadline:
                    return True
                if WATCHDOG and MEMORY_BYTES and now >= next_watch:
                    next_watch = now + 0.02
                    if self.sandbox_rss() > MEMORY_BYTES:
                        self.oom_flag = True
                        for proc in self.sessions.values():
                            signal_quietly(-proc.pid, signal.SIGKILL)
                        self.sweep()
                wait = min(deadline - now, 0.02 if WATCHDOG else 0.05)
                for key, _ in self.selector.select(max(wait, 0)):
                    if key.fd == self.wake_r:
                        try:
                            while os.read(self.wake_r, 512):
                                pass
                        except BlockingIOError:
                            pass
                        self.reap()
                        continue
                    chunk = os.read(key.fd, 1 << 20)
                    if chunk:
                        streams[key.fd].add(chunk)
                    else:
                        self.selector.unregister(key.fd)
                        streams[key.fd].eof = True
        finally:
            for fd in list(streams) + [self.wake_r]:
                try:
                    self.selector.unregister(fd)
                except (KeyError, ValueError):
                    pass

    # ---------------------------------------------------------------- ops
    def op_exec(self, request):
        self.unchecked = set(self.sessions)
        timeout = float(request.get("timeout", 10.0))
        env = dict(ENV, **request.get("env", {}))
        stdin_data = base64.b64decode(request["stdin"]) if request.get("stdin") is not None else None
        oom_before = oom_kill_count()
        self.oom_flag = False
        started = time.monotonic()
        try:
            proc = self.spawn(
                request["argv"],
                stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=request.get("cwd") or WORK,
                env=env,
            )
        except OSError as exc:
            reply = dict(EMPTY_RESULT, exit_code=127)
            reply["stderr"] = "cannot run {!r}: {}\n".format(request["argv"][0], exc)
            return reply
        if stdin_data is not None:
            try:
                proc.stdin.write(stdin_data)
            except BrokenPipeError:
                pass
            proc.stdin.close()
        out, err = Capture(), Capture()
        streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
        for fd in streams:
            enlarge_pipe(fd)

        exit_grace = [None]

        def done():
            # Finished once the main process is gone and its pipes closed; output that leftover
            # background processes hold open is waited for only briefly (they are killed next).
            if proc.pid not in self.reaped:
                return False
            if out.eof and err.eof:
                return True
            if exit_grace[0] is None:
                exit_grace[0] = time.monotonic() + 0.05
            return time.monotonic() >= exit_grace[0]

        timed_out = self.pump(streams, started + timeout, done)
        if timed_out:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.sweep()
        self.pump(streams, time.monotonic() + 1.0, lambda: out.eof and err.eof)
        proc.stdout.close()
        proc.stderr.close()
        status, usage = self.wait_for(proc.pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - started
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        oom = self.oom_flag or (oom_before is not None and (oom_kill_count() or 0) > oom_before)
        if WATCHDOG and MEMORY_BYTES and code != 0 and usage.ru_maxrss * 1024 >= MEMORY_BYTES:
            oom = True  # failed after outgrowing the limit before the watchdog looked (RLIMIT_AS hit)
        return {
            "ok": True,
            "stdout": out.text(),
            "stderr": err.text(),
            "exit_code": code,
            "timed_out": timed_out,
            "oom_killed": bool(oom and not timed_out),
            "truncated": out.dropped > 0 or err.dropped > 0,
            "wall_s": wall,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_mem_bytes": usage.ru_maxrss * 1024,
        }

    def wait_for(self, pid):
        while pid not in self.reaped:
            try:
                got, status, usage = os.wait4(pid, 0)
            except ChildProcessError:
                break
            self.reaped[got] = (status, usage)
        self.children.discard(pid)
        return self.reaped.pop(pid, (9, resource.getrusage(resource.RUSAGE_CHILDREN)))

    def start_session(self, sid):
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        proc = self.spawn(
            ["python3", "-u", "-c", SESSION_SOURCE, str(req_r), str(resp_w)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=WORK,
            env=ENV,
            pass_fds=(req_r, resp_w),
        )
        os.close(req_r)
        os.close(resp_w)
        proc.req_w, proc.resp_r = req_w, resp_r
        enlarge_pipe(proc.stdout.fileno())
        enlarge_pipe(proc.stderr.fileno())
        self.sessions[sid] = proc
        return proc

    def kill_session(self, sid):
        proc = self.sessions.pop(sid, None)
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for handle in (proc.stdout, proc.stderr):
            handle.close()
        for fd in (proc.req_w, proc.resp_r):
            os.close(fd)
        self.wait_for(proc.pid)
        proc.returncode = -9

    def session_alive(self, sid, proc):
        """True when the interpreter answers a ping; only asked after something else ran in the box
        (an exec or a reset may have killed it a moment ago, with its death not yet visible)."""
        self.reap()
        if proc.pid in self.reaped:
            return False
        if sid not in self.unchecked:
            return True
        try:
            os.write(proc.req_w, b'{"ping": true}\n')
        except BrokenPipeError:
            return False
        answer = b""
        deadline = time.monotonic() + 2.0
        while not answer.endswith(b"\n") and time.monotonic() < deadline:
            if select.select([proc.resp_r], [], [], max(deadline - time.monotonic(), 0))[0]:
                chunk = os.read(proc.resp_r, 4096)
                if not chunk:
                    return False
                answer += chunk
        return answer.endswith(b"\n")

    def op_py(self, request):
        sid = str(request.get("sid", "default"))
        timeout = float(request.get("timeout", 10.0))
        notes = []
        restarted = False
        died_note = "[python session had died since the last call; a fresh one runs this cell: earlier variables are lost]"
        proc = self.sessions.get(sid)
        if proc is not None and not self.session_alive(sid, proc):
            self.kill_session(sid)
            proc = None
            restarted = True
            notes.append(died_note)
        if proc is None:
            proc = self.start_session(sid)
        oom_before = oom_kill_count()
        self.oom_flag = False
        started = time.monotonic()
        os.write(proc.req_w, (json.dumps({"code": request["code"]}) + "\n").encode())
        out, err, reply = Capture(), Capture(), Capture()
        streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err, proc.resp_r: reply}

        def answered():
            return reply.raw.endswith(b"\n") or reply.eof or proc.pid in self.reaped

        timed_out = self.pump(streams, started + timeout, answered)
        if timed_out:  # first try KeyboardInterrupt, which keeps the variables
            signal_quietly(proc.pid, signal.SIGINT)
            self.pump(streams, time.monotonic() + 0.5, answered)
        for fd in (proc.stdout.fileno(), proc.stderr.fileno()):
            self.drain(fd, streams[fd])
        result = None
        if reply.raw.endswith(b"\n"):
            result = json.loads(reply.raw)
        exit_code = 0 if result and result["ok"] else 1
        if result is None:
            for _ in range(100):  # its reply pipe closed: the interpreter is exiting
                self.reap()
                if proc.pid in self.reaped:
                    break
                time.sleep(0.01)
            status = self.reaped.get(proc.pid, (None, None))[0]
            code = os.waitstatus_to_exitcode(status) if status is not None else -9
            exit_code = code if code >= 0 else 128 - code
            why = f"overran its {timeout:.3g} s deadline" if timed_out else f"crashed (exit {exit_code})"
            self.kill_session(sid)
            self.start_session(sid)
            restarted = True
            notes.append(f"[python session {why} and was restarted: all variables are lost]")
        self.sweep()
        self.unchecked.discard(sid)
        oom = self.oom_flag or (oom_before is not None and (oom_kill_count() or 0) > oom_before)
        stderr = err.text()
        if notes:
            stderr = (
                (stderr + "\n" if stderr and not stderr.endswith("\n") else stderr) + "\n".join(notes) + "\n"
            )
        usage = result or {}
        return {
            "ok": True,
            "stdout": out.text(),
            "stderr": stderr,
            "exit_code": exit_code,
            "timed_out": timed_out,
            "oom_killed": bool(oom),
            "truncated": out.dropped > 0 or err.dropped > 0,
            "restarted": restarted,
            "wall_s": time.monotonic() - started,
            "cpu_s": usage.get("cpu_s", 0.0),
            "peak_mem_bytes": usage.get("peak_mem_bytes", 0),
        }

    def drain(self, fd, capture):
        os.set_blocking(fd, False)
        try:
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                capture.add(chunk)
        except (BlockingIOError, OSError):
            pass
        finally:
            os.set_blocking(fd, True)

    def op_put(self, request):
        data = base64.b64decode(request["data"])
        fd = open_confined(request["path"], os.O_WRONLY | os.O_CREAT, int(request.get("mode", 0o644)))
        os.ftruncate(fd, 0)  # only now: the fd is known to be a regular file
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        return {"ok": True, "size": len(data)}

    def op_get(self, request):
        fd = open_confined(request["path"], os.O_RDONLY, 0)
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(GET_LIMIT + 1)
        if len(data) > GET_LIMIT:
            return {"ok": False, "error": f"file is larger than the get_file limit of {GET_LIMIT} bytes"}
        return {"ok": True, "data": base64.b64encode(data).decode()}

    def op_reset(self, request):
        """Kill everything, scrub the writable dirs, IPC objects and keyrings, put the agent's own
        state back, forget every exit status, then verify the box is as it was at start. The whole
        of it has a time budget (``reset_budget_s``); past it the reset fails."""
        started = time.monotonic()
        deadline = started + RESET_BUDGET_S
        for sid in list(self.sessions):
            self.kill_session(sid)
        problems = []
        left = self.sweep()
        if left:
            problems.append(f"processes survived 2000 kill rounds: {left[:8]}")
        try:
            for root in CLEAN_DIRS:
                problems += scrub(root, ORIGINAL.get(root), OWNER, deadline)
            with as_owner():  # SysV objects obey the euid, not the fsuid
                problems += remove_ipc(deadline)
                problems += clear_keyrings()
        except OverBudget as exc:
            problems.append(
                f"the reset ran past its {RESET_BUDGET_S:g} s budget (at {exc}); the box is replaced"
            )
        problems += restore_agent_state(START["agent"])
        self.reaped.clear()
        self.children.clear()
        settle(time.monotonic() + 0.5)
        problems += leftovers(self)
        if problems:
            return {"ok": False, "error": "reset could not clean the box: " + "; ".join(problems[:8])}
        return {"ok": True, "reset_s": time.monotonic() - started}

    def op_inspect(self, request):
        """What a fresh lease could observe of the box's state (the tests compare it across leases)."""
        return {"ok": True, "state": observable_state(self)}

    def op_ping(self, request):
        return {"ok": True, "pid": os.getpid(), "sessions": sorted(self.sessions)}

    def serve(self):
        out = sys.stdout.buffer
        out.write(
            (
                json.dumps({"ready": True, "pid": os.getpid(), "python": sys.version.split()[0]}) + "\n"
            ).encode()
        )
        out.flush()
        for line in sys.stdin.buffer:
            if not line.strip():
                continue
            request = json.loads(line)
            handler = getattr(self, "op_" + str(request.get("op")), None)
            try:
                if handler is None:
                    reply = {"ok": False, "error": "unknown op {!r}".format(request.get("op"))}
                else:
                    reply = handler(request)
            except (OSError, ValueError, KeyError) as exc:  # bad path, bad request: the caller's error
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            except Exception as exc:  # a bug or an episode's trap (e.g. RecursionError): say so, live on
                reply = {"ok": False, "error": f"agent failed: {type(exc).__name__}: {exc}"[:2000]}
            reply["id"] = request.get("id")
            out.write((json.dumps(reply) + "\n").encode())
            out.flush()


class Capture:
    """Keeps the first OUTPUT_LIMIT bytes of a stream and counts the rest."""

    def __init__(self):
        self.raw = b""
        self.dropped = 0
        self.eof = False

    def add(self, chunk):
        room = OUTPUT_LIMIT - len(self.raw)
        if room > 0:
            self.raw += chunk[:room]
        self.dropped += max(0, len(chunk) - max(room, 0))

    def text(self):
        text = self.raw.decode("utf-8", "replace")
        if self.dropped:
            text += (
                f"\n[output truncated: {self.dropped} more bytes were cut after the first {len(self.raw)}]\n"
            )
        return text


def signal_quietly(pid, signum):
    """kill(2) that ignores a target already gone (negative pid: a process group)."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def enlarge_pipe(fd):
    try:  # fewer wakeups when a program floods its output
        import fcntl

        fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ
    except OSError:
        pass


def oom_kill_count():
    """The cgroup's OOM-kill counter (v1 or v2), or None where no memory cgroup is visible."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            continue
    return None


def open_confined(path, flags, mode):
    """Open ``path`` (relative to WORK, or absolute inside a writable root) never following a symlink."""
    full = os.path.normpath(os.path.join(WORK, path))
    root = next((r for r in ROOTS if full == r or full.startswith(r.rstrip("/") + "/")), None)
    if root is None or full == root:
        raise ValueError("path {!r} is outside the sandbox's writable dirs {}".format(path, ", ".join(ROOTS)))
    parts = [p for p in full[len(root) :].split("/") if p]
    if ".." in path.split("/") and not full.startswith(WORK + "/"):
        raise ValueError(f"path {path!r} escapes the work dir")
    dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            if flags & os.O_CREAT:
                try:
                    os.mkdir(part, 0o755, dir_fd=dir_fd)
                except FileExistsError:
                    pass
            try:
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            except OSError as exc:
                raise ValueError(f"path {path!r}: {part!r} is a symlink or not a directory") from exc
            os.close(dir_fd)
            dir_fd = next_fd
        # O_NONBLOCK: opening a FIFO never waits for a peer (a socket or a FIFO without one: ENXIO).
        try:
            fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == 40:  # ELOOP: the last component is a symlink
                raise ValueError(f"path {path!r} is a symlink; symlinks are not followed") from exc
            if exc.errno in (6, 21):  # ENXIO (FIFO without a peer, socket), EISDIR
                raise ValueError(
                    not_regular(path, os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False))
                ) from exc
            raise
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise ValueError(not_regular(path, info))
        os.set_blocking(fd, True)
        return fd
    finally:
        os.close(dir_fd)


FILE_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
              stat.S_IFBLK: "a block device", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symlink"}  # fmt: skip


def not_regular(path, info):
    kind = FILE_KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
    return f"path {path!r} is {kind}; put_file/get_file transfer only regular files"


def observable_state(agent):
    """Everything the next lease could read of what an earlier one left (files, IPC, processes,
    keys, sockets) and the agent's own state."""
    agent.reap()
    state = {"roots": {root: root_state(root, OWNER) for root in CLEAN_DIRS}}
    state["trees"] = {root: tree(root) for root in CLEAN_DIRS}
    state["sysv"] = {kind: sysv_ids(kind) for kind in IPC_KINDS}
    state["mqueues"] = sorted(os.listdir(MQUEUE_DIR)) if os.path.isdir(MQUEUE_DIR) else None
    state["processes"] = sorted(pid for pid in process_table() if pid != os.getpid())
    tasks, source = task_count()
    expected = own_threads() + (OUTSIDE_TASKS if source == "cgroup" else 0)
    state["tasks"] = {"count": tasks, "counted_by": source, "expected": expected}
    state["sessions"] = sorted(agent.sessions)
    state["exit_statuses"] = sorted(agent.reaped)
    state["keys"] = key_list()
    state["net"] = net_state()
    state["agent"] = agent_state()
    return state


def leftovers(agent):
    """What a reset failed to remove, compared with the state recorded when the box started."""
    state = observable_state(agent)
    problems = [
        f"{root} still holds {len(entries)} entries" for root, entries in state["trees"].items() if entries
    ]
    for root, now in state["roots"].items():
        was = ORIGINAL.get(root)
        if was is not None and now != was:
            problems.append(f"{root} is {now}, was {was}")
    problems += [f"{len(ids)} SysV {kind} object(s) left" for kind, ids in state["sysv"].items() if ids]
    if state["mqueues"]:
        problems.append(f"{len(state['mqueues'])} POSIX message queue(s) left")
    if state["processes"] or state["sessions"]:
        problems.append(f"processes left: {state['processes']}")
    tasks = state["tasks"]
    if tasks["count"] != tasks["expected"]:
        problems.append(
            f"{tasks['count']} tasks in the box ({tasks['counted_by']}) where only the agent's "
            f"{tasks['expected']} should be"
        )
    if state["exit_statuses"]:
        problems.append(f"exit statuses kept: {state['exit_statuses'][:8]}")
    if state["keys"] != START["keys"]:
        problems.append(f"keys {state['keys']}, were {START['keys']}")
    if state["net"]:
        problems.append(f"network state left: {state['net']}")
    return problems


def settle(deadline):
    """Wait briefly for what the kernel frees after its processes die: sockets (a loopback close
    takes a moment) and unlinked keys (garbage-collected by a kernel worker)."""
    while (net_state() or key_list() != START["keys"]) and time.monotonic() < deadline:
        time.sleep(0.005)


class as_owner:
    """Run a block with the sandbox uid as effective uid when the agent is root (SysV IPC permission
    checks use it), then back to root with file access as the sandbox uid again."""

    def __enter__(self):
        if RUN_AS is not None:
            os.setegid(RUN_AS)
            os.seteuid(RUN_AS)

    def __exit__(self, *exc_info):
        if RUN_AS is not None:
            os.seteuid(0)
            os.setegid(0)
            set_fs_ids(RUN_AS)


def set_fs_ids(uid):
    """Check every file access against ``uid`` (the agent's other ids stay root)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.setfsgid(uid)
    libc.setfsuid(uid)
    if libc.setfsuid(-1) != uid:  # setfsuid returns the previous value; -1 changes nothing
        raise SystemExit("agent: setfsuid failed")


ORIGINAL = {}  # root -> root_state at start, what each reset restores and checks
START = {}  # the agent's own state, the keys and the sockets at start, what each reset checks


def new_session_keyring():
    """Join a fresh anonymous session keyring, so nothing the host's keyring holds is reachable
    (where seccomp forbids keyctl, as under Docker, keys are out of reach anyway)."""
    import ctypes
    import platform

    number = {"x86_64": 250, "aarch64": 219}.get(platform.machine())
    if number is None:
        return
    try:
        ctypes.CDLL(None, use_errno=True).syscall(number, 1, None)  # KEYCTL_JOIN_SESSION_KEYRING, NULL
    except (OSError, AttributeError):
        pass


def main():
    if os.getpid() != 1:
        # The agent kills every process it can see after each exec; that is only safe as PID 1 of
        # the sandbox's own pid namespace. Run outside one (on a host), it would kill the host.
        sys.stderr.write("agent.py must run as PID 1 of a sandbox pid namespace; refusing to start\n")
        sys.exit(2)
    # Default dispositions everywhere: the kernel drops any signal sent to a pid namespace's init
    # from inside it unless init handles it, so `kill -INT 1` is ignored instead of raising
    # KeyboardInterrupt here. (SIGPIPE stays ignored; Popen restores it in children.)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for name, value in RLIMITS.items():  # inherited by every exec and interpreter
        resource.setrlimit(getattr(resource, name), (value, value))
    try:  # not dumpable: same-uid sandboxed code cannot ptrace or read the agent's memory
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    except (OSError, AttributeError):
        pass
    os.umask(0o022)
    global RUN_AS, OWNER
    if os.geteuid() == 0:  # Docker: the agent stays root (setuid/setgid/kill only), code runs as the uid
        RUN_AS = SANDBOX_UID
        set_fs_ids(RUN_AS)
    else:
        OWNER = os.geteuid()
    new_session_keyring()
    with as_owner():
        clear_keyrings()  # so the baseline has the keyrings a reset leaves (the persistent one made)
    for root in CLEAN_DIRS:
        ORIGINAL[root] = root_state(root, OWNER)
    START.update(agent=agent_state(), keys=key_list())
    Agent().serve()


if __name__ == "__main__":
    main()
