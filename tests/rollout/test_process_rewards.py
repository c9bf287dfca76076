"""FoldGRPO process rewards on scripted branch/return episodes: each rule where it applies and where it must not."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from agentrl.errors import ConfigError
from agentrl.rollout import folding
from agentrl.rollout.generators.scripted import ScriptedGenerator
from agentrl.rollout.process_rewards import (
    BranchCase,
    LLMScopeJudge,
    RuleScopeJudge,
    ScopeVerdict,
    assign_process_rewards,
    branch_cases,
)
from agentrl.rollout.runner import RunStats, run_episodes
from agentrl.rollout.settings import RolloutConfig
from agentrl.serve.server import BackgroundServer, build_app
from agentrl.trajectory import build_batch, load, save

from .test_agent import CALL
from .toy import make_lookup_env


def branch(description: str, prompt: str) -> str:
    args = {"description": description, "prompt": prompt}
    return f"<tool_call>{json.dumps({'name': 'branch', 'arguments': args})}</tool_call>"


def give_back(message: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'return', 'arguments': {'message': message}})}</tool_call>"


JUDGE_MARK = "You check whether a sub-agent"
# turn index -> (thread, what the policy writes)
SCRIPT = [
    ("main", branch("value of k4", "Look up key k4 in the table.")),  # 0: opens branch 1
    ("b1", '<tool_call>{"name": "lookup", "arguments": {"kee": "k4"}}</tool_call>'),  # 1: bad argument
    ("b1", branch("nested", "Not allowed.")),  # 2: branch inside a branch: refused
    ("b1", CALL.format(key="k4")),  # 3: a good call
    ("b1", give_back("key k4 has the value v4")),  # 4: in scope (shares k4, key)
    ("main", branch("value of k4", "Look up key k4 in the table.")),  # 5: opens branch 2
    ("b2", give_back("Paris weather is sunny today")),  # 6: out of scope (nothing about k4)
    ("main", '<tool_call>{"name": "lookup" </tool_call>'),  # 7: malformed JSON
    ("main", "I think the answer is near."),  # 8: void turn (no call): not a failure
    ("main", "<answer>v4</answer>"),  # 9
]


def scripted(tokenizer, answer: str = "v4") -> ScriptedGenerator:
    """Turn k writes SCRIPT[k] (the last one answers ``answer``); judge prompts (scope_judge=policy) get a verdict."""
    turn = {"k": 0}

    def respond(prompt: str, _call: int) -> str:
        if JUDGE_MARK in prompt:
            return "<error> it reported the weather" if "Paris weather" in prompt else "<good> on task"
        turn["k"] += 1
        return SCRIPT[turn["k"] - 1][1].replace("v4</answer>", f"{answer}</answer>")

    return ScriptedGenerator(tokenizer, respond)


def config(**settings) -> RolloutConfig:
    settings = {"max_new_tokens": 96, "folding": "branch", "max_context_tokens": 4096, **settings}
    return RolloutConfig(**settings, concurrency=1, group_size=1)


def run(tokenizer, stats: RunStats | None = None, judge=None, answer: str = "v4", **agent):
    gen = scripted(tokenizer, answer)
    (episode,) = run_episodes(
        make_lookup_env, ["k4"], gen, tokenizer, config(**agent), stats=stats, judge=judge
    )
    assert episode.error is None, episode.error
    return episode


def by_index(episode):
    return {t.index: t for t in episode.turns}


def test_the_script_plays_as_written(tokenizer):
    episode = run(tokenizer, scope_judge="none")
    turns = by_index(episode)
    assert [turns[k].action_text.replace("<|im_end|>", "") for k in range(10)] == [a for _, a in SCRIPT]
    assert [s.kind for s in episode.segments] == ["main", "branch", "branch"] and episode.outcome == 1.0


def test_failure_and_scope_penalties_per_token(tokenizer):
    """Threshold 1.0: no unfolded penalty can fire. Hand-computed: failures -1 on turns 1, 2, 7;
    -0.2 on every token of branch 2 (rule judge); 0 everywhere else (the void turn 8 included)."""
    stats = RunStats()
    episode = run(tokenizer, stats=stats, unfolded_threshold=1.0)
    turns = by_index(episode)
    n = {k: len(t.output_ids) for k, t in turns.items()}
    expected = {k: [0.0] * n[k] for k in turns}
    for k in (1, 2, 7):
        expected[k] = [-1.0] * n[k]
    expected[6] = [-0.2] * n[6]
    assert {k: t.process_reward for k, t in turns.items()} == expected
    assert turns[1].error == "tool call failed: lookup (bad_arguments)"
    assert turns[2].error.startswith("branch call refused: " + folding.NESTED_BRANCH[:20])
    assert turns[7].error == "malformed action: malformed_json" and turns[8].error is None and turns[8].void
    assert turns[1].reward_parts == {"process/failure": -n[1]}
    assert turns[6].reward_parts == {"process/out_of_scope": pytest.approx(-0.2 * n[6])}
    assert "process/unfolded" not in str([t.reward_parts for t in turns.values()])
    # counts on the episode and shares in the runner's metrics
    failures = n[1] + n[2] + n[7]
    total = sum(n.values())
    assert episode.metrics["process/failure_tokens"] == failures
    assert episode.metrics["process/out_of_scope_tokens"] == n[6]
    assert episode.metrics["process/unfolded_tokens"] == 0
    assert (episode.metrics["process/branches_judged"], episode.metrics["process/branches_out_of_scope"]) == (
        2,
        1,
    )
    metrics = stats.as_metrics()
    assert metrics["rollout/process_share/failure"] == pytest.approx(failures / total)
    assert metrics["rollout/process_share/out_of_scope"] == pytest.approx(n[6] / total)
    assert metrics["rollout/process_share/unfolded"] == 0.0
    assert metrics["rollout/process_share/any"] == pytest.approx((failures + n[6]) / total)
    # the learner's batch carries them token by token: main row, branch 1 row, branch 2 row
    batch = build_batch([episode])
    for row, seg in enumerate(episode.segments):
        q = batch.process_reward[row]
        start = len(seg.prompt_ids)
        for turn in seg.turns:
            assert q[start : start + len(turn.output_ids)].tolist() == pytest.approx(expected[turn.index])
            start += len(turn.output_ids) + len(turn.obs_ids)
        assert float(q.sum()) == pytest.approx(sum(sum(expected[t.index]) for t in seg.turns))


def test_unfolded_penalty_on_main_thread_tokens_past_the_threshold(tokenizer):
    episode = run(tokenizer, scope_judge="none", unfolded_threshold=1.0)
    main = episode.segments[0]
    turns = by_index(episode)
    n = {k: len(t.output_ids) for k, t in turns.items()}
    positions, pos = {}, len(main.prompt_ids)
    for turn in main.turns:
        positions[turn.index] = pos
        pos += len(turn.output_ids) + len(turn.obs_ids)
    # 1) threshold below the prompt: every main token is past it, except branch-creating turns 0 and 5;
    #    branch threads never get it. Turn 7 failed too: -1 - 1 per token.
    rules = RolloutConfig(folding="branch", max_context_tokens=len(main.prompt_ids) // 2)  # paper penalties
    asyncio.run(assign_process_rewards(episode, rules, None))
    assert turns[0].process_reward == [0.0] * n[0] and turns[5].process_reward == [0.0] * n[5]
    assert turns[7].process_reward == [-2.0] * n[7]
    assert turns[8].process_reward == [-1.0] * n[8] and turns[9].process_reward == [-1.0] * n[9]
    assert all(
        turns[k].process_reward == ([-1.0] * n[k] if k in (1, 2) else [0.0] * n[k]) for k in (1, 2, 3, 4, 6)
    )
    assert turns[9].reward_parts["process/unfolded"] == -n[9]
    assert episode.metrics["process/unfolded_tokens"] == n[7] + n[8] + n[9]
    # 2) the line falls inside the answer turn: its first 3 tokens hold <= limit tokens before them
    limit = positions[9] + 2  # context before token j is positions[9] + j; penalised iff > limit
    rules = RolloutConfig(folding="branch", max_context_tokens=2 * limit)
    asyncio.run(assign_process_rewards(episode, rules, None))
    assert turns[9].process_reward == [0.0, 0.0, 0.0] + [-1.0] * (n[9] - 3)
    assert turns[8].process_reward == [0.0] * n[8] and turns[7].process_reward == [-1.0] * n[7]
    assert episode.metrics["process/unfolded_tokens"] == n[9] - 3
    # the same through the rollout config (threshold as a fraction of rollout.max_context_tokens)
    again = run(tokenizer, scope_judge="none", max_context_tokens=4096, unfolded_threshold=limit / 4096)
    assert by_index(again)[9].process_reward == turns[9].process_reward


def test_records_round_trip_with_process_rewards(tokenizer, tmp_path):
    episode = run(tokenizer)
    for suffix in (".jsonl", ".parquet"):
        save([episode], tmp_path / f"e{suffix}")
        (back,) = load(tmp_path / f"e{suffix}")
        assert [t.process_reward for t in back.turns] == [t.process_reward for t in episode.turns]
        assert back == episode


def test_no_process_rewards_without_branch_folding(tokenizer):
    gen = ScriptedGenerator(tokenizer, lambda p, i: "<answer>v4</answer>")
    (episode,) = run_episodes(make_lookup_env, ["k4"], gen, tokenizer, config(folding="none"))
    assert [t.process_reward for t in episode.turns] == [None]
    assert not any(k.startswith("process/") for k in episode.metrics)
    with pytest.raises(ConfigError, match=r"rollout.scope_penalty.*only with rollout.folding=branch"):
        RolloutConfig(folding="none", scope_penalty=-0.5).validate()


def test_branch_cases_read_from_the_record(tokenizer):
    cases = branch_cases(run(tokenizer, scope_judge="none"))
    assert cases[1] == BranchCase(
        "value of k4",
        "Look up key k4 in the table.",
        "key k4 has the value v4",
        False,
        tuple(a for t, a in SCRIPT if t == "b1"),
    )
    assert cases[2].message == "Paris weather is sunny today" and not cases[2].answered


def test_rule_judge():
    judge = RuleScopeJudge()
    case = BranchCase("population", "Find the population of Oslo.", "Oslo has 700k people", False, ())
    assert asyncio.run(judge.judge(case)).out_of_scope is False
    assert asyncio.run(judge.judge(dataclasses.replace(case, message="The sky is blue"))).out_of_scope is True
    assert asyncio.run(judge.judge(dataclasses.replace(case, answered=True))).out_of_scope is True
    assert asyncio.run(judge.judge(dataclasses.replace(case, message=None))).out_of_scope is False


class FlagEveryBranch:
    """A plug-in judge: the protocol is one async method."""

    def __init__(self):
        self.seen: list[BranchCase] = []

    async def judge(self, case: BranchCase) -> ScopeVerdict:
        self.seen.append(case)
        return ScopeVerdict(True, "strict")


def test_a_custom_judge_plugs_in(tokenizer):
    judge = FlagEveryBranch()
    episode = run(tokenizer, judge=judge, unfolded_threshold=1.0)
    turns = by_index(episode)
    assert [c.message for c in judge.seen] == ["key k4 has the value v4", "Paris weather is sunny today"]
    for k in (3, 4, 6):  # clean branch turns now carry the scope penalty
        assert turns[k].process_reward == [-0.2] * len(turns[k].output_ids)
    assert turns[1].process_reward == pytest.approx([-1.2] * len(turns[1].output_ids))  # failure + scope
    assert turns[0].process_reward == [0.0] * len(turns[0].output_ids)  # main thread: never


def test_llm_judge_over_the_policys_own_generator(tokenizer):
    """scope_judge=policy: the judge prompts go through the rollout's batcher to the same generator."""
    gen = scripted(tokenizer)
    (episode,) = run_episodes(
        make_lookup_env, ["k4"], gen, tokenizer, config(scope_judge="policy", unfolded_threshold=1.0)
    )
    judged = [tokenizer.decode(prompt) for prompt, _ in gen.calls if JUDGE_MARK in tokenizer.decode(prompt)]
    assert len(judged) == 2 and "key k4 has the value v4" in judged[0] and "Paris weather" in judged[1]
    turns = by_index(episode)
    assert turns[6].process_reward == [-0.2] * len(turns[6].output_ids)
    assert turns[4].process_reward == [0.0] * len(turns[4].output_ids)


