"""Runner: crashing and hanging envs are recorded (watchdog) without harming siblings; retries."""

from __future__ import annotations

import pytest

from agentrl.config import RolloutConfig
from agentrl.rollout.generators.scripted import ScriptedGenerator
from agentrl.rollout.runner import RunStats, run_episodes

from .test_agent import lookup_script
from .toy import LookupEnv, make_lookup_env


@pytest.fixture(autouse=True)
def _reset_faults():
    LookupEnv.faults = {}
    LookupEnv.hangs_left["count"] = 0
    yield
    LookupEnv.faults = {}
    LookupEnv.hangs_left["count"] = 0


def _config(**kw):
    return RolloutConfig(max_new_tokens=64, concurrency=4, group_size=1, **kw)


def test_a_crashing_env_is_recorded_and_siblings_finish(tokenizer):
    LookupEnv.faults = {"crash_on": "k2"}
    gen = ScriptedGenerator(tokenizer, lookup_script)
    stats = RunStats()
    episodes = run_episodes(make_lookup_env, ["k1", "k2", "k3"], gen, tokenizer, _config(), stats=stats)
    assert [e.failed for e in episodes] == [False, True, False]
    assert [e.outcome for e in episodes if not e.failed] == [1.0, 1.0]
    crashed = episodes[1]
    assert "RuntimeError: simulated env crash on k2" in crashed.error and "toy.py" in crashed.error
    assert crashed.task_id == "k2" and crashed.segments[0].turns == []  # partial record kept
    assert stats.failed == 1 and stats.episodes == 3


def test_watchdog_names_a_hanging_episode_and_cancels_it(tokenizer):
    LookupEnv.faults = {"hang_on": "k4", "hang_s": 6}
    LookupEnv.hangs_left["count"] = 1
    gen = ScriptedGenerator(tokenizer, lookup_script)
    stats = RunStats()
    episodes = run_episodes(
        make_lookup_env, ["k4", "k5"], gen, tokenizer, _config(watchdog_s=1.0), stats=stats, out_path=None
    )
    hung, fine = episodes
    assert fine.outcome == 1.0 and not fine.failed
    assert hung.failed and hung.error.startswith("watchdog: no progress for 1s")
    assert "turn 0" in hung.error and "phase env" in hung.error and "lookup" in hung.error
    assert stats.watchdog_fired == 1


def test_watchdog_retry_reruns_the_episode(tokenizer):
    LookupEnv.faults = {"hang_on": "k6", "hang_s": 6}
    LookupEnv.hangs_left["count"] = 1  # only the first attempt hangs
    gen = ScriptedGenerator(tokenizer, lookup_script)
    stats = RunStats()
    (episode,) = run_episodes(
        make_lookup_env,
        ["k6"],
        gen,
        tokenizer,
        _config(watchdog_s=1.0, watchdog_action="retry", max_retries=1),
        stats=stats,
    )
    assert not episode.failed and episode.outcome == 1.0
    assert stats.retried == 1 and stats.watchdog_fired == 1


def test_episode_timeout_is_recorded(tokenizer):
    LookupEnv.faults = {"hang_on": "k7", "hang_s": 4}
    LookupEnv.hangs_left["count"] = 1
    gen = ScriptedGenerator(tokenizer, lookup_script)
    (episode,) = run_episodes(
        make_lookup_env, ["k7"], gen, tokenizer, _config(episode_timeout_s=1.0, watchdog_s=60)
    )
    assert episode.failed and "episode timeout after 1s" in episode.error


def test_generator_errors_fail_only_their_episodes(tokenizer):
    def respond(prompt, index):
        if "k1?" in prompt:
            raise ValueError("scripted generator failure")
        return lookup_script(prompt, index)

    episodes = run_episodes(
        make_lookup_env, ["k0", "k1"], ScriptedGenerator(tokenizer, respond), tokenizer, _config()
    )
    assert not episodes[0].failed and episodes[1].failed and "scripted generator failure" in episodes[1].error


def test_the_run_config_rollout_section_is_the_runner_settings(tokenizer):
    """One rollout configuration: the YAML section is the object the runner, agent and sampler read
    (no copies), and its sampler request carries the settings."""
    from agentrl.config import load_config
    from agentrl.rollout.runner import Runner

    cfg = load_config(None, ["rollout.concurrency=3", "rollout.max_new_tokens=32", "rollout.temperature=0.5"])
    assert type(cfg.rollout) is RolloutConfig
    gen = ScriptedGenerator(tokenizer, lookup_script)
    runner = Runner(make_lookup_env, tokenizer, generator=gen, config=cfg.rollout)
    assert runner.config is cfg.rollout
    sampling = cfg.rollout.sampling(seed=3)
    assert (sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.seed) == (32, 0.5, 1.0, 3)
    assert cfg.rollout.max_turns is None  # derived per episode from the env's own turn budget


