"""Model agents end to end: a real OpenAI-compatible server (``agentrl serve``'s app) + the ``openai:`` agent,
and the in-process HF agent, through the rollout runner."""

from __future__ import annotations

import pytest

from agentrl.eval.runner import evaluate, run_eval


@pytest.fixture(scope="module")
def tiny_server():
    """The serve app over a random-init tiny model with SmolLM2's tokenizer (fast, real HTTP)."""
    from agentrl.rollout.generators.hf import HFGenerator
    from agentrl.rollout.model import load_tokenizer, tiny_model
    from agentrl.serve.server import BackgroundServer, build_app

    tokenizer = load_tokenizer("smollm2-135m")
    app = build_app(HFGenerator(tiny_model(tokenizer), tokenizer), tokenizer, "smollm2-135m")
    with BackgroundServer(app) as server:
        yield server.url


@pytest.mark.slow  # ~30 s on a busy 2-core CPU (tokenizer load + prefill of GAIA prompts)
def test_openai_agent_over_http_end_to_end(tiny_server: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AGENTRL_EVAL_MAX_NEW_TOKENS", "24")
    code = run_eval(
        suite="local-gaia:max_turns=2,python=false",
        agent=f"openai:{tiny_server}#smollm2-135m",
        limit=2,
        concurrency=2,
        seed=0,
        out=tmp_path,
    )
    assert code == 0
    import json

    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["error"] is None for r in records)
    assert all(1 <= r["turns"] <= 2 for r in records)
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    turn = episodes[0]["segments"][0]["turns"][0]
    # token-level records came back over HTTP: ids with one log-prob each
    assert turn["output_ids"] and len(turn["output_ids"]) == len(turn["output_logprobs"])


def test_openai_agent_without_model_name_asks_the_server(tiny_server: str, monkeypatch) -> None:
    monkeypatch.setenv("AGENTRL_EVAL_MAX_NEW_TOKENS", "8")
    result = evaluate("search-qa:max_turns=1", f"openai:{tiny_server}", limit=1, concurrency=1)
    assert result.metrics["agent"] == f"openai:{tiny_server}"
    assert len(result.records) == 1 and result.records[0]["error"] is None


@pytest.mark.slow
def test_smollm2_zero_shot_in_process(monkeypatch) -> None:
    monkeypatch.setenv("AGENTRL_EVAL_MAX_NEW_TOKENS", "32")
    result = evaluate("search-qa:max_turns=2", "smollm2-135m", limit=1, concurrency=1)
    (record,) = result.records
    assert record["error"] is None and record["turns"] >= 1
    assert result.episodes[0].timings["generated_tokens"] > 0


def test_chat_agent_against_agentrl_serve(tiny_server: str) -> None:
    """``chat:`` works against ``agentrl serve``'s chat endpoint (tools rendered by the chat template;
    a random-init model answers nonsense, so this checks the path, not the score)."""
    from agentrl.eval.model_agent import ModelEvalConfig

    settings = ModelEvalConfig.resolve(max_new_tokens=12)
    result = evaluate(
        "gaia-fixture:python=false,max_turns=2",
        f"chat:{tiny_server}",
        limit=2,
        concurrency=2,
        settings=settings,
    )
    assert result.metrics["agent"] == f"chat:{tiny_server}"
    assert len(result.records) == 2 and all(r["error"] is None and r["turns"] >= 1 for r in result.records)
    turn = result.episodes[0].turns[0]
    assert 1 <= turn.timings["completion_tokens"] <= 12 and turn.timings["latency_s"] > 0
    # the id the server lists, only what was asked for, and its 8192 positions (max_model_len) as the bound
    assert result.metrics["chat"] == {
        "model": "smollm2-135m",
        "fields": {"max_tokens": 12},
        "context_bound": 8192,
        "context_bound_from": "the server's max_model_len",
    }


def test_a_local_model_is_loaded_once_when_crashed_episodes_are_replayed(tiny_model_dir, monkeypatch) -> None:
    """`agentrl eval MODEL`: a crashed episode is replayed (its own task and seed) with the model
    already in memory, not loaded again (the replay gets a fresh generator over the same weights)."""
    import toy_envs

    import agentrl.rollout.model as model_module
    from agentrl.eval.model_agent import ModelEvalConfig
    from agentrl.eval.suites import Part, Suite

    loads = []
    real = model_module.load_model

    def counted(*args, **kwargs):  # the real loader, counted
        loads.append(args[0] if args else kwargs.get("name"))
        return real(*args, **kwargs)

    monkeypatch.setattr(model_module, "load_model", counted)
    monkeypatch.setattr(toy_envs.FlakyEnv, "crashes", {"test-1": 1})  # task test-1's first reset raises
    suite = Suite("flaky", "toy counter, one crash", (Part("test/Flaky-v0"),), metrics=("em",))
    settings = ModelEvalConfig.resolve(max_new_tokens=4)
    result = evaluate(suite, str(tiny_model_dir), limit=3, concurrency=3, settings=settings, replays=2)
    assert loads == [str(tiny_model_dir)]  # one load for the first run and the replay
    flaky = [r for r in result.records if r["task_id"] == "test-1"]
    assert len(flaky) == 1 and flaky[0]["error"] is None
    assert (
        len(flaky[0]["replayed_errors"]) == 1
        and "simulated crash on test-1" in flaky[0]["replayed_errors"][0]
    )
    assert result.metrics["replayed_episodes"] == 1 and toy_envs.FlakyEnv.crashes == {"test-1": 0}
