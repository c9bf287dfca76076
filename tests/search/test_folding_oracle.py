"""The folding oracle (one FoldGRPO branch per hop) through the real agent, tokenizer and env, and its
demonstrations as warm-up rows: what `train.sft_fold_share` feeds the supervised warm-up."""

from __future__ import annotations

import json

import agentrl
from agentrl.envs.search.oracle import FoldingSearchOracle, SearchOracle
from agentrl.rollout.model import load_tokenizer
from agentrl.rollout.runner import run_oracle_episodes
from agentrl.rollout.settings import RolloutConfig
from agentrl.trajectory import build_batch

# the folding study's setting: multi-hop questions, 10 env turns, a 1,536-token context
MULTI = {"hops": "multi", "max_turns": 10}


def make_env():
    return agentrl.make("agentrl/SearchMultiHop-v0", **MULTI)


def _tasks(n: int):
    env = make_env()
    tasks = list(env.unwrapped.load_tasks("train"))[:n]
    env.close()
    return tasks


def _play(oracle, folding: str, tasks):
    settings = RolloutConfig(folding=folding, max_new_tokens=512, max_context_tokens=1536, tool_schemas=False,
                             group_size=1, concurrency=4)  # fmt: skip
    return run_oracle_episodes(make_env, tasks, oracle, load_tokenizer("smollm2-135m"), settings, seed=0)


def _calls(text: str) -> list[dict]:
    return [json.loads(part.split("</tool_call>")[0]) for part in text.split("<tool_call>")[1:]]


def test_each_hop_is_worked_in_a_branch_and_only_its_fact_comes_back():
    tokenizer = load_tokenizer("smollm2-135m")
    tasks = _tasks(12)
    folded = _play(FoldingSearchOracle, "branch", tasks)
    assert [ep.outcome for ep in folded] == [1.0] * 12  # every question answered right
    for ep, task in zip(folded, tasks, strict=True):
        hops = len(task.payload["relations"])
        assert [s.kind for s in ep.segments] == ["main"] + ["branch"] * hops
        main = tokenizer.decode(ep.segments[0].token_ids()).split("<|im_start|>assistant", 1)[1]  # after the prompt
        # the main thread: one branch call per hop and the answer; no search result or page in it
        assert [c["name"] for c in _calls(main)].count("branch") == hops
        assert "search" not in [c["name"] for c in _calls(main)] and "Branch result: " in main
        assert f"<answer>{ep.answer}</answer>" in main
        for branch in ep.segments[1:]:
            own = tokenizer.decode(branch.token_ids()).split("You are now in a branch", 1)[1]  # after the main history
            assert [c["name"] for c in _calls(own)] == ["search", "open", "return"]


def test_folding_keeps_the_main_thread_short_where_react_runs_out_of_context():
    """Same tasks, same 1,536-token limit: the ReAct oracle carries every page in one context and is
    cut off on some 3-hop questions; the folding oracle's main thread holds only the facts."""
    tasks = _tasks(40)
    folded = _play(FoldingSearchOracle, "branch", tasks)
    react = _play(SearchOracle, "none", tasks)
    main = [sum(len(s.token_ids()) for s in ep.segments if s.fold_id == 0) for ep in folded]
    react_len = [len(ep.segments[0].token_ids()) for ep in react]
    assert sum(ep.outcome for ep in folded) == 40
    assert sum(ep.outcome for ep in react) < 40 and any(ep.truncated for ep in react)
    assert max(main) < 700 < min(r for r, ep in zip(react_len, react, strict=True) if ep.truncated)
    assert sum(main) < sum(react_len) / 2


def test_every_folded_turn_fits_the_folding_studys_turn_budget():
    """A demonstrated turn the policy cannot finish is a turn it never learns to take: the branch and
    return calls are kept short (measured: the first version's branch calls, 53 tokens and more, were
    cut at the quickstart's 48 and failed as unclosed tool calls)."""
    budget = 64  # folding_vs_react.yaml's rollout.max_new_tokens
    folded = _play(FoldingSearchOracle, "branch", _tasks(40))
    longest = max(len(t.output_ids) for ep in folded for s in ep.segments for t in s.turns)
    assert longest <= budget


def test_folded_demonstrations_become_one_warm_up_row_per_thread():
    folded = _play(FoldingSearchOracle, "branch", _tasks(3))
    batch = build_batch(folded, pad_id=0)
    assert batch.input_ids.shape[0] == sum(len(ep.segments) for ep in folded)
    # every thread has trained tokens: the main thread's branch calls and answer, each branch's actions
    assert bool((batch.loss_mask.sum(1) > 0).all())
