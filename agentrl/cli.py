"""The ``agentrl`` command: train, study, eval, play, envs, sandbox, serve, bench.

Each command is a thin shell over a library function, imported only when the command runs, so
``agentrl envs`` does not pay for torch. The program entry points are here too: :func:`main` (the
console script), and :func:`train_main` / :func:`study_main`, which turn a run into an exit code
(2 for a bad config, 1 for a failed run) and are what ``agentrl train`` and ``agentrl study`` call.

Long because it is the whole command line in one place: every command with its options and their
help (what ``agentrl --help`` and docs/reference/cli.md show) and the entry points.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from agentrl.errors import AgentRLError, ConfigError

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Train and evaluate tool-using LLM agents with RL."
)
sandbox_app = typer.Typer(no_args_is_help=True, help="Build sandbox images and run code in a sandbox.")
app.add_typer(sandbox_app, name="sandbox")


def _step_info(info: dict[str, Any]) -> Any:
    """A step's info for the transcript: its flat gymnasium keys (the typed outcome says the same)."""
    from agentrl.outcome import OUTCOME

    return _jsonable({k: v for k, v in info.items() if k != OUTCOME})


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        if isinstance(value, dict):
            return {str(k): _jsonable(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [_jsonable(v) for v in value]
        return repr(value)


@app.command()
def envs(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List registered environment ids with one-line descriptions."""
    from agentrl.env import ENV_DESCRIPTIONS, registered_ids

    ids = registered_ids()
    if as_json:
        typer.echo(json.dumps([{"id": i, "description": ENV_DESCRIPTIONS[i]} for i in ids], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("id", "description")
    for env_id in ids:
        table.add_row(env_id, ENV_DESCRIPTIONS[env_id])
    Console().print(table)


@app.command()
def play(
    env_id: str = typer.Argument(..., help="Env id, e.g. agentrl/Search-v0."),
    seed: int | None = typer.Option(None, help="Seed for reset()."),
    task_id: str | None = typer.Option(None, "--task-id", help="Play this task."),
    split: str | None = typer.Option(None, help="Task split (train/dev/test)."),
    script: Path | None = typer.Option(
        None, help="Replay actions from a file (one per line; \\n escapes allowed)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the transcript as JSON."),
    folding: str = typer.Option(
        "none",
        help="With --script: replay through the agent with this context folding (branch: FoldGRPO "
        "branch/return, with per-token process rewards in the transcript).",
    ),
    rollout_set: list[str] = typer.Option(
        [], "--set", help="With --folding: rollout settings, e.g. --set unfolded_threshold=0.2 (repeatable)."
    ),
    model: str = typer.Option("smollm2-135m", help="With --folding: the tokenizer (chat template) to use."),
) -> None:
    """Play an environment in the terminal, or replay scripted actions and print the transcript."""
    import agentrl

    if folding != "none":
        _play_folded(env_id, script, task_id, split, seed, folding, rollout_set, model, as_json)
        return
    from agentrl.rollout.agent import EndEpisode, play_text

    env = agentrl.make(env_id)
    options: dict[str, Any] = {}
    if task_id is not None:
        options["task_id"] = task_id
    if split is not None:
        options["split"] = split
    console = _Console(env, _read_actions(script) if script is not None else None, as_json)
    try:
        play_text(env, console, env_id=env_id, seed=seed, options=options, observer=console)
    except EndEpisode:
        pass  # the script ran out, or end of input
    env.close()
    if as_json:
        typer.echo(json.dumps(console.transcript, indent=2, ensure_ascii=False))


class _Console:
    """``agentrl play``: the agent (typed or replayed actions) and the transcript (printed, or JSON)."""

    def __init__(self, env: Any, actions: list[str] | None, as_json: bool):
        self.env, self.actions, self.as_json = env, actions, as_json
        self.transcript: list[dict[str, Any]] = []

    def reset(self, obs: Any, info: dict[str, Any] | None = None) -> None:
        if info is None:  # the agent's reset(task); the observer's reset comes first
            return
        self.transcript.append({"observation": obs, "info": _step_info(info)})
        if not self.as_json:
            unwrapped = self.env.unwrapped
            typer.echo(f"[system] {unwrapped.system_prompt}")
            if unwrapped.tools:
                typer.echo("[tools] " + ", ".join(t["function"]["name"] for t in unwrapped.tools))
            typer.echo(f"[task] {obs}")

    def act(self, observation: str) -> str:
        from agentrl.rollout.agent import EndEpisode

        if self.actions is None:
            try:
                return input("> ")
            except EOFError:
                raise EndEpisode from None
        step = len(self.transcript) - 1
        if step >= len(self.actions):
            raise EndEpisode
        if not self.as_json:
            typer.echo(f"[action] {self.actions[step]}")
        return self.actions[step]

    def step(self, action: str, result: tuple[Any, ...]) -> None:
        obs, reward, terminated, truncated, info = result
        self.transcript.append({"action": action, "observation": obs, "reward": reward, "terminated": terminated,
                                "truncated": truncated, "info": _step_info(info)})  # fmt: skip
        if self.as_json:
            return
        typer.echo(f"[observation] {obs}" if obs else "")
        typer.echo(f"[reward={reward} terminated={terminated} truncated={truncated}]")
        if terminated or truncated:
            typer.echo(f"[answer] {info.get('answer')!r}  [gold] {info.get('ground_truth')!r}")
            typer.echo(f"[metrics] {json.dumps(info.get('metrics', {}))}")


def _read_actions(script: Path) -> list[str]:
    """One action per non-blank line; ``\\n`` escapes become newlines."""
    lines = script.read_text().splitlines()
    return [line.rstrip("\n").replace("\\n", "\n") for line in lines if line.strip()]


def _play_folded(env_id: str, script: Path | None, task_id: str | None, split: str | None, seed: int | None,
                 folding: str, rollout_set: list[str], model: str, as_json: bool) -> None:  # fmt: skip
    """``agentrl play --folding ...``: scripted actions through the agent; turns with process rewards."""
    import agentrl
    from agentrl.config import RunConfig, load_config
    from agentrl.rollout.model import load_tokenizer
    from agentrl.rollout.replay import replay_through_agent, turn_records

    if script is None or task_id is None:
        raise typer.BadParameter("--folding replays a --script on one --task-id; give both")
    overrides = [f"rollout.folding={folding}", *(f"rollout.{item}" for item in rollout_set)]
    try:
        rollout = load_config(None, overrides, cls=RunConfig).rollout
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from exc
    actions = _read_actions(script)
    probe = agentrl.make(env_id)
    task = probe.unwrapped.get_task(task_id, split)
    probe.close()
    episode = replay_through_agent(env_id, actions, task, rollout, load_tokenizer(model), seed=seed)
    record = {
        "episode_id": episode.episode_id,
        "task_id": episode.task_id,
        "outcome": episode.outcome,
        "terminated": episode.terminated,
        "truncated": episode.truncated,
        "answer": episode.answer,
        "error": episode.error,
        "metrics": episode.metrics,
        "turns": turn_records(episode),
    }
    if as_json:
        typer.echo(json.dumps(_jsonable(record), indent=2, ensure_ascii=False))
        return
    for row in record["turns"]:
        q = row["process_reward"] or []
        hit = sum(v < 0 for v in q)
        typer.echo(f"[turn {row['turn']} {row['thread']} {row['kind']}] {row['action']}")
        if row["observation"]:
            typer.echo(f"[observation] {row['observation']}")
        parts = f"{row['reward_parts'] or ''} {row['error'] or ''}"
        typer.echo(f"[process] {hit}/{len(q)} tokens penalised {parts}")
    typer.echo(f"[outcome] {episode.outcome}  [answer] {episode.answer!r}  [error] {episode.error}")
    typer.echo(f"[metrics] {json.dumps(episode.metrics)}")


@sandbox_app.command("build")
def sandbox_build(force: bool = typer.Option(False, help="Rebuild even if the cached image exists.")) -> None:
    """Build the sandbox base image offline (debootstrap + docker import), cached by recipe hash."""
    from agentrl.sandboxes import build_image

    typer.echo(build_image(force=force))


@sandbox_app.command("doctor")
def sandbox_doctor(
    backends: str = typer.Option("docker,bwrap", help="Comma-separated backends to check."),
    as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON."),
) -> None:
    """Measure which limits each sandbox backend enforces on this host (exit 1 if one does not)."""
    from agentrl.sandboxes.doctor import main

    raise typer.Exit(main(backends.split(","), as_json=as_json))


@sandbox_app.command("run")
def sandbox_run(
    file: Path = typer.Argument(
        ...,
        help="A file to run: .py (python3), .sh (sh), .sql (sqlite3 :memory:) or an executable.",
        exists=True,
        dir_okay=False,
        readable=True,
    ),
    backend: str = typer.Option("auto", help="auto, or a registered backend (docker, bwrap)."),
    timeout: float = typer.Option(10.0, min=0.1, help="Seconds before the run is killed."),
    as_json: bool = typer.Option(False, "--json", help="Print the ExecResult as JSON."),
) -> None:
    """Run a file in a fresh sandbox: its output, and its exit code as this command's (137: killed)."""
    from agentrl.sandboxes.__main__ import main

    argv = ["run", str(file), "--backend", backend, "--timeout", str(timeout)]
    raise typer.Exit(main([*argv, "--json"] if as_json else argv))


@sandbox_app.command("clean")
def sandbox_clean() -> None:
    """Remove every agentrl sandbox container on the Docker engine, those of runs still going included."""
    from agentrl.sandboxes.__main__ import main

    raise typer.Exit(main(["clean"]))


@app.command()
def serve(
    model: str = typer.Option("smollm2-135m", help="Built-in name, HF id or local path."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8000, help="Port."),
    adapter: str | None = typer.Option(None, help="LoRA adapter / checkpoint to load."),
    dtype: str = typer.Option(
        "float32",
        help="float32 | bfloat16 | float16 | auto (hf: bfloat16 where a ~1 s probe measures bf16 faster on this "
        "machine, as train.bf16_autocast: auto, else float32; said at start) (vllm: float32 and auto mean bfloat16).",
    ),
    engine: str = typer.Option("hf", help="hf (embedded server, CPU) | vllm (vLLM's own server, GPU)."),
    served_model_name: str | None = typer.Option(
        None, help="Name clients ask for (default: the adapter's folder name, else --model)."
    ),
    max_tokens: int | None = typer.Option(
        None, help="max_tokens when a request gives none (hf engine; 256)."
    ),
    vllm_arg: list[str] = typer.Option([], "--vllm-arg", help="Extra argument for vLLM's server (repeat)."),
    batching: str = typer.Option(
        "continuous", help="hf engine: continuous (requests join the running batch) | static."
    ),
    threads: int | None = typer.Option(None, help="hf engine: torch CPU threads (default: the CPUs usable)."),
) -> None:
    """Serve a model behind an OpenAI-compatible HTTP API (chat, completions, streaming, tools)."""
    from agentrl.serve.server import serve as run_server

    run_server(
        model=model,
        host=host,
        port=port,
        adapter=adapter,
        dtype=dtype,
        engine=engine,
        served_model_name=served_model_name,
        max_tokens=max_tokens,
        vllm_args=list(vllm_arg),
        batching=batching,
        threads=threads,
    )


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train(
    ctx: typer.Context,
    config: Path = typer.Argument(..., help="YAML config, e.g. configs/quickstart.yaml."),
    help_config: bool = typer.Option(False, "--help-config", help="List every config field and exit."),
) -> None:
    """Train: `agentrl train CONFIG [section.field=value ...]`."""
    if help_config:
        from agentrl.config import help_text

        for name, default, text in help_text():
            typer.echo(f"{name} = {default}\n    {text}")
        return
    raise typer.Exit(train_main(config, list(ctx.args)))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def study(
    ctx: typer.Context,
    config: Path = typer.Argument(..., help="Study YAML, e.g. configs/studies/igpo_vs_grpo.yaml."),
    max_runs: int | None = typer.Option(
        None, "--max-runs", help="Stop after this many method runs this sitting (re-run to continue)."
    ),
    parallel: int = typer.Option(
        1, "--parallel", help="Runs at once (arms wait for their seed's warm-up); e.g. several on one GPU."
    ),
    reevaluate: list[str] = typer.Option(
        [],
        "--reevaluate",
        help="KEY=VALUE (repeatable): evaluate the finished runs' models again with this "
        "held-out eval setting (e.g. train.eval_temperature=0.6), no training; report in out_dir/reevaluated/.",
    ),
) -> None:
    """Objectives side by side: `agentrl study CONFIG [key=value ...]` (e.g. seeds=[0] eval_tasks=64).

    Per seed one warm-up, then every method from it on the same tasks and sample budget; finished
    runs are skipped on a re-run. Writes results.json, report.md and plots to the study's out_dir."""
    raise typer.Exit(
        study_main(str(config), list(ctx.args), max_runs=max_runs, parallel=parallel, reevaluate=reevaluate)
    )


@app.command("eval")
def evaluate(
    suite: str = typer.Option(
        ...,
        help="Suite name, optionally NAME:key=value,...: local-gaia, gaia, gaia-fixture, webshop, search-qa, "
        "search-qa-real, sql, math, ...",
    ),
    agent: str = typer.Option(
        "oracle",
        help="oracle | random | model name/path[+ADAPTER] | openai:URL[#model] (token-id completions) | "
        "chat:URL#model (any chat-completions server, native tool calls).",
    ),
    suite_option: list[str] = typer.Option(
        [], "--suite-option", help="key=value added to the suite (repeatable; the value may hold commas)."
    ),
    limit: int | None = typer.Option(
        None, help="At most this many tasks per part (a seeded sample spread over subsets)."
    ),
    concurrency: int = typer.Option(4, help="Episodes at once (and requests in flight for remote agents)."),
    seed: int = typer.Option(0, help="Seed."),
    out: Path | None = typer.Option(None, help="Directory for records, metrics and the report."),
    as_json: bool = typer.Option(False, "--json", help="Print metrics as JSON."),
    episode_timeout_s: float | None = typer.Option(
        None,
        "--episode-timeout-s",
        help="Wall-clock limit of one model episode [AGENTRL_EVAL_EPISODE_TIMEOUT_S, 900].",
    ),
    request_timeout_s: float | None = typer.Option(
        None,
        "--request-timeout-s",
        help="Limit of one HTTP request to a remote model; a hung request costs this once (not retried, "
        "not replayed) [AGENTRL_EVAL_REQUEST_TIMEOUT_S, 90].",
    ),
    max_retries: int | None = typer.Option(
        None,
        "--max-retries",
        help="Retries of one failed request (backoff, per request) [AGENTRL_EVAL_MAX_RETRIES, 2].",
    ),
    max_new_tokens: int | None = typer.Option(
        None,
        "--max-new-tokens",
        help="Tokens per turn [AGENTRL_EVAL_MAX_NEW_TOKENS, 192; chat: the server's limit].",
    ),
    max_context_tokens: int | None = typer.Option(
        None,
        "--max-context-tokens",
        help="Token budget of a model episode's context; reaching it ends the episode as truncated "
        "[AGENTRL_EVAL_MAX_CONTEXT, 4096; chat: the server's max_model_len or its answer].",
    ),
    api_key_env: str | None = typer.Option(
        None, "--api-key-env", help="Environment variable holding the chat server's API key [OPENAI_API_KEY]."
    ),
    images: bool | None = typer.Option(
        None,
        "--images/--no-images",
        help="chat agents: send image attachments to the model as image content parts (multimodal models) "
        "[AGENTRL_EVAL_IMAGES, off].",
    ),
    tool_protocol: str | None = typer.Option(
        None,
        "--tool-protocol",
        help="chat agents: native (tools + tool_calls) or text (<tool_call> in the text).",
    ),
    chat_param: list[str] = typer.Option(
        [],
        "--chat-param",
        help="chat agents: KEY=VALUE request field (repeatable; JSON value; KEY=none leaves it out; "
        "extra_body={...} merges an object), e.g. temperature=0, reasoning_effort=low, "
        "max_completion_tokens=2048 [AGENTRL_EVAL_CHAT_PARAMS, 'a=1;b=2'].",
    ),
    ray: str | None = typer.Option(
        None, help="Run the envs in Ray actors: auto, HOST:PORT, or local (a Ray on this machine)."
    ),
    max_failed: float = typer.Option(
        0.05,
        "--max-failed",
        help="Share of episodes that may crash (scored as unsolved) before the command exits 1; the "
        "outputs are written either way.",
    ),
    replays: int = typer.Option(
        2,
        "--replays",
        help="Rounds of re-running crashed episodes (same task and seed; not when every episode crashed); "
        "earlier errors are kept in each record's replayed_errors.",
    ),
) -> None:
    """Evaluate an agent on a suite and write a report."""
    from agentrl.eval.runner import run_eval

    raise typer.Exit(
        run_eval(
            suite=suite,
            agent=agent,
            limit=limit,
            concurrency=concurrency,
            seed=seed,
            out=out,
            as_json=as_json,
            suite_options=suite_option,
            settings={
                "episode_timeout_s": episode_timeout_s,
                "request_timeout_s": request_timeout_s,
                "max_retries": max_retries,
                "max_new_tokens": max_new_tokens,
                "max_context_tokens": max_context_tokens,
                "api_key_env": api_key_env,
                "tool_protocol": tool_protocol,
                "images": images,
                "chat_params": tuple(chat_param) or None,
            },
            ray=ray,
            max_failed=max_failed,
            replays=replays,
        )
    )


@app.command()
def bench(quick: bool = typer.Option(False, help="Small sizes (what CI runs).")) -> None:
    """Run every benchmark in benchmarks/ and print one table (writes benchmarks/results/latest.json)."""
    import subprocess

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "run_all.py"
    if not script.exists():
        raise AgentRLError(f"{script} not found: run from a source checkout of agentrl")
    raise typer.Exit(subprocess.call([sys.executable, str(script), *(["--quick"] if quick else [])]))


# --------------------------------------------------------------------------- entry points
def train_main(config_path: str | Path | None, overrides: list[str] | None = None) -> int:
    """``agentrl train CONFIG [overrides]``: 0 on success, 2 on a bad config, 1 on a run error."""
    from rich.console import Console

    from agentrl.config import load_config
    from agentrl.train.engines import world
    from agentrl.train.trainer import train

    console = Console(stderr=True)
    rank, world_size = world()
    try:
        config = load_config(config_path, list(overrides or []))
    except ConfigError as exc:
        if rank == 0:  # every rank read the same config: one message, not one per process
            console.print(f"[red]config error:[/red] {exc}")
        return 2
    try:
        summary = train(config)
    except AgentRLError as exc:  # a rank's own failure: said by that rank, named when there are several
        console.print(f"[red]training failed{f' on rank {rank}' if world_size > 1 else ''}:[/red] {exc}")
        log = Path(config.train.out_dir) / "train.log"
        if rank == 0 and log.exists():  # the run's log says how it ended, as the terminal did
            with log.open("a") as handle:
                handle.write(f"training failed: {exc}\n")
        return 1
    if rank == 0:
        for name, part in summary.get("per_env", {}).items():
            print(f"held-out success on {name} before RL: {part['success_before']:.3f}  after RL: "
                  f"{part['success_after']:.3f}  ({part['gained']} tasks gained, {part['lost']} lost, "
                  f"sign-test p={part['p_value']:.3g})")  # fmt: skip
        print(
            f"held-out success before RL: {summary['success_before']:.3f}  after RL: {summary['success_after']:.3f}"
            f"  ({summary['gained']} tasks gained, {summary['lost']} lost, sign-test p={summary['p_value']:.3g})"
        )
    return 0


def study_main(config_path: str, overrides: list[str] | None = None, *, max_runs: int | None = None,
               parallel: int = 1, reevaluate: list[str] | None = None) -> int:  # fmt: skip
    """``agentrl study CONFIG [key=value ...]``: 0 done (or stopped by ``max_runs``), 2 bad config, 1 failed run.
    With ``reevaluate``: the finished runs' models evaluated again (:mod:`agentrl.study.reevaluate`)."""
    from rich.console import Console

    from agentrl.study.orchestrator import load_study, run_study
    from agentrl.study.reevaluate import run_reevaluation

    console = Console(stderr=True)
    try:
        study = load_study(config_path, list(overrides or []))
    except ConfigError as exc:
        console.print(f"[red]study config error:[/red] {exc}")
        return 2
    try:
        if reevaluate:
            results = run_reevaluation(study, reevaluate, max_runs=max_runs, parallel=parallel)
            out_dir = Path(results["out_dir"])
        else:
            results, out_dir = run_study(study, max_runs=max_runs, parallel=parallel), study.out_dir
    except ConfigError as exc:  # finished runs the study now sets otherwise (check_finished), before any run
        console.print(f"[red]study config error:[/red] {exc}")
        return 2
    except AgentRLError as exc:
        console.print(f"[red]study failed:[/red] {exc}")
        return 1
    print((out_dir / "report.md").read_text() if results["complete"] else "study not complete yet")
    return 0


def main() -> None:
    """The ``agentrl`` command (pyproject's console script; ``python -m agentrl.cli``)."""
    try:
        app()
    except AgentRLError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
