"""Real components end to end: the Search env with its oracle, and real SmolLM2 rollouts."""

from __future__ import annotations

import pytest
import torch

from agentrl.rollout.generators.base import GenerationOutput, SamplingParams
from agentrl.rollout.generators.hf import HFGenerator
from agentrl.rollout.runner import RunStats, run_episodes, run_oracle_episodes
from agentrl.rollout.settings import RolloutConfig
from agentrl.trajectory import build_batch


def test_search_oracle_demonstrations_through_the_runner(tokenizer):
    from agentrl.envs.search.oracle import SearchOracle

    episodes = run_oracle_episodes(
        "agentrl/Search-v0", [None, None], SearchOracle, tokenizer, None, progress=False, seed=3, group_size=1
    )
    assert [e.outcome for e in episodes] == [1.0, 1.0]
    for episode in episodes:
        seg = episode.segments[0]
        assert seg.turns[-1].action_text.startswith("<answer>")
        assert all(t.output_ids[-1] == tokenizer.eos_token_id for t in seg.turns)
        assert tokenizer.decode(seg.token_ids()).endswith("</answer><|im_end|>")


class Recording(HFGenerator):
    """The real HF generator, remembering every prompt and output (for the invariant)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[list[int], GenerationOutput]] = []

    def generate(self, prompts, sampling: SamplingParams, **kwargs):
        outs = super().generate(prompts, sampling, **kwargs)  # kwargs: the per-row seeds
        self.seen += [(list(p), o) for p, o in zip(prompts, outs, strict=True)]
        return outs


@pytest.mark.slow
def test_smollm2_on_search_keeps_tokens_and_logprobs_exact():
    from agentrl.rollout.model import load_model

    torch.set_num_threads(1)  # 2 shared cores: one thread avoids oversubscription
    model, tokenizer = load_model("smollm2-135m")
    gen = Recording(model, tokenizer)
    config = RolloutConfig(
        max_new_tokens=40, max_turns=2, temperature=0.8, max_context_tokens=2048, concurrency=2, group_size=1
    )
    stats = RunStats()
    env_kwargs = {"max_turns": 2}
    episodes = run_episodes("agentrl/Search-v0", [None, None], gen, tokenizer, config, seed=1, stats=stats,
                            env_kwargs=env_kwargs)  # fmt: skip
    assert all(not e.failed for e in episodes), [e.error for e in episodes]
    assert stats.generated_tokens > 0 and 0.0 <= stats.generator_idle_share <= 1.0
    by_output = {tuple(o.ids): (p, o) for p, o in gen.seen}
    for episode in episodes:
        for seg in episode.segments:
            row = seg.token_ids()
            position = len(seg.prompt_ids)
            for turn in seg.turns:
                fed, out = by_output[tuple(turn.output_ids)]
                assert fed == row[:position] and turn.output_logprobs == out.logprobs
                position += len(turn.output_ids) + len(turn.obs_ids)
    # the learner's recomputation equals the sampler's log-probs (temperature-scaled)
    batch = build_batch(episodes, pad_id=tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask
        ).logits.float()  # [B, L, V]
    logp = torch.log_softmax(logits[:, :-1] / 0.8, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    mask = batch.loss_mask[:, 1:].bool()
    diff = (logp[mask] - batch.old_logprobs[:, 1:][mask]).abs()
    assert diff.max().item() < 2e-3, diff.max().item()


def test_citing_oracle_quotes_the_infobox_line_then_answers(tokenizer):
    """The citing warm-up's demonstrations: the answer turn is ``Label: value`` (the line of the page
    the relation names) then ``<answer>value</answer>``, scored 1 by the real env; multi-hop tasks
    quote only the last hop's line."""
    import agentrl
    from agentrl.envs.search.oracle import CitingSearchOracle
    from agentrl.envs.search.wiki import RELATIONS

    for hops, seed in (("single", 3), ("multi", 5)):
        episodes = run_oracle_episodes(
            lambda hops=hops: agentrl.make("agentrl/Search-v0", hops=hops), [None, None], CitingSearchOracle,
            tokenizer, None, progress=False, seed=seed, group_size=1,
        )  # fmt: skip
        for episode in episodes:
            assert episode.outcome == 1.0
            last = episode.segments[0].turns[-1].action_text
            line, answer = last.split("\n")
            label, value = line.split(": ", 1)
            assert answer == f"<answer>{value}</answer>" and value in episode.ground_truth
            assert label in {lab for lab, _ in RELATIONS.values()}
            page = episode.segments[0].turns[-2].observation
            assert f"\n{line}" in page  # the quoted line is the page's own


def test_planning_oracle_names_the_label_first_then_quotes_it(tokenizer):
    """The planning warm-up's demonstrations: the first turn names the label sought (``Looking for:
    Currency``) before its search call, and the answer turn quotes that label's line of the page."""
    from agentrl.envs.search.oracle import PlanningSearchOracle

    episodes = run_oracle_episodes(
        "agentrl/Search-v0", [None, None, None], PlanningSearchOracle, tokenizer, None, progress=False, seed=4,
        group_size=1,
    )  # fmt: skip
    for episode in episodes:
        turns = episode.segments[0].turns
        assert episode.outcome == 1.0
        plan, call = turns[0].action_text.split("\n", 1)
        assert plan.startswith("Looking for: ") and call.startswith("<tool_call>") and len(turns[0].tool_calls) == 1
        label = plan.removeprefix("Looking for: ")
        assert turns[-1].action_text.startswith(f"{label}: ")
        assert all("Looking for" not in t.action_text for t in turns[1:])
