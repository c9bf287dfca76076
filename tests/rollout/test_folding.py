"""Context folding: branch/return rows (FoldGRPO) and summary restarts (SUPO/FoldAct)."""

from __future__ import annotations

import re

import pytest

from agentrl.errors import ConfigError
from agentrl.rollout import folding
from agentrl.rollout.generators.scripted import ScriptedGenerator
from agentrl.rollout.runner import run_episodes
from agentrl.rollout.settings import RolloutConfig
from agentrl.rollout.template import with_template
from agentrl.trajectory import Source, build_batch, segment_arrays

from .test_agent import CALL, FIXTURES
from .toy import make_lookup_env

BRANCH = '<tool_call>{"name": "branch", "arguments": {"description": "find value", "prompt": "Look up KEY."}}</tool_call>'
RETURN = '<tool_call>{"name": "return", "arguments": {"message": "the value is VAL"}}</tool_call>'


def branch_script(prompt: str, _index: int) -> str:
    key = re.search(r"value of key (k\d+)", prompt).group(1)
    if "Branch result:" in prompt:
        value = re.findall(r"the value is (v\d+)", prompt)[-1]
        return f"<answer>{value}</answer>"
    if "You are now in a branch" in prompt:
        found = re.findall(r"VALUE of k\d+: (v\d+)", prompt)
        if found:
            return RETURN.replace("VAL", found[-1])
        return CALL.format(key=key)
    return BRANCH.replace("KEY", key)


def config(**settings):
    return RolloutConfig(max_new_tokens=96, **settings, concurrency=2, group_size=1)


def test_branch_and_return_make_a_main_row_and_a_branch_row(tokenizer):
    gen = ScriptedGenerator(tokenizer, branch_script)
    (episode,) = run_episodes(make_lookup_env, ["k4"], gen, tokenizer, config(folding="branch"))
    assert episode.error is None and episode.outcome == 1.0
    main, branch = episode.segments
    assert (main.kind, main.fold_id, branch.kind, branch.fold_id) == ("main", 0, "branch", 1)
    assert [t.kind for t in main.turns] == ["branch", "action"] and [t.index for t in main.turns] == [0, 3]
    assert [t.kind for t in branch.turns] == ["action", "return"] and [t.index for t in branch.turns] == [
        1,
        2,
    ]
    # the branch row's prompt is the main history up to and including the branch call + instruction
    call_end = len(main.prompt_ids) + len(main.turns[0].output_ids)
    assert branch.prompt_ids[:call_end] == main.token_ids()[:call_end]
    assert "You are now in a branch for the sub-task: find value" in tokenizer.decode(
        branch.prompt_ids[call_end:]
    )
    # the main row never contains tokens from inside the branch; only the returned message comes back
    main_text = tokenizer.decode(main.token_ids())
    assert "VALUE of k4" not in main_text and "Branch result: the value is v4" in main_text
    assert main.turns[0].observation == "Branch result: the value is v4"
    # each generator call saw exactly its row's prefix
    rows = {0: main, 1: branch}
    by_index = {t.index: (fold, t) for fold, seg in rows.items() for t in seg.turns}
    for k, (fed, out) in enumerate(gen.calls):
        fold, turn = by_index[k]
        seg = rows[fold]
        start = len(seg.prompt_ids) + sum(
            len(t.output_ids) + len(t.obs_ids) for t in seg.turns if t.index < k
        )
        assert fed == seg.token_ids()[:start] and turn.output_ids == out.ids
    # masks: branch prompt is context only; both rows train on their own sampled tokens
    batch = build_batch([episode], pad_id=0)
    assert batch.fold_id.tolist() == [0, 1]
    branch_arrays = segment_arrays(branch)
    assert sum(branch_arrays["mask"]) == sum(len(t.output_ids) for t in branch.turns)
    assert all(m == 0 for m in branch_arrays["mask"][: len(branch.prompt_ids)])


