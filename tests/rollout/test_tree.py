"""Tree rollouts (rollout.branches): a root episode forks by replay at a turn boundary; the branches
reach the same env state, share the root's prefix token for token, and leave it out of the loss."""

from __future__ import annotations

import itertools

import pytest
import torch
from tests.rollout.toy import LookupEnv, make_lookup_env

from agentrl.errors import ConfigError
from agentrl.rollout.generators.hf import HFGenerator
from agentrl.rollout.runner import RunStats, run_episodes
from agentrl.rollout.settings import RolloutConfig
from agentrl.rollout.tree import prefix_ids
from agentrl.trajectory import Source, build_batch, segment_arrays


def _settings(**changes) -> RolloutConfig:
    base = dict(max_new_tokens=12, max_context_tokens=1024, temperature=1.0, concurrency=16, group_size=2,
                branches=3, max_turns=3)  # fmt: skip
    return RolloutConfig(**{**base, **changes})


def _run(tiny, tokenizer, env=make_lookup_env, stats=None, **changes):
    gen = HFGenerator(tiny, tokenizer, max_batch_size=16)
    return run_episodes(env, ["k1", "k2"], gen, tokenizer, _settings(**changes), seed=7, stats=stats)


def test_each_root_is_followed_by_its_branches_which_replay_its_prefix_exactly(tiny, tokenizer):
    stats = RunStats()
    episodes = _run(tiny, tokenizer, stats=stats)
    assert len(episodes) == 2 * 2 * 4  # tasks x roots x (root + 3 branches)
    generated = 0
    for tree in (episodes[i : i + 4] for i in range(0, len(episodes), 4)):
        root, branches = tree[0], tree[1:]
        assert root.parent_id is None and not root.failed
        k = root.branch_turn
        assert k == len(root.turns) - 1  # branch_at=last: the branches re-sample the last turn
        assert all(t.shared for t in root.turns[:k]) and not any(t.shared for t in root.turns[k:])
        generated += sum(len(t.output_ids) for t in root.turns)
        for branch in branches:
            assert not branch.failed, branch.error
            assert branch.parent_id == root.episode_id and branch.group_id == root.group_id
            assert branch.task_id == root.task_id and branch.branch_turn == k
            assert prefix_ids(branch, k) == prefix_ids(root, k)  # the same state, token for token
            assert [t.output_logprobs for t in branch.turns[:k]] == [t.output_logprobs for t in root.turns[:k]]
            assert all(t.shared for t in branch.turns[:k]) and not any(t.shared for t in branch.turns[k:])
            generated += sum(len(t.output_ids) for t in branch.turns[k:])
            assert branch.timings["generated_tokens"] == sum(len(t.output_ids) for t in branch.turns[k:])
        # the continuations after the fork are sampled on their own streams
        assert len({tuple(e.turns[k].output_ids) for e in tree}) > 1
    assert len({e.group_id for e in episodes}) == 4  # one group per tree
    assert stats.generated_tokens == generated  # replayed turns are not counted as generated


def test_shared_tokens_have_their_own_source_and_no_loss(tiny, tokenizer):
    episodes = _run(tiny, tokenizer)
    branch = episodes[1]
    k = branch.branch_turn
    assert k >= 1
    batch = build_batch([branch])
    row = segment_arrays(branch.segments[0])
    shared = sum(len(t.output_ids) for t in branch.turns[:k])
    own = sum(len(t.output_ids) for t in branch.turns[k:])
    assert row["source"].count(int(Source.SHARED)) == shared
    assert row["source"].count(int(Source.MODEL)) == own
    assert int(batch.loss_mask.sum()) == own
    assert torch.equal(batch.source[0, : len(row["source"])], torch.tensor(row["source"]))


def _essence(episode):
    return (episode.episode_id, episode.group_id, episode.parent_id, episode.branch_turn, episode.outcome,
            [(t.output_ids, t.output_logprobs, t.obs_ids, t.shared) for t in episode.turns])  # fmt: skip


def test_the_same_seed_gives_the_same_tree(tiny, tokenizer):
    first, second = _run(tiny, tokenizer), _run(tiny, tokenizer)
    assert [_essence(e) for e in first] == [_essence(e) for e in second]


