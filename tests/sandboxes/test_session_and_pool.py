"""The stateful interpreter and the pool, on every backend: state persists, crashes and timeouts
restart the interpreter and say so, a box lost mid-episode is replaced and the run goes on."""

from __future__ import annotations

import os
import select
import signal
import threading
import time

import pytest
from sandbox_helpers import TEST_LIMITS, assert_usable

from agentrl.errors import ConfigError, SandboxError, SandboxLost
from agentrl.registry import SANDBOX_BACKENDS
from agentrl.sandboxes import SandboxPool, make_sandbox


def test_session_keeps_variables_and_echoes_the_last_expression(sandbox):
    session = sandbox.python_session("state")
    assert session.run("x = 40\ndef f(y):\n    return x + y").stdout == ""
    assert session.run("f(2)").stdout == "42\n"
    result = session.run("import sys\nprint('out'); print('err', file=sys.stderr)\nNone")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 0)
    error = session.run("1 / 0")
    assert error.exit_code == 1 and "ZeroDivisionError" in error.stderr and "<cell>" in error.stderr
    assert "agent" not in error.stderr  # only the cell's own frames are shown
    assert session.run("x").stdout == "40\n"  # an error keeps the state
    other = sandbox.python_session("other")
    assert "NameError" in other.run("x").stderr  # sessions are separate
    syntax = session.run("def (")
    assert syntax.exit_code == 1 and "SyntaxError" in syntax.stderr
    assert not session.restarted


def test_session_timeout_interrupts_and_keeps_state(sandbox):
    session = sandbox.python_session("interrupt")
    session.run("kept = 'yes'")
    result = session.run("while True:\n    pass", timeout=1.0)
    assert result.timed_out and not result.restarted and "KeyboardInterrupt" in result.stderr
    assert session.run("kept").stdout == "'yes'\n"


def test_session_that_ignores_interrupts_is_restarted_and_says_so(sandbox):
    session = sandbox.python_session("stubborn")
    session.run("kept = 1")
    stubborn = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    result = session.run(stubborn, timeout=1.0)
    assert result.timed_out and result.restarted
    assert "restarted" in result.stderr and "variables are lost" in result.stderr
    assert result.usage.wall_s < 5
    after = session.run("kept")
    assert "NameError" in after.stderr and not after.restarted  # fresh interpreter, no state
    assert session.run("1 + 1").stdout == "2\n"


def test_session_crash_is_reported_and_replaced(sandbox):
    session = sandbox.python_session("crash")
    session.run("v = 1")
    crashed = session.run("import os\nos._exit(3)")
    assert crashed.restarted and crashed.exit_code == 3 and "crashed (exit 3)" in crashed.stderr
    assert "NameError" in session.run("v").stderr
    session.run("v = 2")
    killed = sandbox.exec(["sh", "-c", "kill -KILL -1"], timeout=5)  # kills the interpreter too
    assert not killed.timed_out
    after = session.run("1")
    assert after.restarted and "had died" in after.stderr and after.stdout == "1\n"


def test_session_memory_bomb_is_oom(sandbox):
    session = sandbox.python_session("bomb")
    result = session.run("chunks = []\nwhile True:\n    chunks.append(bytearray(8 << 20))", timeout=20)
    assert result.oom_killed and result.restarted, result
    assert session.run("2 * 21").stdout == "42\n"


def test_session_output_is_capped_and_escaped_children_die(sandbox):
    session = sandbox.python_session("output")
    result = session.run("print('y' * 300_000)")
    assert result.truncated and "[output truncated:" in result.stdout
    assert len(result.stdout) < TEST_LIMITS["output_limit"] + 200
    spawn = "import subprocess\nkept = subprocess.Popen(['sleep', '77'])\nsubprocess.run(['sh', '-c', 'setsid sleep 78 &'])"
    assert session.run(spawn).exit_code == 0
    processes = sandbox.exec(["ps", "-e", "-o", "args="], timeout=5).stdout
    assert "sleep 77" in processes  # the session's own child is part of its state
    assert "sleep 78" not in processes  # a detached one is not
    session.run("kept.kill(); kept.wait()")


def test_reset_kills_sessions_and_empties_work_dir(sandbox):
    session = sandbox.python_session("reset")
    session.run("z = 5")
    sandbox.put_file("left.txt", b"x")
    sandbox.reset()
    assert sandbox.exec(["ls", "-A", "/work", "/tmp"], timeout=5).stdout.split() == ["/tmp:", "/work:"]
    assert "NameError" in session.run("z").stderr
    sandbox.reset()
    assert_usable(sandbox)


def kill_from_outside(box) -> None:
    """What an operator or a daemon hiccup does: the box vanishes under the episode."""
    if box.backend == "docker":
        from agentrl.sandboxes.docker_backend import docker_client

        docker_client().api.remove_container(box.container_id, force=True)
    else:
        os.kill(box.process.pid, signal.SIGKILL)


def wait_until_dead(box) -> None:
    """bwrap's agent dies a moment after bwrap (parent-death signal): wait for its pipe to close."""
    if box.backend == "bwrap":
        fd = box.process.stdout.fileno()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and select.select([fd], [], [], 0.1)[0] == []:
            pass