def test_turn_cap_comes_from_the_env_budget_and_the_context_strategy(tokenizer):
    from agentrl.rollout.agent import turn_budget
    from agentrl.rollout.context import Branch, Concat, PerTurn, Summary, choose_context

    assert turn_budget(make_lookup_env(max_turns=4)) == 4
    assert turn_budget(object()) is None
    # every turn steps the env: its budget ends the episode first; folding turns do not step it
    assert [c.turn_cap(4) for c in (Concat, PerTurn, Summary, Branch)] == [5, 5, 9, 13]
    assert choose_context(RolloutConfig(folding="branch"), tokenizer) is Branch
    assert choose_context(RolloutConfig(template_mode="per_turn"), tokenizer) is PerTurn
    assert choose_context(RolloutConfig(), tokenizer) is Concat


def test_progress_display_and_parquet_output(tokenizer, tmp_path, capsys):
    from agentrl.trajectory import load

    gen = ScriptedGenerator(tokenizer, lookup_script)
    out = tmp_path / "eps.parquet"
    config = RolloutConfig(max_new_tokens=64, concurrency=2, group_size=1)
    episodes = run_episodes(
        make_lookup_env, ["k1", "k2"], gen, tokenizer, config, out_path=out, progress=True
    )
    assert [e.outcome for e in episodes] == [1.0, 1.0]
    assert [e.episode_id for e in load(out)] == [e.episode_id for e in episodes]
    assert not (tmp_path / "eps.parquet.partial.jsonl").exists()
    assert "rollout" in capsys.readouterr().out


def test_every_rollout_setting_is_checked_once_naming_the_field_and_fix(tokenizer):
    """RolloutConfig.validate is the one check: a YAML section, a RolloutConfig built in code and a
    run_episodes call fail alike, naming the field."""
    from agentrl.config import load_config
    from agentrl.errors import ConfigError

    gen = ScriptedGenerator(tokenizer, lookup_script)
    for bad, field in (
        ({"folding": "fold"}, "rollout.folding"),
        ({"watchdog_action": "wait"}, "rollout.watchdog_action"),
        ({"temperature": 9.0}, "rollout.temperature"),
        ({"max_new_tokens": 4096}, "rollout.max_new_tokens"),
        ({"concurrency": 0}, "rollout.concurrency"),
        ({"max_turns": 0}, "rollout.max_turns"),
        ({"backend": "tgi"}, "rollout.backend"),
    ):
        with pytest.raises(ConfigError, match=field):
            RolloutConfig(**bad).validate()
        with pytest.raises(ConfigError, match=field):
            load_config(None, [f"rollout.{k}={v}" for k, v in bad.items()])
        with pytest.raises(ConfigError, match=field):
            run_episodes(make_lookup_env, ["k1"], gen, tokenizer, RolloutConfig(**bad))


class _SlowStartingEnv:
    """The lookup env behind a slow ``start()`` (as a Ray env actor starts), with its own start limit."""

    def __init__(self, start_s: float, limit_s: float):
        self.env, self.start_s, self.limit_s = make_lookup_env(), start_s, limit_s

    async def start(self) -> None:
        import asyncio

        from agentrl.errors import EnvError

        try:
            await asyncio.wait_for(asyncio.sleep(self.start_s), self.limit_s)
        except TimeoutError:
            raise EnvError(f"env start took over {self.limit_s:g}s (its start limit)") from None

    @property
    def unwrapped(self):
        return self.env.unwrapped

    def reset(self, **kwargs):
        return self.env.reset(**kwargs)

    def step(self, action):
        return self.env.step(action)

    def close(self):
        self.env.close()


def test_an_env_start_is_not_watched_but_bounded_by_its_own_limit(tokenizer):
    """Starting an env (``start()``: a Ray actor, the env built on it) is the episode's "starting"
    phase: the watchdog (1 s here) and the episode timeout (3 s) do not count it; the env's own start
    limit does."""
    gen = ScriptedGenerator(tokenizer, lookup_script)
    config = _config(watchdog_s=1.0, episode_timeout_s=3.0)
    stats = RunStats()
    slow = run_episodes(
        lambda: _SlowStartingEnv(4.0, 30.0), ["k1", "k2"], gen, tokenizer, config, stats=stats
    )
    assert [e.outcome for e in slow] == [1.0, 1.0] and stats.watchdog_fired == 0
    assert all(e.timings["env_s"] >= 4.0 for e in slow)  # the start is env time, just not watched
    stats = RunStats()
    (cut,) = run_episodes(lambda: _SlowStartingEnv(30.0, 2.0), ["k1"], gen, tokenizer, config, stats=stats)
    assert cut.failed and "env start took over 2s" in cut.error and stats.watchdog_fired == 0


