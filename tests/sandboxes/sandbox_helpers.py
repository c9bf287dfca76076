"""Shared helpers of the sandbox tests (a module, not conftest, so tests can import it)."""

from __future__ import annotations

# Small limits keep the bombs quick; the defaults are exercised by the benchmark and the pool.
TEST_LIMITS = {"memory_mb": 256, "pids": 64, "work_tmpfs_mb": 32, "output_limit": 65536}


def assert_usable(box, sessions: int = 0) -> None:
    """The sandbox still runs code and has no process left besides its agent (and ``sessions``)."""
    result = box.exec(["ps", "-e", "-o", "pid=,comm="], timeout=10)
    assert result.exit_code == 0, result
    processes = [line.split(None, 1) for line in result.stdout.strip().splitlines()]
    others = [(pid, comm) for pid, comm in processes if pid != "1" and comm != "ps"]
    assert len(others) == sessions and all(comm == "python3" for _, comm in others), processes
    assert box.exec("print(6 * 7)", timeout=10).stdout == "42\n"