def test_llm_judge_over_an_openai_compatible_server(tokenizer):
    replies = iter(["<good> stayed on k4", "Sorry, I cannot tell."])  # the second is unusable
    judge_model = ScriptedGenerator(tokenizer, lambda prompt, _i: next(replies))
    with BackgroundServer(build_app(judge_model, tokenizer, "judge")) as server:
        episode = run(tokenizer, scope_judge="openai", scope_judge_url=server.url, unfolded_threshold=1.0)
    assert len(judge_model.calls) == 2 and JUDGE_MARK in tokenizer.decode(judge_model.calls[0][0])
    turns = by_index(episode)
    assert turns[6].process_reward == [0.0] * len(turns[6].output_ids)  # no verdict: no penalty
    assert (
        episode.metrics["process/judge_unparsed"] == 1
        and episode.metrics["process/branches_out_of_scope"] == 0
    )


def test_a_failing_judge_fails_only_its_episode(tokenizer):
    judge = LLMScopeJudge.over_openai("http://127.0.0.1:9/v1", "judge", timeout_s=2.0)
    gen = scripted(tokenizer)
    (episode,) = run_episodes(make_lookup_env, ["k4"], gen, tokenizer, config(), judge=judge)
    assert episode.failed and "scope judge at http://127.0.0.1:9/v1" in episode.error