def test_run_stats_of_two_waves_merge_into_one():
    """A step's refill rounds are one rollout: counts and seconds add, rates come from the sums."""
    a = RunStats(episodes=8, failed=1, turns=20, generated_tokens=400, wall_s=10.0, generate_busy_s=6.0,
                 generate_calls=5, process={"process/generated_tokens": 400.0, "process/penalised_tokens": 40.0})  # fmt: skip
    b = RunStats(episodes=8, retried=2, watchdog_fired=1, turns=12, generated_tokens=200, wall_s=30.0,
                 generate_busy_s=6.0, generate_calls=3, process={"process/generated_tokens": 200.0})  # fmt: skip
    m = a.merge(b).as_metrics()
    assert m["rollout/episodes"] == 16 and m["rollout/failed"] == 1 and m["rollout/watchdog_fired"] == 1
    assert m["perf/rollout_wall_s"] == 40.0 and m["rollout/episodes_per_s"] == pytest.approx(16 / 40)
    assert m["rollout/tokens_per_s"] == pytest.approx(600 / 40)
    assert m["rollout/generator_idle_share"] == pytest.approx(1 - 12 / 40)  # busy 12 s of 40
    assert m["rollout/process_share/any"] == pytest.approx(40 / 600)
    assert a.merge(b).retried == 2 and a.episodes == 8  # the inputs are left as they were
    # without a batcher the idle shares are weighted by wall time
    c = RunStats(wall_s=10.0, generator_idle_share=0.5).merge(RunStats(wall_s=30.0, generator_idle_share=0.1))
    assert c.generator_idle_share == pytest.approx((0.5 * 10 + 0.1 * 30) / 40)


def test_waiting_for_a_loaded_generator_does_not_count_against_the_episode_timeout(tokenizer):
    """Every generation call takes 0.6 s (a generator shared by a busy wave); the three-turn lookup
    episode waits 1.8 s for it, more than its 1 s budget, and still finishes: the budget counts the
    episode's own time. An env that hangs past the budget (test above) still times out."""
    import time

    def slow(prompt, index):
        time.sleep(0.6)
        return lookup_script(prompt, index)

    stats = RunStats()
    (episode,) = run_episodes(
        make_lookup_env, ["k3"], ScriptedGenerator(tokenizer, slow), tokenizer,
        _config(episode_timeout_s=1.0, watchdog_s=60), stats=stats,
    )  # fmt: skip
    assert not episode.failed and episode.outcome == 1.0, episode.error
    assert len(episode.segments[0].turns) == 3
    from agentrl.rollout.generators.hf import HFGenerator
    from agentrl.rollout.generators.openai import OpenAIGenerator

    # in-process engines share their batches; a remote server's request is the episode's own
    # (tests/eval/test_chat_agent.py: a hung server still ends its episode at the timeout)
    assert ScriptedGenerator.shared_batches and HFGenerator.shared_batches
    assert not OpenAIGenerator.shared_batches
    assert episode.timings["generate_s"] >= 1.8 > 1.0  # waited longer than the whole budget


def test_own_time_keeps_counting_between_generations(tokenizer):
    """An env step slower than the budget fails even when generation is slow as well."""
    import time

    LookupEnv.faults = {"hang_on": "k5", "hang_s": 2}
    LookupEnv.hangs_left["count"] = 1

    def slow(prompt, index):
        time.sleep(0.5)
        return lookup_script(prompt, index)

    (episode,) = run_episodes(
        make_lookup_env, ["k5"], ScriptedGenerator(tokenizer, slow), tokenizer,
        _config(episode_timeout_s=1.0, watchdog_s=60),
    )  # fmt: skip
    assert episode.failed and "episode timeout after 1s" in episode.error
    assert episode.timings["env_s"] >= 0.95  # cut inside the env call, near 1 s of own time


def test_waiting_counts_the_call_in_flight_once():
    from agentrl.rollout.agent import Progress

    progress = Progress(env_id="e", episode_id="x", generate_s=1.0)
    progress.touch("generate")
    now = progress.last_progress + 2.0
    assert progress.waiting_s(now) == pytest.approx(3.0)  # 1 s done before + 2 s in flight
    progress.generate_s += 2.0  # the call returned: EpisodeRun adds it and leaves "generate"
    progress.touch("between")
    assert progress.waiting_s(progress.last_progress + 5.0) == pytest.approx(3.0)


def test_run_episodes_passes_the_runners_options_on_and_the_rest_are_rollout_settings(tokenizer):
    """run_episodes' extra keywords: the Runner's own (defined once, on Runner) go to it, the others
    change rollout settings; no name may be both (it would not reach the setting)."""
    import dataclasses

    from agentrl.rollout.runner import RUNNER_OPTIONS

    assert not set(RUNNER_OPTIONS) & {f.name for f in dataclasses.fields(RolloutConfig)}
    assert {"policy_factory", "on_episode", "env_kwargs", "lockstep", "timeout_setting"} <= set(RUNNER_OPTIONS)
    seen = []
    episodes = run_episodes(make_lookup_env, ["k1"], ScriptedGenerator(tokenizer, lookup_script), tokenizer,
                            _config(), on_episode=seen.append, policy_version=3, group_size=2)  # fmt: skip
    assert len(episodes) == len(seen) == 2 and {e.policy_version for e in episodes} == {3}
    with pytest.raises(TypeError, match="group_sise"):  # neither an option nor a setting
        run_episodes(make_lookup_env, ["k1"], None, tokenizer, _config(), group_sise=2)
