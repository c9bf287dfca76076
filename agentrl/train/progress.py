"""Progress a person can see, on a terminal and in a log: ``agentrl train`` prints every phase.

    progress = RunProgress(out_dir)               # console + out_dir/train.log
    with progress.phase("warm-up", total=40) as phase:
        for step in ...:
            phase.advance(loss=0.53)              # one line per step (or a bar on a terminal)

Every phase (model load, warm-up, each RL step's rollout / learner / eval) shows what it has done,
the last loss or reward, the time elapsed and an ETA for the phase. When stdout is not a terminal
(``| tee``, CI, nohup) each phase prints plain lines: one per step where a step is a unit of work
(``per_step=True``), and in any case one at least every ``every_s`` seconds (20 s by default)
from a heartbeat thread, so a slow step never looks like a hang. On a terminal a rich progress bar
is drawn instead. Every line also goes to ``out_dir/train.log``, flushed as it is written, and
everything printed through :attr:`RunProgress.console` (the trainer's metric lines and tables) is
copied there too, colour codes stripped.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from rich.console import Console

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def fmt_seconds(seconds: float) -> str:
    """``75.2`` -> ``1m15s``; ``3725`` -> ``1h02m``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    minutes, sec = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class _Tee:
    """A text stream for rich: writes to ``stream`` and, colour codes stripped, to ``log``."""

    def __init__(self, stream: IO[str], log: IO[str] | None):
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.stream.write(text)
        if self.log is not None:
            self.log.write(_ANSI.sub("", text))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        if self.log is not None:
            self.log.flush()

    def isatty(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def fileno(self) -> int:
        return self.stream.fileno()


class RunProgress:
    """The run's console and log file, and a factory of :class:`Phase` displays.

    Args:
        out_dir: ``train.log`` goes here (None: console only).
        enabled: False on non-zero ranks (nothing is printed or written).
        stream: where lines go (default ``sys.stdout``).
        tty: draw rich bars (default: whether ``stream`` is a terminal).
        every_s: the longest gap between two lines of a running phase without a terminal.
        append: keep an existing ``train.log`` (a resumed run).
    """

    def __init__(self, out_dir: str | Path | None = None, *, enabled: bool = True, stream: IO[str] | None = None,
                 tty: bool | None = None, every_s: float = 20.0, append: bool = False):  # fmt: skip
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.every_s = every_s
        self.log: IO[str] | None = None
        if enabled and out_dir is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            self.log = open(Path(out_dir) / "train.log", "a" if append else "w", encoding="utf-8")  # noqa: SIM115
        self.console = Console(file=_Tee(self.stream, self.log), soft_wrap=True, force_terminal=self.tty,
                               quiet=not enabled)  # fmt: skip
        self.lock = threading.Lock()
        self.last_s: dict[str, float] = {}  # phase name -> its last duration (ETA before a first unit ends)

    def print(self, text: str) -> None:
        """A line (rich markup allowed) on the console and in the log."""
        with self.lock:
            self.console.print(text)

    def line(self, text: str, *, console: bool = True) -> None:
        """A plain line (no markup) to the log, and to the console unless a bar shows it there."""
        if not self.enabled:
            return
        with self.lock:
            if console:
                self.stream.write(text + "\n")
                self.stream.flush()
            if self.log is not None:
                self.log.write(text + "\n")
                self.log.flush()

    def phase(self, name: str, total: int | None = None, *, unit: str = "step", per_step: bool = True,
              key: str | None = None) -> Phase:  # fmt: skip
        """A :class:`Phase` context manager; ``key`` names it for the ETA memory (default ``name``)."""
        return Phase(self, name, total, unit=unit, per_step=per_step, key=key or name)

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None
            self.console.file = _Tee(self.stream, None)


class Phase:
    """One phase's display: :meth:`advance` per unit done, :meth:`update` for the shown values."""

    def __init__(
        self, owner: RunProgress, name: str, total: int | None, *, unit: str, per_step: bool, key: str
    ):
        self.owner, self.name, self.total, self.unit, self.per_step, self.key = (
            owner,
            name,
            total,
            unit,
            per_step,
            key,
        )
        self.done = 0
        self.fields: dict[str, float | str] = {}
        self.t0 = self.last_line = time.perf_counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Any = None
        self._task: Any = None

    # -- what a line says
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def eta(self) -> float | None:
        """Seconds left: from the rate so far, or before the first unit from the last same phase."""
        elapsed = self.elapsed()
        if self.total and self.done:
            return elapsed / self.done * max(self.total - self.done, 0)
        last = self.owner.last_s.get(self.key)
        return None if last is None else max(last - elapsed, 0.0)

    def text(self, *, final: bool = False) -> str:
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        shown = "  ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.fields.items()
        )
        if final:
            timing = f"done in {fmt_seconds(self.elapsed())}"
        else:
            eta = self.eta()
            timing = f"elapsed {fmt_seconds(self.elapsed())}" + (
                f"  eta {fmt_seconds(eta)}" if eta is not None else ""
            )
        parts = [
            f"{self.name}:",
            f"{self.unit} {count}" if self.total is not None or self.done else "",
            shown,
            timing,
        ]
        return "  ".join(p for p in parts if p)

    # -- events
    def advance(self, n: int = 1, **fields: float | str) -> None:
        self.done += n
        self.fields.update(fields)
        if self._bar is not None:
            self._bar.update(self._task, advance=n, info=self._info())
        if self.per_step:
            self._emit()

    def update(self, **fields: float | str) -> None:
        self.fields.update(fields)
        if self._bar is not None:
            self._bar.update(self._task, info=self._info())

    def on_episode(self, key: str = "reward", value: Any = None) -> Any:
        """A runner ``on_episode`` callback: one unit per episode, ``key`` = mean so far of
        ``value(episode)`` (default: its outcome; failed episodes count 0)."""
        outcomes: list[float] = []

        def record(episode: Any) -> None:
            outcomes.append(0.0 if episode.failed else float(value(episode) if value else episode.outcome))
            self.advance(**{key: sum(outcomes) / len(outcomes)})

        return record

    def _info(self) -> str:
        return "  ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.fields.items()
        )

    def _emit(self, *, final: bool = False) -> None:
        self.last_line = time.perf_counter()
        # with a bar on the terminal the lines go to the log only
        self.owner.line(self.text(final=final), console=self._bar is None)

    def _heartbeat(self) -> None:
        every = self.owner.every_s
        while not self._stop.wait(timeout=min(every, 1.0)):
            if time.perf_counter() - self.last_line >= every:
                self._emit()

    # -- context manager
    def __enter__(self) -> Phase:
        if not self.owner.enabled:
            return self
        if self.owner.tty:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn(f"[bold]{self.name}[/bold]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                console=Console(file=self.owner.stream, force_terminal=True), transient=False,
            )  # fmt: skip
            self._bar.start()
            self._task = self._bar.add_task(self.name, total=self.total, info="")
        self._thread = threading.Thread(target=self._heartbeat, name=f"progress-{self.name}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if not self.owner.enabled:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if exc_type is None:
            self.owner.last_s[self.key] = self.elapsed()
            self._emit(final=True)
        else:
            self.owner.line(f"{self.name}: stopped after {fmt_seconds(self.elapsed())} ({exc_type.__name__})")


__all__ = ["Phase", "RunProgress", "fmt_seconds"]
