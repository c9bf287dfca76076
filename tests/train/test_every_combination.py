"""Every registered advantage estimator with every loss it pairs with: one real optimizer step.

Real pieces only: a tiny random Qwen2 over the SmolLM2 tokenizer, episodes from the Search env
(the tiny model's own rollouts, which fail, plus the scripted oracle's, which succeed, in the same
prompt groups), with context folding where the objective needs it (FoldAct: summary restarts;
FoldGRPO: branch folding). For each pair the config is validated first: a pair the contract
refuses must fail validation with its reason; every other pair runs one update and must give a
finite loss, a non-zero gradient on the trained parameters, and hand the estimator and the loss
exactly their declared needs, each with the shape its producer declares.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

import agentrl
import agentrl.algos  # noqa: F401  (registers the objectives)
from agentrl.algos.spec import LEVEL_NEEDS, tensor_parameters
from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.registry import ADVANTAGES, LOSSES
from agentrl.train.engines import TorchEngine
from agentrl.train.fields import BATCH_FIELDS, LazyScores, StepData
from agentrl.train.igscore import GoldAnswerScorer, learner_continuation_scorer
from agentrl.train.learner import build_policy
from agentrl.train.plan import objective_plan
from agentrl.train.update import compute_advantages, ppo_update, score_tokens
from agentrl.trajectory import Source, build_batch

pytestmark = pytest.mark.slow

ENV = dict(max_turns=3, max_obs_chars=300, hops="single")
BASE = [
    "env.id=agentrl/Search-v0", "env.max_turns=3", "rollout.max_new_tokens=8", "rollout.summary_threshold=60",
    "rollout.max_summaries=2", "train.minibatch_size=16", "train.micro_batch_size=4", "train.lr=1e-3",
    "algo.kl_coef=0.01", "algo.entropy_coef=0.01", "train.logprob_impl=chunked", "train.num_threads=1",
]  # fmt: skip
POLICY_LOSSES = [n for n in LOSSES.names() if LOSSES.get(n).role == "policy"]
# what each pair is refused for, when it is (asserted below: everything else must train)
REFUSED = {
    **{(est, "gspo"): "sequence-level ratio" for est in ("gae", "igpo", "empg", "gigpo", "foldgrpo")},
    (
        "foldgrpo",
        "foldact",
    ): "rollout.folding",  # branch-folding process rewards vs the summary full-context pass
}


def settings(advantage: str, loss: str) -> list[str]:
    folding = "summary" if loss == "foldact" else "branch" if advantage == "foldgrpo" else "none"
    return [*BASE, f"algo.advantage={advantage}", f"algo.loss={loss}", f"rollout.folding={folding}",
            f"algo.critic={str(advantage == 'gae').lower()}"]  # fmt: skip


@pytest.fixture(scope="module")
def world():
    return make_world()


def make_world():
    """(tokenizer, tiny model, its initial state, {folding: real episodes})."""
    from agentrl.registry import load_entry_point
    from agentrl.rollout.generators.base import make_generator
    from agentrl.rollout.model import load_tokenizer, tiny_model
    from agentrl.rollout.runner import run_episodes, run_oracle_episodes

    tokenizer = load_tokenizer("smollm2-135m")
    model = tiny_model(tokenizer, layers=1, hidden=32, seed=0, arch="qwen2")
    make_env = lambda: agentrl.make("agentrl/Search-v0", **ENV)  # noqa: E731
    probe = make_env()
    tasks = list(probe.unwrapped.load_tasks("train"))[:2]
    probe.close()
    oracle = load_entry_point("agentrl.envs.search.oracle:SearchOracle")
    episodes = {}
    for folding in ("none", "summary", "branch"):
        cfg = load_config(None, [*BASE, f"rollout.folding={folding}"], validate=False)
        runner = dataclasses.replace(cfg.rollout, group_size=1)
        generator = make_generator("hf", model=model, tokenizer=tokenizer, seed=0, max_batch_size=8)
        sampled = run_episodes(make_env, tasks, generator, tokenizer, runner, seed=1)
        demo = dataclasses.replace(runner, max_new_tokens=512)
        solved = run_oracle_episodes(make_env, tasks, oracle, tokenizer, demo, seed=2)
        episodes[folding] = [ep for ep in sampled + solved if not ep.failed]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return tokenizer, model, state, episodes


def test_the_episodes_are_what_the_objectives_need(world):
    _, _, _, episodes = world
    for eps in episodes.values():
        assert {ep.outcome for ep in eps} == {0.0, 1.0}  # both outcomes in every prompt group
        assert len({ep.group_id for ep in eps}) == 2
        assert {ep.terminated and not ep.truncated for ep in eps} == {True, False}  # SUPO: (un)finished
    assert all(len(ep.segments) > 1 for ep in episodes["summary"])  # summary restarts: several rows
    assert build_batch(episodes["summary"]).source.eq(int(Source.SUMMARY)).any()


class _Capture(TorchEngine):
    def step(self):
        self.grads = torch.cat([p.grad.flatten() for p in self.params if p.grad is not None])
        return super().step()


def _shape_ok(spec: str, value: torch.Tensor, b: int, length: int, rollouts: int, turns: int) -> bool:
    want = {
        "[B, L]": (b, length),
        "[B]": (b,),
        "[R]": (rollouts,),
        "[B, K]": (b, turns),
        "[B, K+1]": (b, turns + 1),
    }
    return tuple(value.shape) == want[spec]


def run_pair(world, advantage: str, loss_name: str) -> dict[str, float]:
    """One validated optimizer step of ``advantage`` x ``loss_name``; asserts the contract held."""
    tokenizer, model, state, episodes = world
    config = load_config(None, settings(advantage, loss_name))  # validates: every need has a producer
    plan = objective_plan(config)
    estimator, loss = plan.estimator, plan.loss
    model.load_state_dict(state)
    engine = _Capture(build_policy(model, config), lr=1e-3, max_grad_norm=0.0)
    engine.policy.prepare_reference()
    eps = episodes[config.rollout.folding]
    tokens = build_batch(eps, pad_id=int(tokenizer.pad_token_id))
    scorer = GoldAnswerScorer(None, tokenizer, config.algo.ig_template,
                              continuation=learner_continuation_scorer(engine))  # fmt: skip
    old = LazyScores(lambda: score_tokens(engine, tokens, 4))
    step = StepData(
        episodes=eps,
        tokens=tokens,
        old=old,
        config=config,
        plan=objective_plan(config),
        ig_scorer=scorer,
        engine=engine,
    )
    rows, width = tokens.input_ids.shape
    turns = max(t.index for ep in eps for t in ep.turns) + 1
    seen_est: dict[str, tuple[int, ...]] = {}
    seen_loss: list[dict[str, tuple[int, ...]]] = []

    @functools.wraps(estimator.call)  # same parameters, so the needs derive exactly as for the real one
    def spy_call(*args, **kwargs):
        assert not args, args  # the estimator is handed its tensors by name
        for name in estimator.needs:
            if name in kwargs:
                value = kwargs[name]
                spec = BATCH_FIELDS.get(name).shape
                assert _shape_ok(spec, value, rows, width, len(eps), turns), (advantage, name, spec, value.shape)
                seen_est[name] = tuple(value.shape)
        return estimator.call(**kwargs)

    @functools.wraps(loss.fn)  # same signature, so the options resolve exactly as for the real one
    def spy_fn(first, second, target, mask, **kwargs):
        tensors = dict(zip(loss.head, (first, second, mask), strict=True))
        tensors |= {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        b, length = first.shape
        for name, value in tensors.items():
            spec = BATCH_FIELDS.get(name).shape
            assert _shape_ok(spec, value, b, length, -1, -1), (loss_name, name, spec, value.shape)
        seen_loss.append({k: tuple(v.shape) for k, v in tensors.items()})
        return loss.fn(first, second, target, mask, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(ADVANTAGES._entries, advantage, dataclasses.replace(estimator, call=spy_call))
        patch.setitem(LOSSES._entries, loss_name, dataclasses.replace(loss, fn=spy_fn))
        step = dataclasses.replace(step, plan=objective_plan(config))  # the plan that calls the spies
        ref = score_tokens(engine, tokens, 4, reference=True)["logp"]
        adv, returns, batch = compute_advantages(step)
        metrics = ppo_update(engine, step, batch, adv, returns, ref, rng=torch.Generator().manual_seed(0))

    # the function got its own tensors, the level's (row_rollout / turn_id / loss_mask) were read beside it
    assert set(seen_est) == set(tensor_parameters(estimator.call)), (advantage, loss_name)
    assert set(seen_est) | set(LEVEL_NEEDS[estimator.level]) == set(estimator.needs), (advantage, loss_name)
    assert seen_loss and all(set(s) == set(plan.loss_needs) for s in seen_loss), (loss_name, seen_loss)
    assert math.isfinite(metrics["loss"]), (advantage, loss_name, metrics)
    assert adv.abs().sum() > 0, (advantage, loss_name)
    assert engine.grads.abs().sum() > 0 and torch.isfinite(engine.grads).all(), (advantage, loss_name)
    return metrics


@pytest.mark.parametrize("advantage", ADVANTAGES.names())
def test_every_estimator_trains_with_every_loss_it_pairs_with(world, advantage):
    trained = []
    for loss_name in POLICY_LOSSES:
        overrides = settings(advantage, loss_name)
        if (advantage, loss_name) in REFUSED:
            with pytest.raises(ConfigError, match=REFUSED[advantage, loss_name]):
                load_config(None, overrides)
            if loss_name == "foldact":  # refused under either folding, not just this one
                with pytest.raises(ConfigError, match="rollout.folding"):
                    load_config(None, [*overrides, "rollout.folding=branch"])
            continue
        metrics = run_pair(world, advantage, loss_name)
        if loss_name == "foldact":  # summary tokens and the full-context consistency term really ran
            assert metrics["summary_tokens"] > 0 and metrics["consistency_tokens"] > 0
            assert metrics["loss_consistency"] != 0.0
        trained.append(loss_name)
    assert trained == [n for n in POLICY_LOSSES if (advantage, n) not in REFUSED]