def test_branches_in_flight_change_the_batches_not_the_branches(tiny, tokenizer):
    """rollout.branch_concurrency: 12 branches (4 roots x 3, each answering once) decode one at a
    time or in one lock-step batch; each samples on its own stream, so the same tokens come out."""
    narrow, wide = RunStats(), RunStats()
    one_by_one = _run(tiny, tokenizer, stats=narrow, branch_concurrency=1)
    together = _run(tiny, tokenizer, stats=wide, branch_concurrency=12)
    assert narrow.generate_calls - wide.generate_calls == 12 - 1  # the roots' calls are the same
    tokens = [[t.output_ids for t in e.turns] for e in one_by_one]
    assert tokens == [[t.output_ids for t in e.turns] for e in together]


def test_uniform_branch_points_are_seeded_turn_boundaries(tiny, tokenizer):
    episodes = _run(tiny, tokenizer, branch_at="uniform")
    points = [e.branch_turn for e in episodes if e.parent_id is None]
    assert all(0 <= p < 3 for p in points)
    assert points == [e.branch_turn for e in _run(tiny, tokenizer, branch_at="uniform") if e.parent_id is None]


class _DriftingEnv(LookupEnv):
    """Observations carry a process-wide counter: the same actions do not give the same state."""

    counter = itertools.count()

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return f"{obs} #{next(self.counter)}", reward, terminated, truncated, info


def test_a_branch_that_diverges_under_replay_fails_saying_where(tiny, tokenizer):
    from agentrl.env import ObservationBudget, TurnBudget

    episodes = _run(tiny, tokenizer, env=lambda: TurnBudget(ObservationBudget(_DriftingEnv(), 2000), 3))
    roots = [e for e in episodes if e.parent_id is None]
    branches = [e for e in episodes if e.parent_id is not None]
    assert roots and not any(r.failed for r in roots)
    forked = [b for b in branches if b.branch_turn is None]  # failed branches are not marked shared
    assert forked and all(b.failed and "fork by replay" in b.error and "observation of turn 0" in b.error for b in forked)


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"branches": -1}, "rollout.branches"), ({"branch_at": "middle"}, "rollout.branch_at"),
     ({"folding": "summary"}, "rollout.branches"), ({"branch_temperature": 0.0}, "rollout.branch_temperature"),
     ({"branch_concurrency": 0}, "rollout.branch_concurrency")],  # fmt: skip
)
def test_bad_tree_settings_name_the_field(changes, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        RolloutConfig(**{"branches": 2, **changes}).validate()


def test_tree_rollouts_refuse_a_text_agent_whose_state_replay_cannot_restore(tokenizer):
    from agentrl.rollout.agent import TextPolicy
    from agentrl.rollout.runner import Runner

    with pytest.raises(ConfigError, match=r"rollout\.branches"):
        Runner(make_lookup_env, tokenizer, policy_factory=lambda: TextPolicy(None), config=_settings())


def test_branches_sample_their_own_turns_at_the_branch_temperature(tiny, tokenizer):
    """rollout.branch_temperature: roots and the replayed prefix stay at rollout.temperature (1.0);
    a branch's own turns sample at 0.25, record it on the turn, and their sampler log-probs are the
    model's at 0.25 (checked against a scoring pass at each temperature)."""
    episodes = _run(tiny, tokenizer, branch_temperature=0.25)
    gen = HFGenerator(tiny, tokenizer, max_batch_size=16)
    own = []
    for tree in (episodes[i : i + 4] for i in range(0, len(episodes), 4)):
        root, branches = tree[0], tree[1:]
        assert [t.temperature for t in root.turns] == [None] * len(root.turns)
        for branch in branches:
            k = branch.branch_turn
            assert [t.temperature for t in branch.turns[:k]] == [None] * k  # replayed: the root's
            assert [t.temperature for t in branch.turns[k:]] == [0.25] * (len(branch.turns) - k)
            own.append((branch, k))
    branch, k = own[0]
    turn = branch.turns[k]
    context = prefix_ids(branch, k)  # what the branch's own turn was sampled from
    at_025 = gen.score([context], [turn.output_ids], temperature=0.25)[0]
    at_1 = gen.score([context], [turn.output_ids], temperature=1.0)[0]
    assert at_025 == pytest.approx(turn.output_logprobs, abs=1e-4)
    assert max(abs(a - b) for a, b in zip(at_1, turn.output_logprobs)) > 1e-2
    # the record carries it (schema 4) and reads back
    from agentrl.trajectory import Episode

    again = Episode.from_dict(branch.to_dict())
    assert again.turns[k].temperature == 0.25 and again.schema_version == 4
