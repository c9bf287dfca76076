"""Servers the tests start as subprocesses end with the test run, however it ends: the same
``setpriv --pdeathsig TERM`` wrapping that ``agentrl study`` gives its runs (a killed test run, by
SIGKILL or a CI timeout, leaves no ``agentrl serve`` behind holding a port and memory)."""

from __future__ import annotations

from agentrl.study.orchestrator import dies_with_parent as dies_with_tests

__all__ = ["dies_with_tests"]