def test_policy_judge_needs_a_generator(tokenizer):
    from agentrl.rollout.oracle_agent import OraclePolicy

    from .toy import LookupOracle

    with pytest.raises(ConfigError, match="rollout.scope_judge.*has none"):
        run_episodes(
            make_lookup_env,
            ["k1"],
            None,
            tokenizer,
            config(scope_judge="policy"),
            policy_factory=lambda: OraclePolicy(LookupOracle(), tokenizer),
        )


def test_agentrl_play_shows_process_rewards_per_token(tmp_path):
    """The user path: ``agentrl play --folding branch --json`` on the real search env."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    script = tmp_path / "actions.txt"
    script.write_text(
        branch("find the capital", "Search for the capital of the country.")
        + "\n"
        + '<tool_call>{"name": "search", "arguments": {"qury": "capital"}}</tool_call>\n'
        + give_back("The weather is sunny")
        + "\n<answer>Paris</answer>\n"
    )
    args = ["play", "agentrl/Search-v0", "--task-id", "search-0-a195183c332a", "--split", "train"]
    args += ["--script", str(script), "--folding", "branch", "--set", "unfolded_threshold=0.2", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    turns = record["turns"]
    assert [(t["thread"], t["kind"]) for t in turns] == [
        ("main", "branch"),
        ("branch 1", "action"),
        ("branch 1", "return"),
        ("main", "action"),
    ]
    q = [t["process_reward"] for t in turns]
    assert set(q[0]) == {0.0}  # branch-creating turn: exempt although past 0.2 x 2048 tokens
    assert q[1] == pytest.approx([-1.2] * len(q[1]))  # failed call (bad argument) in an out-of-scope branch
    assert q[2] == pytest.approx([-0.2] * len(q[2]))  # the return: out of scope only
    assert q[3] == [-1.0] * len(q[3])  # main thread past the threshold
    assert turns[1]["error"] == "tool call failed: search (bad_arguments)"
    assert turns[3]["reward_parts"] == {"process/unfolded": -len(q[3])}
    metrics = record["metrics"]
    assert metrics["process/penalised_tokens"] == len(q[1]) + len(q[2]) + len(q[3])
    bad = CliRunner().invoke(app, [*args[:-3], "--set", "unfolded_threshold=2", "--json"])
    assert bad.exit_code == 2 and "rollout.unfolded_threshold" in bad.output


def test_foldgrpo_advantage_reads_the_recorded_penalties(tokenizer):
    """Producer to consumer: recorded Q -> TokenBatch.process_reward -> FoldGRPO's estimator.

    A group of two rollouts of the same script, one right (R=1) and one wrong (R=0): mean 0.5,
    sample std sqrt(0.5). The right one's clean tokens get (1 - 0.5)/std, its failed-call tokens
    (Q=-1) (0 - 0.5)/std, its out-of-scope tokens (Q=-0.2) (0.8 - 0.5)/std; the wrong one gets
    (0 - 0.5)/std everywhere, penalties or not (clip(R + Q, 0, 1) = 0).
    """
    import torch

    from agentrl.algos.advantages import foldgrpo

    right = run(tokenizer, unfolded_threshold=1.0)
    wrong = run(tokenizer, unfolded_threshold=1.0, answer="v9")
    assert (right.outcome, wrong.outcome) == (1.0, 0.0)
    batch = build_batch([right, wrong])
    adv = foldgrpo(
        torch.tensor([right.outcome, wrong.outcome]),
        batch.row_episode,
        batch.process_reward,
        torch.tensor([0, 0]),
    )  # [B, L]
    std = 0.5**0.5
    q = batch.process_reward
    trained = batch.loss_mask.bool()
    mine = trained & (batch.row_episode == 0)[:, None]
    theirs = trained & (batch.row_episode == 1)[:, None]
    assert q[mine].unique().tolist() == pytest.approx([-1.0, -0.2, 0.0])  # every rule fired
    for value, expected in ((0.0, 0.5 / std), (-1.0, -0.5 / std)):
        assert torch.allclose(adv[mine & (q == value)], torch.tensor(expected), atol=1e-5)
    assert torch.allclose(adv[mine & (q < 0) & (q > -1)], torch.tensor(0.3 / std), atol=1e-5)
    assert q[theirs].min() < 0 and torch.allclose(adv[theirs], torch.tensor(-0.5 / std), atol=1e-5)
