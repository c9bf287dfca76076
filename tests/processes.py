"""Servers the tests start as subprocesses end with the test run, however it ends."""

from __future__ import annotations

import shutil


def dies_with_tests(command: list[str]) -> list[str]:
    """``command`` run under util-linux ``setpriv --pdeathsig TERM``: the kernel sends it SIGTERM when
    the test process that started it dies, so a killed test run (SIGKILL, a CI timeout) leaves no
    ``agentrl serve`` behind holding a port and memory. Unchanged where ``setpriv`` is missing."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *command] if setpriv else list(command)