def test_box_removed_mid_episode_is_replaced_and_the_run_goes_on(backend):
    with SandboxPool(backend, size=1, **TEST_LIMITS) as pool:
        with pool.lease() as box:
            box.put_file("state.txt", b"episode state")
            session = box.python_session()
            session.run("answer = 42")
            killer = threading.Timer(0.5, kill_from_outside, args=(box,))
            killer.start()
            started = time.monotonic()
            with pytest.raises(SandboxLost, match="sandbox lost.*state.*gone"):
                box.exec(["sleep", "30"], timeout=60)
            assert time.monotonic() - started < 10  # detected promptly, not at the timeout
            killer.join()
            assert box.exec("print('fresh box')", timeout=10).stdout == "fresh box\n"
            with pytest.raises(SandboxError):
                box.get_file("state.txt")  # the old state is gone, as the error said
            restarted = session.run("1 + 1")
            assert restarted.stdout == "2\n"
        assert pool.stats.lost == 1
        with pool.lease() as box:  # the pool still serves
            assert_usable(box)


def test_box_killed_between_episodes_is_replaced_at_lease(backend):
    with SandboxPool(backend, size=1, **TEST_LIMITS) as pool:
        with pool.lease():
            pass
        pool.wait_ready()
        first = pool.idle_sandboxes()[0]  # the next lease's: scrubbed (Docker) or new (bwrap recycles)
        created = pool.stats.created
        kill_from_outside(first)
        wait_until_dead(first)
        with pool.lease() as box:
            assert box.exec("print(3)", timeout=10).stdout == "3\n"
        # The health check at lease time saw it dead and a fresh box took its place.
        assert pool.stats.replaced_unhealthy == 1 and pool.stats.lost == 0
        assert pool.stats.created == created + 1
        assert box is not first


def test_pool_leases_are_isolated_and_thread_safe(backend):
    errors: list[BaseException] = []
    seen: list[str] = []
    with SandboxPool(backend, size=2, max_uses=3, **TEST_LIMITS) as pool:

        def episode(index: int) -> None:
            try:
                with pool.lease(timeout=60) as box:
                    listing = box.exec(["ls", "-A", "/work"], timeout=10).stdout
                    seen.append(listing)
                    box.put_file(f"episode-{index}.txt", str(index).encode())
                    assert box.get_file(f"episode-{index}.txt") == str(index).encode()
            except BaseException as exc:  # collected and re-raised in the main thread
                errors.append(exc)

        threads = [threading.Thread(target=episode, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert seen == [""] * 8  # no episode saw another's files
        pool.wait_ready()
        stats = pool.stats
        assert stats.leases == 8 and stats.resets + stats.recycled + stats.replaced_expired == 8, stats
        assert stats.reset_failures == 0 and stats.start_failures == 0
        if pool.reset == "scrub":
            assert stats.replaced_expired >= 2  # max_uses=3 over 8 leases on 2 boxes
        else:
            assert stats.recycled == 8 and stats.created == 2 + pool.spares + 8
    with pytest.raises(SandboxError, match="closed"):
        with pool.lease():
            pass


def test_pool_lease_timeout_when_all_are_busy(backend):
    with SandboxPool(backend, size=1, **TEST_LIMITS) as pool:
        with pool.lease():
            with pytest.raises(SandboxError, match="no sandbox became free"):
                with pool.lease(timeout=0.2):
                    pass


def test_make_sandbox_rejects_bad_config():
    with pytest.raises(ConfigError, match="sandbox.memroy_mb"):
        make_sandbox("bwrap", memroy_mb=1)
    with pytest.raises(ConfigError, match="positive"):
        make_sandbox("bwrap", memory_mb=0)
    with pytest.raises(ConfigError, match="sandbox.backend"):
        make_sandbox("qemu")
    assert {"docker", "bwrap"} <= set(SANDBOX_BACKENDS.names())


def test_closed_sandbox_refuses_until_started_again(backend):
    box = make_sandbox(backend, **TEST_LIMITS)
    assert box.exec("print(5)", timeout=10).stdout == "5\n"  # first use starts it
    box.close()
    with pytest.raises(SandboxError, match="closed"):
        box.exec("print(1)", timeout=10)
    box.start()
    assert box.exec("print(6)", timeout=10).stdout == "6\n"
    box.close()
    box.close()  # twice is fine


def freeze(box) -> None:
    """A hiccup: the box stops answering without dying (paused container, stopped agent)."""
    if box.backend == "docker":
        from agentrl.sandboxes.docker_backend import docker_client

        docker_client().api.pause(box.container_id)
    else:
        agent = int(open(f"/proc/{box.process.pid}/task/{box.process.pid}/children").read().split()[0])
        os.kill(agent, signal.SIGSTOP)  # from outside its pid namespace, so it is not ignored


def test_hung_box_is_declared_lost_and_replaced(backend, monkeypatch):
    import agentrl.sandboxes.base as base

    monkeypatch.setattr(base, "AGENT_GRACE_S", 1.0)  # host-side slack past the exec's own timeout
    with make_sandbox(backend, **TEST_LIMITS) as box:
        box.exec("print(0)", timeout=5)
        freeze(box)
        started = time.monotonic()
        with pytest.raises(SandboxLost, match="stopped answering"):
            box.exec("print(1)", timeout=1.0)
        assert time.monotonic() - started < 6
        assert box.exec("print(2)", timeout=10).stdout == "2\n"
        assert box.lost_count == 1
