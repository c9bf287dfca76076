"""Agent: exact multi-turn token bookkeeping with scripted generators; per-turn fallback; oracles."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from agentrl.rollout.generators.scripted import ScriptedGenerator
from agentrl.rollout.runner import run_episodes, run_oracle_episodes
from agentrl.rollout.settings import RolloutConfig
from agentrl.rollout.template import with_template
from agentrl.trajectory import Source, build_batch, read_jsonl

from .toy import LookupOracle, make_lookup_env

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "templates"
CALL = '<tool_call>{{"name": "lookup", "arguments": {{"key": "{key}"}}}}</tool_call>'


def lookup_script(prompt: str, _index: int) -> str:
    """Reply by the state of the conversation: look the key up (badly first), then answer."""
    key = re.search(r"value of key (k\d+)", prompt).group(1)
    if "VALUE of" in prompt:
        value = re.findall(r"VALUE of k\d+: (v\d+)", prompt)[-1]
        return f"<think>found it</think><answer>{value}</answer>"
    if "no key" in prompt:
        return CALL.format(key=key)
    return "<think>try</think>" + CALL.format(key="zz")


def config(**settings):
    return RolloutConfig(max_new_tokens=64, **settings, concurrency=4, group_size=1)


def test_token_in_token_out_invariant_over_a_scripted_episode(tokenizer):
    gen = ScriptedGenerator(tokenizer, lookup_script, logprob=-0.25)
    (episode,) = run_episodes(make_lookup_env, ["k3"], gen, tokenizer, config())
    assert episode.error is None and episode.outcome == 1.0 and episode.answer == "v3"
    assert [s.kind for s in episode.segments] == ["main"]
    seg = episode.segments[0]
    assert [t.index for t in seg.turns] == [0, 1, 2]
    # every generator call saw exactly the row's prefix and produced exactly the turn's ids
    assert len(gen.calls) == 3
    position = len(seg.prompt_ids)
    row = seg.token_ids()
    for turn, (fed, out) in zip(seg.turns, gen.calls, strict=True):
        assert fed == row[:position]
        assert turn.output_ids == out.ids and turn.output_logprobs == out.logprobs
        position += len(turn.output_ids) + len(turn.obs_ids)
    assert position == len(row)
    # the row is what the chat template renders for the whole conversation (SmolLM2 conforms)
    text = tokenizer.decode(row)
    assert text.startswith("<|im_start|>system\nFind the value") and '"name": "lookup"' in text
    assert "<|im_start|>user\nError: no key 'zz'<|im_end|>\n<|im_start|>assistant\n" in text
    assert text.endswith("<answer>v3</answer><|im_end|>")
    assert seg.turns[0].tool_calls[0]["name"] == "lookup" and seg.turns[2].obs_ids == []
    # masks: exactly the sampled ids are trainable, with their logprobs, turn ids and sources
    batch = build_batch([episode], pad_id=tokenizer.pad_token_id)
    mask = batch.loss_mask[0].bool()
    assert batch.input_ids[0, mask].tolist() == sum((t.output_ids for t in seg.turns), [])
    assert torch.all(batch.old_logprobs[0, mask] == -0.25)
    assert batch.turn_id[0, mask].unique().tolist() == [0, 1, 2]
    obs_sources = set(batch.source[0, ~mask].tolist())
    assert obs_sources == {Source.SYSTEM, Source.TOOL, Source.TEMPLATE}


def test_group_rollouts_share_a_group_id_and_stream_to_disk(tokenizer, tmp_path):
    gen = ScriptedGenerator(tokenizer, lookup_script)
    out = tmp_path / "episodes.jsonl"
    episodes = run_episodes(
        make_lookup_env, ["k1", "k2"], gen, tokenizer, config(), group_size=3, out_path=out
    )
    assert len(episodes) == 6 and all(e.outcome == 1.0 for e in episodes)
    assert len({e.group_id for e in episodes[:3]}) == 1 and episodes[0].group_id != episodes[3].group_id
    on_disk = read_jsonl(out)
    assert sorted(e.episode_id for e in on_disk) == sorted(e.episode_id for e in episodes)


def test_history_rewriting_template_falls_back_to_one_row_per_turn(tokenizer):
    rewriting = with_template(
        tokenizer, (FIXTURES / "reasoning_stripping.jinja").read_text(), agentrl_name="qwen3-style"
    )
    gen = ScriptedGenerator(rewriting, lookup_script)
    (episode,) = run_episodes(make_lookup_env, ["k5"], gen, rewriting, config())
    assert episode.error is None and episode.outcome == 1.0
    assert [s.kind for s in episode.segments] == ["turn", "turn", "turn"]
    for seg, (fed, out) in zip(episode.segments, gen.calls, strict=True):
        assert seg.prompt_ids == fed and seg.turns[0].output_ids == out.ids and seg.turns[0].obs_ids == []
    # the template stripped turn 0's reasoning from the later prompts, as it would at inference
    assert "<think>try</think>" not in rewriting.decode(episode.segments[1].prompt_ids)
    assert build_batch([episode], pad_id=0).input_ids.shape[0] == 3


def test_length_cut_turn_gets_the_end_of_turn_from_the_template(tokenizer):
    gen = ScriptedGenerator(tokenizer, lambda p, i: "word " * 100)
    (episode,) = run_episodes(make_lookup_env, ["k0"], gen, tokenizer, config(max_turns=2), progress=False)
    first = episode.segments[0].turns[0]
    assert first.finish_reason == "length" and first.output_ids[-1] != tokenizer.eos_token_id
    assert first.obs_ids[0] == tokenizer.eos_token_id and first.obs_source[0] == Source.TEMPLATE
    assert episode.truncated and episode.metrics["agent_truncated"] == 1.0


def test_oracle_episodes_are_demonstrations_with_zero_logprobs(tokenizer):
    episodes = run_oracle_episodes(make_lookup_env, ["k2", "k6"], LookupOracle, tokenizer, config())
    assert [e.outcome for e in episodes] == [1.0, 1.0]
    turns = episodes[0].segments[0].turns
    assert len(turns) == 2 and all(lp == 0.0 for t in turns for lp in t.output_logprobs)
    assert turns[1].action_text == "<answer>v2</answer>" and turns[1].output_ids[-1] == tokenizer.eos_token_id


def test_ground_truth_scoring_after_prompt_and_each_turn(tokenizer, tiny):
    from agentrl.rollout.generators.hf import HFGenerator
    from agentrl.rollout.scoring import ground_truth_logprobs, score_contexts

    gen = ScriptedGenerator(tokenizer, lookup_script)
    (episode,) = run_episodes(make_lookup_env, ["k3"], gen, tokenizer, config())
    scorer = HFGenerator(tiny, tokenizer)
    (scores,) = ground_truth_logprobs(scorer, tokenizer, [episode])
    contexts = score_contexts(episode)
    assert [after for after, _ in contexts] == [-1, 0, 1] and len(scores) == 3  # the answer turn has no obs
    prefix = tokenizer.encode("<answer>", add_special_tokens=False)
    gold = tokenizer.encode("v3", add_special_tokens=False)
    expected = scorer.score_mean([contexts[1][1] + prefix], [gold])[0]
    assert abs(scores[1] - expected) < 1e-5
    row = episode.segments[0].token_ids()
    assert contexts[2][1] == row[: len(contexts[2][1])]
