"""Several environments in one run (issue #43): the config's checks, the sampler's proportions, and
the difficulty filter, the horizon curriculum, per-env metrics and reproducibility through
``agentrl train`` on a CI-sized mixture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import agentrl
from agentrl import Score, Task, TextEnv
from agentrl.config import load_config, to_dict
from agentrl.errors import ConfigError
from agentrl.tools import tool

REPO = Path(__file__).resolve().parents[2]
MIXTURE = REPO / "configs" / "mixture.yaml"


# --------------------------------------------------------------------------- toy envs: prompt formats
def _add_tool():
    @tool
    def add(n: int) -> str:
        """Add n to the counter.

        Args:
            n: how much to add.
        """
        return f"added {n}"

    return [add]


class HermesToy(TextEnv):
    system_prompt = 'Call add as <tool_call>{"name": "add", "arguments": {"n": 1}}</tool_call>; answer in <answer></answer>.'

    def load_tasks(self, split):
        return [Task(id=f"{split}-{i}", question=f"Reach {i}.", answer=str(i), split=split) for i in range(4)]

    def make_tools(self):
        return _add_tool()

    def score(self, answer, task):
        return Score(float(answer == task.answer), {})


class ReactToy(HermesToy):
    system_prompt = "Call add as add[1]; answer in <answer></answer>."


agentrl.register("test/MixHermes-v0", f"{__name__}:HermesToy", description="toy: <tool_call> format", max_turns=3)
agentrl.register("test/MixReact-v0", f"{__name__}:ReactToy", description="toy: ReAct format", max_turns=3)


def _mixture(tmp_path: Path, entries: list[dict], **env: object) -> Path:
    path = tmp_path / "mix.yaml"
    body = {"env": {"mixture": entries, **env}} if env else {"env": entries}
    path.write_text(yaml.safe_dump({**body, "train": {"sft_warmup_steps": 0}}))
    return path


SEARCH = {"id": "agentrl/Search-v0", "kwargs": {"hops": "single"}}
SQL = {"id": "agentrl/SQLShop-v0"}


def _error(path: Path, *overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    return info.value


# --------------------------------------------------------------------------- config
def test_every_shipped_single_env_config_loads_as_before():
    """One env stays the plain mapping: no mixture, every old env field where it was."""
    for path in [REPO / "configs" / "quickstart.yaml", *sorted((REPO / "configs" / "recipes").glob("*.yaml"))]:
        config = load_config(path, validate=False)
        raw = yaml.safe_load(path.read_text())["env"]
        assert config.env.mixture == () and config.env.id == raw["id"], path
        assert all(to_dict(config)["env"][k] == v for k, v in raw.items()), path


def test_a_list_of_envs_is_the_mixture_form_and_overrides_reach_one_entry(tmp_path):
    listed = load_config(_mixture(tmp_path, [SEARCH, SQL]), ["env.1.weight=3", "env.0.max_turns=5"])
    (tmp_path / "mapping.yaml").write_text(yaml.safe_dump(
        {"env": {"mixture": [SEARCH, SQL]}, "train": {"sft_warmup_steps": 0}}))  # fmt: skip
    mapped = load_config(tmp_path / "mapping.yaml", ["env.mixture.1.weight=3", "env.mixture.0.max_turns=5"])
    assert listed == mapped
    assert listed.env.id == "mixture"
    assert [(e.short_name(), e.weight, e.max_turns) for e in listed.env.mixture] == [("search", 1.0, 5), ("sqlshop", 3.0, 10)]  # unset: the registration's
    # the saved form loads back to the same config (resolved_config.yaml)
    (tmp_path / "saved.yaml").write_text(yaml.safe_dump(to_dict(listed)))
    assert load_config(tmp_path / "saved.yaml") == listed
    assert _error(tmp_path / "mix.yaml", "env.2.weight=1").field == "env[2]"


@pytest.mark.parametrize(
    ("entries", "env", "overrides", "field", "says"),
    [
        ([SEARCH, {"id": "agentrl/Nope-v0"}], {}, [], "env[1].id", "unknown env 'agentrl/Nope-v0'"),
        ([SEARCH, SQL], {}, ["env.1.weight=0"], "env[1].weight", "must be > 0"),
        ([SEARCH, SQL], {}, ["env.0.weight=-1"], "env[0].weight", "must be > 0"),
        ([SEARCH, SQL], {}, ["env.1.wieght=2"], "env[1].wieght", "did you mean 'env[1].weight'"),
        ([SEARCH, {"id": "agentrl/WebShop-v0"}], {}, [], "env[1].id", "tool 'search' collides with env[0]"),
        ([{"id": "test/MixHermes-v0"}, {"id": "test/MixReact-v0"}], {}, [], "env[1].id", "mismatched prompt formats"),
        ([SEARCH, {**SEARCH, "kwargs": {}}], {}, [], "env[1].name", "also env[0]'s name"),
        ([SEARCH, SQL], {}, ["env.max_turns=3"], "env.max_turns", "set it per entry: env[i].max_turns"),
        ([SEARCH, SQL], {}, ["env.1.horizon_start=11"], "env[1].horizon_start", "must be in [0, max_turns=10]"),
        ([SEARCH, SQL], {}, ["env.1.horizon_every=2"], "env[1].horizon_every", "curriculum, which is off"),
        ([SEARCH, SQL], {"filter_solved": 0.9}, [], "env.filter_solved", "filter, which is off"),
        ([SEARCH, SQL], {"filter_window": 2, "filter_failed": 0.5, "filter_solved": 0.5}, [], "env.filter_solved",
         "filter_failed < filter_solved"),
        ([SEARCH, SQL], {}, ["env.normalize_rewards=zscore"], "env.normalize_rewards", "use one of: none, env_std"),
        ([SEARCH, SQL], {}, ["train.oracle=agentrl.envs.search.oracle:SearchOracle"], "train.oracle",
         "env[i].oracle"),
        ([SEARCH, SQL], {}, ["train.sft_warmup_steps=2"], "train.sft_warmup_steps", "no env names an oracle"),
        ([SEARCH, SQL], {}, ["env.0.ray_resources={a: 1}"], "env[0].ray_resources", "only applies to placement ray"),
        # the objective plan: IGPO scores the gold answer as text; SQL's answers are rows
        ([SEARCH, SQL], {}, ["algo.advantage=igpo"], "env[1].id", "agentrl/SQLShop-v0's tasks have no text answer"),
    ],
)  # fmt: skip
def test_a_bad_mixture_fails_before_anything_runs_naming_the_entry(tmp_path, entries, env, overrides, field, says):
    error = _error(_mixture(tmp_path, entries, **env), *overrides)
    assert error.field == field and says in str(error), str(error)


def test_mixture_settings_on_one_env_are_refused_not_ignored():
    error = _error(None, "env.filter_window=4")  # type: ignore[arg-type]
    assert error.field == "env.filter_window" and "this run has one env" in str(error)


def test_the_objective_plan_refuses_igpo_on_a_mixture_through_agentrl_train():
    from test_train_cli import agentrl_train

    proc = agentrl_train(str(MIXTURE), "algo.advantage=igpo", timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "env[1].id" in proc.stderr and "SQLShop-v0" in proc.stderr and "no text answer" in proc.stderr


# --------------------------------------------------------------------------- sampler
def test_apportioned_shares_are_the_hand_computed_ones():
    from agentrl.train.mixture import apportion

    assert apportion(4, [2, 1, 1], [0, 0, 0]) == [2, 1, 1]  # exact shares every step
    assert apportion(4, [2, 1, 1], [2, 1, 1]) == [2, 1, 1]
    # 1:1 with 3 tasks: targets 1.5 each; the tie goes to the earlier env, then the other catches up
    assert apportion(3, [1, 1], [0, 0]) == [2, 1]
    assert apportion(3, [1, 1], [2, 1]) == [1, 2]  # total 6: 3 each
    # 3:1 with 2 tasks: step 1 targets 1.5/0.5 -> 2/0; step 2 targets 3/1 -> 1/1 (4 tasks: 3 and 1)
    assert apportion(2, [3, 1], [0, 0]) == [2, 0]
    assert apportion(2, [3, 1], [2, 0]) == [1, 1]


def test_the_sampler_keeps_weights_over_a_run_and_repeats_with_its_seed():
    from agentrl.train.mixture import MixtureSampler

    def run(seed: int, steps: int = 10) -> list[list[int]]:
        sampler = MixtureSampler([5, 7, 3], [0.5, 0.25, 0.25], ["a", "b", "c"], seed)
        return [sampler.next(4) for _ in range(steps)]

    picks = run(0)
    env = lambda flat: 0 if flat < 5 else 1 if flat < 12 else 2  # noqa: E731
    assert all(sorted(map(env, p)) == [0, 0, 1, 2] for p in picks)  # 2, 1, 1 every step
    assert picks == run(0) and picks != run(1)
    # each env walks a permutation of its pool: env c's 3 tasks, 10 draws -> each 3 or 4 times
    counts = [sum(f == t for p in picks for f in p) for t in (12, 13, 14)]
    assert sorted(counts) == [3, 3, 4]
    # a resumed sampler draws what the first would have
    first = MixtureSampler([5, 7, 3], [0.5, 0.25, 0.25], ["a", "b", "c"], 0)
    [first.next(4) for _ in range(4)]
    resumed = MixtureSampler([5, 7, 3], [0.5, 0.25, 0.25], ["a", "b", "c"], 0, state=first.state())
    assert [resumed.next(4) for _ in range(6)] == picks[4:]


def test_the_filter_passes_over_tasks_whose_window_was_all_solved_or_all_failed():
    from agentrl.train.mixture import MixtureSampler

    sampler = MixtureSampler([2, 2], [1, 1], ["a", "b"], 0, window=2, solved=1.0, failed=0.0, cooldown=2)
    step0 = sampler.next(4)  # each env's two tasks
    assert sorted(step0) == [0, 1, 2, 3]
    rate = {0: 1.0, 1: 0.5, 2: 0.0, 3: 0.0}
    m = sampler.observe(0, step0, [rate[f] for f in step0])
    assert m["mix/a/too_easy"] == m["mix/b/too_hard"] == 0.0  # a window of 2 needs two groups
    step1 = sampler.next(4)
    m = sampler.observe(1, step1, [rate[f] for f in step1])
    # task 0 solved twice, tasks 2 and 3 failed twice: passed over at steps 2 and 3
    assert (m["mix/a/too_easy"], m["mix/a/too_hard"], m["mix/b/too_hard"]) == (1.0, 0.0, 2.0)
    assert (m["mix/a/filtered"], m["mix/b/filtered"]) == (1.0, 2.0)
    walked = lambda env: sampler.walk[env][0] * 2 + sampler.walk[env][1]  # noqa: E731  (tasks walked past)
    before = walked(0)
    step2 = sampler.next(4)
    assert [f for f in step2 if f < 2] == [1, 1]  # env a: task 1 only; every 0 met on the way is passed over
    m = sampler.observe(2, step2, [None] * 4)
    assert m["mix/a/skipped_draws"] == walked(0) - before - 2 >= 1
    assert m["mix/b/forced"] == 2.0 and m["mix/b/skipped_draws"] == 2.0  # env b has nothing else: one passed over, one taken
    sampler.next(4)
    m = sampler.observe(3, step2, [None] * 4)
    assert m["mix/a/filtered"] == m["mix/b/filtered"] == 0.0  # cooldown of 2 steps over


# --------------------------------------------------------------------------- through agentrl train
# a mixture of search (weight 2) and SQL (weight 1), CI-sized: a one-block random model, 3 RL steps of
# 3 tasks (2 search, 1 sql) x 2 samples, no warm-up, 1 held-out task per env
CI_MIXTURE = {
    "env": {
        "mixture": [
            {"id": "agentrl/Search-v0", "name": "search", "weight": 2, "max_turns": 4, "kwargs": {"hops": "single"},
             "train_tasks": 4, "eval_episodes": 1, "horizon_start": 2, "horizon_every": 1},
            {"id": "agentrl/SQLShop-v0", "name": "sql", "weight": 1, "max_turns": 3, "train_tasks": 2,
             "eval_episodes": 1},
        ],
        "filter_window": 1, "filter_cooldown": 2, "normalize_rewards": "env_std",
    },
    "rollout": {"group_size": 2, "tasks_per_step": 3, "concurrency": 6, "max_new_tokens": 16,
                "max_context_tokens": 1536, "tool_schemas": False},
    "algo": {"dynamic_sampling": False},
    "train": {"steps": 3, "sft_warmup_steps": 0, "micro_batch_size": 2, "minibatch_size": 6, "resume": False,
              "trainable_layers": 1, "num_threads": 1, "bf16_autocast": False, "save_episodes": True,
              "eval_episodes": 5},
}  # fmt: skip


def _run(tmp_path: Path, tiny_model_dir: Path, name: str):
    from test_train_cli import agentrl_train

    config = tmp_path / "ci-mixture.yaml"
    config.write_text(yaml.safe_dump(CI_MIXTURE))
    out = tmp_path / name
    proc = agentrl_train(str(config), f"model.name={tiny_model_dir}", f"train.out_dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, out


def _episodes(out: Path, step: int) -> list[dict]:
    return [json.loads(x) for x in (out / "episodes" / f"step-{step:06d}.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_mixture_trains_with_per_env_metrics_filter_and_curriculum(tiny_model_dir, tmp_path):
    proc, out = _run(tmp_path, tiny_model_dir, "a")
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in records if "perf/step_s" in r}
    assert sorted(steps) == [1, 2, 3]
    # weights 2:1, 3 tasks a step: 2 search tasks and 1 sql task every step, each a group of 2 of one env
    for step, record in steps.items():
        assert (record["mix/search/tasks"], record["mix/sql/tasks"]) == (2.0, 1.0)
        episodes = _episodes(out, step)
        assert [e["task_id"].split("/")[0] for e in episodes] == ["search"] * 4 + ["sql"] * 2
        groups: dict[str, set[str]] = {}
        for e in episodes:
            groups.setdefault(e["group_id"], set()).add(e["task_id"].split("/")[0])
        assert len(groups) == 3 and all(len(envs) == 1 for envs in groups.values())
    # the curriculum: search's training turn budget 2, 3, 4 (horizon_start 2, +1 a step); sql stays at 3.
    # The random model never answers, so every episode runs to its budget
    assert [steps[s]["mix/search/max_turns"] for s in (1, 2, 3)] == [2.0, 3.0, 4.0]
    assert [steps[s]["mix/sql/max_turns"] for s in (1, 2, 3)] == [3.0, 3.0, 3.0]
    for step, budget in ((1, 2), (2, 3), (3, 4)):
        assert steps[step]["env/search/turns"] == budget and steps[step]["env/sql/turns"] == 3
    # the filter (window 1, cooldown 2): every group fails, so a task drawn at step t is too hard and passed
    # over at steps t+1 and t+2. Hand trace from the tasks each step drew: filtered after step t = the tasks
    # drawn at t or t-1; a filtered task is drawn only when all of its env's are (forced)
    drawn = {s: {n: {e["task_id"] for e in _episodes(out, s) if e["task_id"].startswith(f"{n}/")}
                 for n in ("search", "sql")} for s in (1, 2, 3)}  # fmt: skip
    for name, pool in (("search", 4), ("sql", 2)):
        for s in (1, 2, 3):
            groups = {e["group_id"] for e in _episodes(out, s) if e["task_id"].startswith(f"{name}/")}
            assert steps[s][f"mix/{name}/too_hard"] == len(groups)  # a group each (a task drawn twice: two)
            assert steps[s][f"mix/{name}/filtered"] == len(drawn[s][name] | drawn.get(s - 1, {}).get(name, set()))
            earlier = drawn.get(s - 1, {}).get(name, set()) | drawn.get(s - 2, {}).get(name, set())
            if len(earlier) < pool:  # some task was not filtered: no filtered task drawn
                assert not drawn[s][name] & earlier and steps[s][f"mix/{name}/forced"] == 0.0
    # step 3: sql's 2 tasks and search's 4 were all filtered: each draw walks its env's whole pool, passing
    # over all but the last, which is taken anyway (search: 2 draws x 3 passed over; sql: 1 x 1)
    assert (steps[3]["mix/search/forced"], steps[3]["mix/search/skipped_draws"]) == (2.0, 6.0)
    assert (steps[3]["mix/sql/forced"], steps[3]["mix/sql/skipped_draws"]) == (1.0, 1.0)
    assert [steps[s]["mix/sql/filtered"] for s in (1, 2)] == [1.0, 2.0]
    # per-env metrics every step; rewards all 0, so env_std normalisation leaves them (std 0)
    for record in steps.values():
        for name in ("search", "sql"):
            for key in ("reward", "success", "turns", "tokens", "tool_errors", "tool_calls", "env_s", "episodes"):
                assert f"env/{name}/{key}" in record, (name, key)
            assert record[f"mix/{name}/reward_std"] == 0.0
    # held-out eval per env before and after, the summary's per-env sign tests, one table row per env
    evals = {r["step"]: r for r in records if "eval/success" in r}
    assert sorted(evals) == [0, 3] and all({"eval/search/success", "eval/sql/success"} <= set(r) for r in evals.values())
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["per_env"]) == {"search", "sql"}
    assert all(s["eval_episodes"] == 1 and "p_value" in s for s in summary["per_env"].values())
    assert summary["eval_episodes"] == 2
    table = proc.stdout.split("held-out success per env")[1]
    assert [line.split()[1] for line in table.splitlines() if line.startswith("│")] == ["search", "sql", "all"]
    assert "held-out success on sql before RL: " in proc.stdout
    # every resolved setting printed and saved: names and per-env eval sizes resolved
    resolved = yaml.safe_load((out / "resolved_config.yaml").read_text())
    assert [(e["name"], e["eval_episodes"], e["weight"]) for e in resolved["env"]["mixture"]] == [
        ("search", 1, 2.0), ("sql", 1, 1.0)]  # fmt: skip
    assert resolved["env"]["normalize_rewards"] == "env_std" and resolved["env"]["filter_window"] == 1
    assert "difficulty filter: window 1 groups" in proc.stdout and "reward normalisation: env_std" in proc.stdout
    assert (out / "curve.png").stat().st_size > 0
    assert list(out.glob("events.out.tfevents.*")) or list(out.rglob("events.out.tfevents.*"))


@pytest.mark.slow
def test_a_mixture_run_repeats_with_its_seed(tiny_model_dir, tmp_path):
    _, a = _run(tmp_path, tiny_model_dir, "a")
    _, b = _run(tmp_path, tiny_model_dir, "b")
    for step in (1, 2, 3):
        left, right = _episodes(a, step), _episodes(b, step)
        key = lambda e: (e["task_id"], e["group_id"], [t["output_ids"] for s in e["segments"] for t in s["turns"]])  # noqa: E731
        assert [key(e) for e in left] == [key(e) for e in right]
    metrics = lambda out: [{k: v for k, v in json.loads(x).items() if k.startswith(("env/", "mix/", "eval/", "loss/"))}  # noqa: E731
                           for x in (out / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
    strip = lambda rs: [{k: v for k, v in r.items() if not k.endswith("env_s")} for r in rs]  # noqa: E731  (seconds)
    assert strip(metrics(a)) == strip(metrics(b))


@pytest.mark.slow
@pytest.mark.docker
def test_the_shipped_mixture_config_runs_ci_sized(tiny_model_dir, tmp_path):
    """configs/mixture.yaml as shipped (search, SQL and sandboxed code), made CI-sized."""
    from test_train_cli import agentrl_train

    out = tmp_path / "run"
    short = ["train.steps=1", "train.sft_warmup_steps=1", "train.sft_demos=3", "train.sft_batch_size=1",
             "train.micro_batch_size=1", "train.minibatch_size=2", "train.resume=false", "train.trainable_layers=1",
             "rollout.tasks_per_step=3", "rollout.group_size=2", "rollout.concurrency=6", "rollout.max_new_tokens=16",
             "algo.dynamic_sampling=false", "train.bf16_autocast=false", "train.num_threads=1",
             *(f"env.{i}.eval_episodes=1" for i in range(3))]  # fmt: skip
    proc = agentrl_train(str(MIXTURE), f"model.name={tiny_model_dir}", *short, f"train.out_dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warm-up demonstrations:  episode 3/3  success=1" in proc.stdout  # one oracle demonstration per env
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["per_env"]) == {"search", "sql", "code"}
    record = next(json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"perf/step_s"' in x)
    assert record["env/code/episodes"] == 2.0 and record["env/code/failed"] == 0.0
