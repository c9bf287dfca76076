"""Progress a person can see without a terminal (agentrl.train.progress)."""

from __future__ import annotations

import io
import time

import pytest

from agentrl.train.progress import RunProgress, fmt_seconds


def test_fmt_seconds():
    assert [fmt_seconds(s) for s in (3.25, 42, 75.2, 3725, -1)] == ["3.2s", "42s", "1m15s", "1h02m", "0.0s"]


def test_without_a_terminal_each_step_is_one_plain_line_with_elapsed_and_eta(tmp_path):
    out = io.StringIO()  # not a TTY, like `| tee log` or CI
    progress = RunProgress(tmp_path, stream=out, every_s=60)
    assert progress.tty is False
    with progress.phase("warm-up", 4) as phase:
        for loss in (2.0, 1.5, 1.25, 1.0):
            phase.advance(loss=loss)
    progress.print("[bold]step 1[/bold]  reward=0.5")
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("warm-up:  step 1/4  loss=2  elapsed ") and "  eta " in lines[0]
    assert lines[3].startswith("warm-up:  step 4/4  loss=1  elapsed ")
    assert lines[4].startswith("warm-up:  step 4/4  loss=1  done in ")
    assert lines[5] == "step 1  reward=0.5" and "\x1b" not in out.getvalue()  # no colour codes in a pipe
    assert (tmp_path / "train.log").read_text().splitlines() == lines  # the log has every line


def test_a_long_silent_phase_still_prints_every_few_seconds(tmp_path):
    out = io.StringIO()
    progress = RunProgress(tmp_path, stream=out, every_s=0.2)
    with progress.phase("model load", per_step=False):
        time.sleep(0.75)  # nothing advances: the heartbeat speaks
    heartbeats = [x for x in out.getvalue().splitlines() if x.startswith("model load:  elapsed ")]
    assert 2 <= len(heartbeats) <= 4, out.getvalue()
    assert out.getvalue().splitlines()[-1].startswith("model load:  done in ")


def test_episodes_are_throttled_and_the_eta_comes_from_the_rate_or_the_last_phase(tmp_path):
    out = io.StringIO()
    progress = RunProgress(None, stream=out, every_s=60)

    class Ep:
        def __init__(self, outcome, failed=False):
            self.outcome, self.failed = outcome, failed

    with progress.phase("step 1/2 rollout", 4, unit="episode", per_step=False, key="rollout") as phase:
        assert phase.eta() is None  # nothing done, no earlier rollout: no guess
        record = phase.on_episode()
        for ep in (Ep(1.0), Ep(0.0), Ep(1.0, failed=True), Ep(1.0)):
            record(ep)
        assert phase.fields == {"reward": 0.5} and phase.done == 4  # a failed episode counts 0
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[0]]  # only the closing line
    assert out.getvalue().startswith("step 1/2 rollout:  episode 4/4  reward=0.5  done in ")
    with progress.phase("step 2/2 rollout", 4, unit="episode", per_step=False, key="rollout") as phase:
        assert phase.eta() == pytest.approx(progress.last_s["rollout"], abs=0.05)


def test_an_eval_line_counts_what_its_key_names_not_the_partial_score():
    """A WebShop eval printed success=0.0547 (the mean score) and logged eval/success 0 (no score 1)."""
    progress = RunProgress(None, stream=io.StringIO(), every_s=60)

    class Ep:
        def __init__(self, outcome, failed=False):
            self.outcome, self.failed = outcome, failed

    with progress.phase("eval before RL", 4, unit="episode", per_step=False, key="eval") as phase:
        record = phase.on_episode("success", lambda ep: 1.0 if ep.outcome >= 1.0 else 0.0)
        for ep in (Ep(0.5), Ep(1.0), Ep(0.25), Ep(1.0, failed=True)):
            record(ep)
        assert phase.fields == {"success": 0.25}  # one solved of four; partial scores count 0


def test_a_failing_phase_says_so_and_stops_its_heartbeat(tmp_path):
    out = io.StringIO()
    progress = RunProgress(tmp_path, stream=out, every_s=0.05)
    with pytest.raises(RuntimeError), progress.phase("learner", per_step=False):
        raise RuntimeError("boom")
    text = out.getvalue()
    time.sleep(0.2)
    assert out.getvalue() == text and text.splitlines()[-1].startswith("learner: stopped after ")


def test_rank_other_than_zero_prints_nothing(tmp_path):
    out = io.StringIO()
    progress = RunProgress(tmp_path, enabled=False, stream=out, every_s=0.05)
    with progress.phase("warm-up", 2) as phase:
        phase.advance(loss=1.0)
    progress.print("hello")
    assert out.getvalue() == "" and not (tmp_path / "train.log").exists()


def test_on_a_terminal_a_bar_is_drawn_and_the_log_still_gets_plain_lines(tmp_path):
    out = io.StringIO()
    progress = RunProgress(tmp_path, stream=out, tty=True, every_s=60)
    with progress.phase("warm-up", 2) as phase:
        phase.advance(loss=1.5)
        phase.advance(loss=1.0)
    progress.close()
    assert "\x1b[" in out.getvalue() and "━" in out.getvalue()  # rich's bar, with terminal codes
    log = (tmp_path / "train.log").read_text().splitlines()
    assert log[0].startswith("warm-up:  step 1/2  loss=1.5  elapsed ") and log[-1].startswith(
        "warm-up:  step 2/2"
    )
    assert "\x1b" not in "".join(log)