@pytest.mark.parametrize("tool_schemas", [True, False])
def test_the_model_is_told_about_branch_and_return_with_or_without_tool_schemas(tokenizer, tool_schemas):
    """With rollout.tool_schemas=false no JSON schema is rendered, so the prompt documents the two
    tools in text (as the env documents its own); the react context gets neither."""
    prompts = []

    def script(prompt: str, index: int) -> str:
        prompts.append(prompt)
        return branch_script(prompt, index)

    (episode,) = run_episodes(make_lookup_env, ["k2"], ScriptedGenerator(tokenizer, script), tokenizer,
                              config(folding="branch", tool_schemas=tool_schemas))  # fmt: skip
    assert episode.error is None and episode.outcome == 1.0
    first = prompts[0]
    assert '"name": "branch"' in first and "return" in first
    assert ("- branch(description, prompt): Start a focused sub-task" in first) is (not tool_schemas)
    (plain,) = run_episodes(make_lookup_env, ["k2"], ScriptedGenerator(tokenizer, lambda p, i: prompts.append(p) or "<answer>v2</answer>"),
                            tokenizer, config(tool_schemas=tool_schemas))  # fmt: skip
    assert "branch" not in prompts[-1]


def test_nested_branch_and_stray_return_become_observations(tokenizer):
    def script(prompt: str, index: int) -> str:
        if index == 0:
            return RETURN.replace("VAL", "x")  # return in the main thread
        if index == 1:
            return BRANCH.replace("KEY", "k1")
        if index == 2:
            return BRANCH.replace("KEY", "k1")  # nested
        if index == 3:
            return RETURN.replace("VAL", "v1")
        return "<answer>v1</answer>"

    (episode,) = run_episodes(
        make_lookup_env, ["k1"], ScriptedGenerator(tokenizer, script), tokenizer, config(folding="branch")
    )
    main, branch = episode.segments
    assert main.turns[0].observation == folding.RETURN_IN_MAIN
    assert branch.turns[0].observation == folding.NESTED_BRANCH
    assert episode.outcome == 1.0


def test_summary_restarts_the_context_with_summary_segments(tokenizer):
    def script(prompt: str, _index: int) -> str:
        tail = prompt[-400:]
        if folding.SUMMARY_INSTRUCTION in tail:
            return "I looked up keys; nothing found yet."
        if folding.SUMMARY_PREFIX in prompt and prompt.count("VALUE of") >= 1:
            return "<answer>v2</answer>"
        return CALL.format(key="k2")

    gen = ScriptedGenerator(tokenizer, script)
    cfg = config(folding="summary", summary_threshold=300, max_summaries=2, max_turns=12)
    (episode,) = run_episodes(make_lookup_env, ["k2"], gen, tokenizer, cfg)
    assert episode.error is None and episode.outcome == 1.0, episode.error
    kinds = [(s.kind, s.fold_id) for s in episode.segments]
    assert kinds[0] == ("main", 0) and kinds[1] == ("summary", 1)
    first, second = episode.segments[0], episode.segments[1]
    assert first.turns[-1].kind == "summary" and first.turns[-1].obs_ids == []
    assert first.turns[-2].obs_source.count(Source.SYSTEM) > 0  # the summary instruction
    restart = tokenizer.decode(second.prompt_ids)
    assert folding.SUMMARY_PREFIX + "I looked up keys; nothing found yet." in restart
    assert "VALUE of" not in restart  # old observations are gone from the new context
    arrays = segment_arrays(first)
    summary_ids = first.turns[-1].output_ids
    assert arrays["source"][-len(summary_ids) :] == [Source.SUMMARY] * len(summary_ids)
    # every call's prompt is exactly its segment's prefix (per-turn contexts are the rows)
    for fed, _out in gen.calls:
        assert any(seg.token_ids()[: len(fed)] == fed for seg in episode.segments)


def test_folding_refuses_a_non_conforming_template_before_running(tokenizer):
    rewriting = with_template(
        tokenizer, (FIXTURES / "reasoning_stripping.jinja").read_text(), agentrl_name="qwen3-style"
    )
    gen = ScriptedGenerator(rewriting, branch_script)
    with pytest.raises(ConfigError, match="rollout.folding.*qwen3-style.*turn 0"):
        run_episodes(make_lookup_env, ["k1"], gen, rewriting, config(folding="branch"))
    assert gen.calls == []
    with pytest.raises(ConfigError, match="rollout.folding"):
        run_episodes(make_lookup_env, ["k1"], gen, tokenizer, config(folding="bogus"))
    with pytest.raises(ConfigError, match="rollout.max_new_tokens"):
        run_episodes(make_lookup_env, ["k1"], gen, tokenizer, config(max_context_tokens=50))
