"""The ``chat:URL#model`` agent end to end over real HTTP (scripted chat servers in chat_servers.py) on a
GAIA split as people download it: native tool calls, the text protocol, a hung request, a failing
server, and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from chat_servers import ScriptedChat, write_gaia_download

from agentrl.eval.chat_agent import action_from_reply, split_observation
from agentrl.eval.model_agent import ModelEvalConfig
from agentrl.eval.runner import evaluate
from agentrl.eval.suites import parse_suite
from agentrl.serve.server import BackgroundServer


def _suite(root: Path, *extra: str):
    return parse_suite("gaia", [f"data_dir={root}", "python=false", *extra])


def _run(root: Path, server: ScriptedChat, concurrency: int = 3, **settings):
    with BackgroundServer(server.app) as http:
        return evaluate(
            _suite(root),
            f"chat:{http.url}#scripted",
            concurrency=concurrency,
            settings=ModelEvalConfig.resolve(**settings),
        )


def test_native_tool_calls_score_every_task_of_gaia_as_downloaded(tmp_path: Path) -> None:
    records = write_gaia_download(tmp_path)
    server = ScriptedChat(records)
    result = _run(tmp_path, server)
    assert [r["error"] for r in result.records] == [None] * len(records)
    assert result.metrics["overall"]["success_rate"] == 1.0
    # absent and LFS-pointer attachments are kept, marked and all listed
    assert result.metrics["attachment_problems"] == [
        {"task_id": "t-missing", "file_name": "t-missing.xlsx", "problem": "missing"},
        {"task_id": "t-lfs", "file_name": "t-lfs.docx", "problem": "lfs_pointer"},
    ]
    # the env's tool schemas went out as `tools`, results came back as role "tool" messages
    assert all(b["tools"][0]["function"]["name"] == "read_file" for b in server.bodies)
    seen = server.tool_results
    assert "ZIP archive t-zip.zip with 2 file(s)" in seen["t-zip"] and "ANSWER=zip42" in seen["t-zip"]
    assert "PNG image, 8x4 pixels" in seen["t-png"] and "cannot see" in seen["t-png"]
    assert "## Slide 2\nANSWER=slide7" in seen["t-pptx"]
    assert "missing from this copy" in seen["t-missing"]
    assert "Git-LFS pointer" in seen["t-lfs"] and "git lfs pull" in seen["t-lfs"]
    assert "audio file" in seen["t-mp3"]
    # latency and token usage per turn are in the episode record
    turn = next(e for e in result.episodes if e.task_id == "t-csv").turns[0]
    assert turn.action_text.startswith('<tool_call>\n{"name": "read_file"')
    assert turn.timings["latency_s"] > 0 and turn.timings["completion_tokens"] == 7
    assert result.metrics["settings"]["tool_protocol"] == "native"
    # the exact conversation is kept per episode
    (transcript,) = [t for t in result.transcripts if t["task_id"] == "t-csv"]
    messages = transcript["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[3]["tool_call_id"] == "call_t-csv" and "ANSWER=17" in messages[3]["content"]
    assert messages[4]["content"].endswith("FINAL ANSWER: 17") and messages[4]["usage"]["prompt_tokens"] == 50
    assert all("usage" not in m for b in server.bodies for m in b["messages"])  # records never go out


def test_text_protocol_for_servers_without_tool_calling(tmp_path: Path) -> None:
    records = write_gaia_download(tmp_path)
    server = ScriptedChat(records)
    result = _run(tmp_path, server, tool_protocol="text")
    assert result.metrics["overall"]["success_rate"] == 1.0
    assert not any("tools" in b for b in server.bodies)
    system = server.bodies[0]["messages"][0]["content"]
    assert "Tools (JSON schemas)" in system and '"name": "read_file"' in system


def test_image_attachments_as_content_parts(tmp_path: Path) -> None:
    records = write_gaia_download(tmp_path)
    server = ScriptedChat(records)
    result = _run(tmp_path, server, images=True)
    assert result.metrics["overall"]["success_rate"] == 1.0
    firsts = {
        b["messages"][1]["content"][0]["text"] if isinstance(b["messages"][1]["content"], list) else "": b
        for b in server.bodies
        if len(b["messages"]) == 2
    }
    with_image = [text for text in firsts if text]
    assert len(with_image) == 1 and "t-png.png" in with_image[0]
    part = firsts[with_image[0]]["messages"][1]["content"][1]
    assert part["type"] == "image_url" and part["image_url"]["url"].startswith(
        "data:image/png;base64,iVBORw0KGgo"
    )


def test_a_hung_request_costs_only_its_own_episode(tmp_path: Path) -> None:
    records = write_gaia_download(tmp_path, hang=True, extra=12)
    server = ScriptedChat(records)
    result = _run(tmp_path, server, concurrency=2, episode_timeout_s=3, request_timeout_s=1, max_retries=5)
    by_id = {r["task_id"]: r for r in result.records}
    hung = by_id.pop("t-hang")
    assert hung["error"] and "no answer within 1s (--request-timeout-s" in hung["error"]
    assert hung["ground_truth"] == "7" and hung["bucket"] == "episode error"
    assert all(r["error"] is None and r["success"] == 1.0 for r in by_id.values())
    # one hang costs one request timeout: not retried (max_retries=5 notwithstanding), not replayed
    assert server.hung == 1 and hung["replayed_errors"] == []


def test_agentrl_eval_exits_1_when_more_episodes_crash_than_max_failed(tmp_path: Path, capsys) -> None:
    """The command's own path (`run_eval`): one hung task of twelve crashes (8%); the outputs are
    written and score it unsolved either way, and the exit code says whether that is more than
    `--max-failed` allows (default 5%)."""
    from agentrl.eval.runner import run_eval

    records = write_gaia_download(tmp_path / "gaia", hang=True, extra=2)
    server = ScriptedChat(records)
    codes = {}
    with BackgroundServer(server.app) as http:
        for share in (0.05, 0.2):
            out = tmp_path / f"out-{share}"
            codes[share] = run_eval(
                suite="gaia", agent=f"chat:{http.url}#scripted", suite_options=[f"data_dir={tmp_path / 'gaia'}", "python=false"],
                concurrency=4, out=out, settings={"episode_timeout_s": 3, "request_timeout_s": 1}, max_failed=share,
            )  # fmt: skip
            metrics = json.loads((out / "metrics.json").read_text())
            assert (metrics["episode_errors"], metrics["max_failed"], metrics["overall"]["tasks"]) == (
                1,
                share,
                len(records),
            )
            assert "--max-failed " + str(share) in metrics["command"]
            assert "## Episode errors" in (out / "report.md").read_text()
    assert len(records) == 12 and codes == {0.05: 1, 0.2: 0}
    err = capsys.readouterr().err
    assert "eval failed: 1 of 12 episodes crashed, more than --max-failed 0.05 allows" in err
    assert "[eval] max_failed = 0.2  (--max-failed, default 0.05)" in err
    assert run_eval(suite="gaia", agent="oracle", max_failed=1.5) == 2
    assert "--max-failed must be a share in [0, 1], got 1.5" in capsys.readouterr().err


def test_a_crashed_episode_is_replayed_and_keeps_its_first_error(tmp_path: Path, capsys) -> None:
    """`agentrl eval`'s path: a task whose first request fails (a sporadic HTTP 500) is replayed with
    its own task and seed and solved; the record keeps the first error, metrics count the replay, and
    the run passes --max-failed. With --replays 0 the same run crashes that episode and exits 1."""
    from agentrl.eval.runner import run_eval

    records = write_gaia_download(tmp_path / "gaia", hang=True, extra=2)
    codes = {}
    for replays in (2, 0):
        server = ScriptedChat(records, hang_times=1, flaky="500")
        out = tmp_path / f"out-{replays}"
        with BackgroundServer(server.app) as http:
            codes[replays] = run_eval(
                suite="gaia", agent=f"chat:{http.url}#scripted", suite_options=[f"data_dir={tmp_path / 'gaia'}", "python=false"],
                concurrency=4, out=out, settings={"episode_timeout_s": 3, "request_timeout_s": 10, "max_retries": 0}, replays=replays,
            )  # fmt: skip
        metrics = json.loads((out / "metrics.json").read_text())
        by_id = {r["task_id"]: r for r in map(json.loads, (out / "records.jsonl").read_text().splitlines())}
        hung = by_id.pop("t-hang")
        assert all(
            r["error"] is None and r["success"] == 1.0 and r["replayed_errors"] == [] for r in by_id.values()
        )
        assert (metrics["replays"], "--replays " + str(replays) in metrics["command"]) == (replays, True)
        if replays:
            assert hung["success"] == 1.0 and hung["error"] is None
            assert (
                len(hung["replayed_errors"]) == 1
                and "HTTP 500: sporadic failure" in hung["replayed_errors"][0]
            )
            assert (metrics["replayed_episodes"], metrics["episode_errors"]) == (1, 0)
            report = (out / "report.md").read_text()
            assert (
                "## Replayed episodes (1)" in report
                and "- t-hang#0: 1 crash(es), then success 1; first: " in report
            )
        else:
            assert hung["success"] == 0.0 and "HTTP 500: sporadic failure" in hung["error"]
            assert (metrics["replayed_episodes"], metrics["episode_errors"]) == (0, 1)
    assert codes == {2: 0, 0: 1}
    err = capsys.readouterr().err
    assert "[eval] 1 of 12 episodes crashed (first: agentrl.rollout.generators.http.RequestFailed: " in err
    assert "replaying them (1/2, --replays)" in err


def test_a_crashed_sample_of_a_token_level_agent_replays_its_group(tmp_path: Path) -> None:
    """The rollout engine runs a task's k samples as one group: a crashed sample replays the group,
    and only the crashed sample is replaced."""
    from chat_servers import ScriptedCompletions

    from agentrl.rollout.model import load_tokenizer

    records = write_gaia_download(tmp_path, hang=True, extra=3)
    server = ScriptedCompletions(records, load_tokenizer("smollm2-135m"), hang_times=1, flaky="500")
    settings = ModelEvalConfig.resolve(episode_timeout_s=3, request_timeout_s=1, max_retries=0)
    suite = parse_suite("gaia:k=2,python=false", [f"data_dir={tmp_path}"])
    with BackgroundServer(server.app) as http:
        result = evaluate(
            suite, f"openai:{http.url}#smollm2-135m", concurrency=4, settings=settings, replays=1
        )
    hung = [r for r in result.records if r["task_id"] == "t-hang"]
    assert len(hung) == 2 and all(r["error"] is None and r["success"] == 1.0 for r in hung)
    assert sorted(len(r["replayed_errors"]) for r in hung) == [0, 1]
    assert result.metrics["replayed_episodes"] == 1 and server.hung == 1
    assert all(r["error"] is None for r in result.records)


@pytest.mark.parametrize("mode", ["500", "garbage"])
def test_a_failing_server_fails_every_episode_fast(tmp_path: Path, mode: str) -> None:
    records = write_gaia_download(tmp_path, extra=30)
    server = ScriptedChat(records, mode=mode)
    result = _run(tmp_path, server, concurrency=4, max_retries=2)
    assert len(result.records) == len(records) and all(r["error"] for r in result.records)
    expected = "HTTP 500" if mode == "500" else "invalid JSON"
    assert all(expected in r["error"] for r in result.records)
    # the circuit breaker opened after 8 requests failed for good: the rest were never sent
    assert sum("not sending more" in r["error"] for r in result.records) >= len(records) - 8 - 4
    assert server.requests <= (8 + 4) * 3


def test_cli_user_path_with_a_comma_in_the_data_path(tmp_path: Path) -> None:
    root = tmp_path / "GAIA, as downloaded" / "2023"
    records = write_gaia_download(root)
    server = ScriptedChat(records)
    agentrl_bin = str(Path(sys.executable).parent / "agentrl")
    env = {k: v for k, v in os.environ.items() if k != "AGENTRL_GAIA_DIR"}
    with BackgroundServer(server.app) as http:
        done = subprocess.run(
            [agentrl_bin, "eval", "--suite", "gaia:python=false", "--suite-option", f"data_dir={root}"]
            + [
                "--agent",
                f"chat:{http.url}#scripted",
                "--episode-timeout-s",
                "60",
                "--out",
                str(tmp_path / "out"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
    assert done.returncode == 0, done.stderr
    assert "episode_timeout_s = 60.0  (--episode-timeout-s)" in done.stderr
    assert "request_timeout_s = 90.0  (default)" in done.stderr
    assert "a request that never answers costs about 60 s" in done.stderr
    assert "success 100.0%" in done.stdout and "2 task(s) with an unavailable attachment" in done.stdout
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Tasks with an unavailable attachment (2)" in report
    assert "- t-lfs: t-lfs.docx (lfs pointer)" in report
    transcripts = (tmp_path / "out" / "transcripts.jsonl").read_text().splitlines()
    assert len(transcripts) == len(records) and json.loads(transcripts[0])["messages"][0]["role"] == "system"
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["settings"]["sources"]["episode_timeout_s"] == "--episode-timeout-s"
    # no data: a clear error, never the fixture
    for argv, expected in [
        (["--suite", "gaia"], "no GAIA data folder was given"),
        (["--suite", "gaia:data_dir=~/no-such-gaia"], f"{Path.home()}/no-such-gaia does not exist"),
    ]:
        failed = subprocess.run(
            [agentrl_bin, "eval", *argv, "--agent", "random"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert failed.returncode == 2 and expected in failed.stderr and "gaia-fixture" in failed.stderr


def test_level_filter_and_skipping_unavailable_attachments(tmp_path: Path) -> None:
    import agentrl

    write_gaia_download(tmp_path)
    env = agentrl.make("agentrl/GAIA-Real-v0", data_dir=str(tmp_path), level=1)
    assert {t.id for t in env.unwrapped.tasks()} == {"t-plain", "t-csv", "t-missing", "t-mp3"}
    env = agentrl.make("agentrl/GAIA-Real-v0", data_dir=str(tmp_path), skip_missing_attachments=True)
    assert {"t-missing", "t-lfs"}.isdisjoint(t.id for t in env.unwrapped.tasks())
    assert len(env.unwrapped.tasks()) == 7


def test_reply_to_action_and_observation_split() -> None:
    calls = [
        {"id": "a", "function": {"name": "read_file", "arguments": '{"file_name": "x.csv"}'}},
        {"id": "b", "function": {"name": "python", "arguments": '{"code": "print(1'}},  # malformed JSON
    ]
    action = action_from_reply({"content": "thinking", "tool_calls": calls})
    # the valid call in the one Hermes format of agentrl.actions; the malformed one left as sent
    assert action.split("\n", 3) == [
        "<tool_call>",
        '{"name": "read_file", "arguments": {"file_name": "x.csv"}}',
        "</tool_call>",
        '<tool_call>{"name": "python", "arguments": {"code": "print(1}</tool_call>',
    ]
    assert action_from_reply({"content": "FINAL ANSWER: 3"}) == "FINAL ANSWER: 3"
    combined = "[read_file] a | b\n\nrow\n\n[python] 1\n"
    assert split_observation(combined, ["read_file", "python"]) == ["a | b\n\nrow", "1\n"]
    assert split_observation("no headers here", ["read_file", "python"]) is None
    assert split_observation("one", ["read_file"]) == ["one"]


def test_settings_resolve_cli_over_environment_over_default(monkeypatch) -> None:
    monkeypatch.setenv("AGENTRL_EVAL_EPISODE_TIMEOUT_S", "30")
    monkeypatch.setenv("AGENTRL_EVAL_REQUEST_TIMEOUT_S", "5")
    config = ModelEvalConfig.resolve(episode_timeout_s=12)
    assert (config.episode_timeout_s, config.request_timeout_s, config.max_retries) == (12.0, 5.0, 2)
    assert config.sources["episode_timeout_s"] == "--episode-timeout-s"
    assert config.sources["request_timeout_s"] == "AGENTRL_EVAL_REQUEST_TIMEOUT_S"
    with pytest.raises(Exception, match="--tool-protocol"):
        ModelEvalConfig.resolve(tool_protocol="xml")


def test_suite_options_may_hold_commas() -> None:
    suite = parse_suite("gaia:data_dir=/data/GAIA, copy/2023,level=1")
    assert suite.parts[0].kwargs == {"data_dir": "/data/GAIA, copy/2023", "level": 1}
    suite = parse_suite("gaia", ["data_dir=/x,level=2/y"])
    assert suite.parts[0].kwargs == {"data_dir": "/x,level=2/y"}


@pytest.mark.parametrize("mode", ["hang", "500"])
def test_completions_client_isolates_requests(tmp_path: Path, mode: str) -> None:
    """The token-id ``openai:`` agent through the rollout runner: one request per episode, never
    batched behind a hung one; an always-failing server trips the circuit breaker."""
    from chat_servers import ScriptedCompletions

    from agentrl.rollout.model import load_tokenizer

    records = write_gaia_download(tmp_path, hang=mode == "hang", extra=10)
    server = ScriptedCompletions(
        records, load_tokenizer("smollm2-135m"), mode="500" if mode == "500" else "answer"
    )
    settings = ModelEvalConfig.resolve(
        episode_timeout_s=3, request_timeout_s=1, max_retries=5 if mode == "hang" else 2
    )
    with BackgroundServer(server.app) as http:
        result = evaluate(
            _suite(tmp_path), f"openai:{http.url}#smollm2-135m", concurrency=4, settings=settings
        )
    by_id = {r["task_id"]: r for r in result.records}
    if mode == "hang":
        hung = by_id.pop("t-hang")
        assert "no answer within 1s (--request-timeout-s" in hung["error"] and hung["ground_truth"] == "7"
        assert server.hung == 1  # not retried, not replayed
        assert all(r["error"] is None and r["success"] == 1.0 for r in by_id.values())
    else:
        assert all("HTTP 500" in r["error"] for r in by_id.values())
        assert sum("not sending more" in r["error"] for r in by_id.values()) >= len(records) - 8 - 4
        assert server.requests <= (8 + 4) * 3


def test_circuit_breaker_fails_fast_then_probes_after_cooldown() -> None:
    from agentrl.rollout.generators.http import CircuitBreaker, RequestFailed

    now = [100.0]
    breaker = CircuitBreaker(threshold=2, cooldown_s=30.0, clock=lambda: now[0])  # a clock moved by hand
    breaker.record(False, "HTTP 500")
    breaker.check("http://x")  # one failure: still closed
    breaker.record(False, "HTTP 500")
    with pytest.raises(RequestFailed, match="the last 2 requests all failed .*HTTP 500"):
        breaker.check("http://x")
    now[0] += 31.0
    breaker.check("http://x")  # the probe goes out
    with pytest.raises(RequestFailed):
        breaker.check("http://x")  # ... and only the probe
    breaker.record(True)
    breaker.check("http://x")
    assert not breaker.opened and breaker.failures == 0


def test_a_reasoning_style_server_passes_with_what_it_takes_and_names_what_it_refuses(
    tmp_path: Path, capsys
) -> None:
    """A server that answers as OpenAI's reasoning models do (no temperature but 1, no max_tokens):
    by default nothing it refuses is sent; asking for temperature 0 or max_tokens stops the run at
    its first episodes with the parameter and the flag, and the documented flag passes."""
    from agentrl.eval.runner import run_eval

    records = write_gaia_download(tmp_path / "gaia", extra=6)
    options = [f"data_dir={tmp_path / 'gaia'}", "python=false"]

    def run(name: str, **settings) -> tuple[int, ScriptedChat, Path]:
        server = ScriptedChat(records, refuse=("temperature", "max_tokens"))
        out = tmp_path / name
        with BackgroundServer(server.app) as http:
            code = run_eval(suite="gaia", agent=f"chat:{http.url}#scripted", suite_options=options,
                            concurrency=2, out=out, settings=settings)  # fmt: skip
        return code, server, out

    code, server, _ = run("default")
    assert code == 0 and all("temperature" not in b and "max_tokens" not in b for b in server.bodies)
    assert "temperature not sent: the server's default applies" in capsys.readouterr().err

    code, server, out = run("greedy", chat_params=("temperature=0",))
    assert code == 1 and server.requests <= 2  # refused once per worker at most, then nothing is sent
    report = (out / "report.md").read_text()
    assert (
        "the chat server refuses the parameter temperature=0: Unsupported value: 'temperature' does not"
        in report
    )
    assert "fix: leave it out with --chat-param temperature=none" in report

    code, server, out = run("max-tokens", max_new_tokens=64)
    assert code == 1 and "--chat-param max_completion_tokens=N" in (out / "report.md").read_text()
    code, server, out = run(
        "max-completion", max_new_tokens=64, chat_params=("max_completion_tokens=64", "reasoning_effort=low")
    )
    assert code == 0 and all(
        b["max_completion_tokens"] == 64 and b["reasoning_effort"] == "low" and "max_tokens" not in b
        for b in server.bodies
    )
    # what was sent is saved and reported, not only printed
    assert json.loads((out / "metrics.json").read_text())["chat"] == {
        "model": "scripted",
        "fields": {"max_completion_tokens": 64, "reasoning_effort": "low"},
        "context_bound": None,
        "context_bound_from": "the server's answer (it lists no max_model_len)",
    }
    assert (
        "- chat requests: model 'scripted', fields besides the conversation: max_completion_tokens=64, "
        'reasoning_effort="low"; an episode ends when the context is full (the server\'s answer (it lists '
        "no max_model_len))"
    ) in (out / "report.md").read_text()
    code, server, _ = run("extra-body", chat_params=('extra_body={"top_k": 20, "temperature": 1}',))
    assert code == 0 and all(b["top_k"] == 20 and b["temperature"] == 1 for b in server.bodies)


def test_the_chat_agent_bounds_its_context_and_ends_the_episode_as_out_of_budget(tmp_path: Path) -> None:
    """Tasks that read a file grow past the context: by the server's answer (400
    context_length_exceeded) or by --max-context-tokens, the episode ends truncated ("budget hit"),
    with the reason in its transcript, never as a crash; short tasks are still solved."""
    records = write_gaia_download(tmp_path)
    probe = ScriptedChat(records)
    _run(tmp_path, probe)
    first_turns = max(len(json.dumps(b["messages"])) // 4 for b in probe.bodies if len(b["messages"]) == 2)
    for settings, server in [
        ({}, ScriptedChat(records, context_window=first_turns)),  # every second turn is longer
        ({"max_context_tokens": 50}, ScriptedChat(records)),  # the server reports 57 tokens a turn
    ]:
        result = _run(tmp_path, server, **settings)
        by_id = {r["task_id"]: r for r in result.records}
        assert all(r["error"] is None for r in result.records)
        assert by_id["t-plain"]["success"] == 1.0  # answered in its first turn
        cut = [r for r in result.records if r["bucket"] == "budget hit"]
        assert cut and all(r["truncated"] and r["metrics"]["agent_truncated"] == 1.0 for r in cut)
        reasons = [t["truncation"] for t in result.transcripts if "truncation" in t]
        assert len(reasons) == len(cut)
        expected = "--max-context-tokens 50" if settings else "the server's context window: "
        assert all(reason.startswith("context budget (") and expected in reason for reason in reasons)
        bound = result.metrics["chat"]["context_bound"], result.metrics["chat"]["context_bound_from"]
        assert bound == (
            (50, "--max-context-tokens")
            if settings
            else (None, "the server's answer (it lists no max_model_len)")
        )


def test_the_error_table_groups_by_text_and_shows_a_real_message() -> None:
    from agentrl.eval.report import error_lines

    url = "http://127.0.0.1:8000/v1/chat/completions"

    def refused(message: str, status: int = 400) -> str:
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error"}})
        return f"agentrl.rollout.generators.http.RequestFailed: {url} answered HTTP {status}: {body}"

    records = [
        {
            "task_id": "a",
            "error": refused("Unsupported value: 'temperature' does not support 0.0 with this model."),
        },
        {
            "task_id": "b",
            "error": refused("Unsupported value: 'temperature' does not support 0.0 with this model."),
        },
        {"task_id": "c", "error": refused("The model `gpt-4o` does not exist", 404)},
    ]
    lines = error_lines(records)
    assert lines[2] == (
        f"| 2 | RequestFailed: HTTP 400 from {url}: Unsupported value: 'temperature' does not support 0.0 "
        "with this model. | a, b |"
    )
    assert lines[3] == f"| 1 | RequestFailed: HTTP 404 from {url}: The model `gpt-4o` does not exist | c |"


def test_an_unknown_suite_option_is_a_clear_error() -> None:
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match="takes no option temperature .*--chat-param temperature=1"):
        parse_suite("local-gaia", ["temperature=1"])
