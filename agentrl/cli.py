"""The ``agentrl`` command: train, eval, play, envs, sandbox, serve, bench.

Each command is a thin shell over a library function, imported only when the command runs, so
``agentrl envs`` does not pay for torch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from agentrl.errors import AgentRLError

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Train and evaluate tool-using LLM agents with RL."
)
sandbox_app = typer.Typer(no_args_is_help=True, help="Build sandbox images and run code in a sandbox.")
app.add_typer(sandbox_app, name="sandbox")


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
) -> None:
    """Play an environment in the terminal, or replay scripted actions and print the transcript."""
    import agentrl

    env = agentrl.make(env_id)
    options: dict[str, Any] = {}
    if task_id is not None:
        options["task_id"] = task_id
    if split is not None:
        options["split"] = split
    obs, info = env.reset(seed=seed, options=options)
    transcript: list[dict[str, Any]] = [{"observation": obs, "info": _jsonable(info)}]
    actions = None
    if script is not None:
        actions = [
            line.rstrip("\n").replace("\\n", "\n") for line in script.read_text().splitlines() if line.strip()
        ]
    if not as_json:
        unwrapped = env.unwrapped
        typer.echo(f"[system] {unwrapped.system_prompt}")
        if unwrapped.tools:
            typer.echo("[tools] " + ", ".join(t["function"]["name"] for t in unwrapped.tools))
        typer.echo(f"[task] {obs}")
    step = 0
    while True:
        if actions is not None:
            if step >= len(actions):
                break
            action = actions[step]
            if not as_json:
                typer.echo(f"[action] {action}")
        else:
            try:
                action = input("> ")
            except EOFError:
                break
        step += 1
        obs, reward, terminated, truncated, info = env.step(action)
        transcript.append(
            {
                "action": action,
                "observation": obs,
                "reward": reward,
                "terminated": terminated,
                "truncated": truncated,
                "info": _jsonable(info),
            }
        )
        if not as_json:
            typer.echo(f"[observation] {obs}" if obs else "")
            typer.echo(f"[reward={reward} terminated={terminated} truncated={truncated}]")
        if terminated or truncated:
            if not as_json:
                typer.echo(f"[answer] {info.get('answer')!r}  [gold] {info.get('ground_truth')!r}")
                typer.echo(f"[metrics] {json.dumps(info.get('metrics', {}))}")
            break
    env.close()
    if as_json:
        typer.echo(json.dumps(transcript, indent=2, ensure_ascii=False))


@sandbox_app.command("build")
def sandbox_build(force: bool = typer.Option(False, help="Rebuild even if the cached image exists.")) -> None:
    """Build the sandbox base image offline (debootstrap + docker import), cached by recipe hash."""
    from agentrl.sandboxes import build_image

    typer.echo(build_image(force=force))


@sandbox_app.command("run")
def sandbox_run(
    file: Path = typer.Argument(..., help="A Python file to run."),
    backend: str = typer.Option("auto", help="docker | bwrap | auto."),
    timeout: float = typer.Option(10.0, help="Seconds before the run is killed."),
    as_json: bool = typer.Option(False, "--json", help="Print the ExecResult as JSON."),
) -> None:
    """Run a file in a fresh sandbox and print the ExecResult."""
    import dataclasses

    from agentrl.sandboxes import run_file

    result = run_file(file, backend=backend, timeout=timeout)
    record = dataclasses.asdict(result)
    if as_json:
        typer.echo(json.dumps(record, indent=2))
    else:
        typer.echo(result.stdout, nl=False)
        if result.stderr:
            typer.echo(result.stderr, err=True, nl=False)
        typer.echo(
            f"[exit_code={result.exit_code} timed_out={result.timed_out} oom_killed={result.oom_killed}]"
        )
    raise typer.Exit(0 if result.exit_code == 0 else 1)


@app.command()
def serve(
    model: str = typer.Option("smollm2-135m", help="Built-in name, HF id or local path."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8000, help="Port."),
    adapter: str | None = typer.Option(None, help="LoRA adapter / checkpoint to load."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16."),
) -> None:
    """Serve a model behind an OpenAI-compatible HTTP API (completions and chat)."""
    from agentrl.rollout.server import serve as run_server

    run_server(model=model, host=host, port=port, adapter=adapter, dtype=dtype)


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
    from agentrl.train.trainer import main as train_main

    raise typer.Exit(train_main(config, list(ctx.args)))


@app.command("eval")
def evaluate(
    suite: str = typer.Option(
        ..., help="Suite name: local-gaia, webshop, search-qa, search-qa-real, sql, math, ..."
    ),
    agent: str = typer.Option("oracle", help="oracle | random | model name/path | openai:URL[#model]."),
    limit: int | None = typer.Option(None, help="At most this many tasks per part (a seeded sample spread over subsets)."),
    concurrency: int = typer.Option(4, help="Episodes at once."),
    seed: int = typer.Option(0, help="Seed."),
    out: Path | None = typer.Option(None, help="Directory for records, metrics and the report."),
    as_json: bool = typer.Option(False, "--json", help="Print metrics as JSON."),
    ray: str | None = typer.Option(
        None, help="Run the envs in Ray actors: auto, HOST:PORT, or local (a Ray on this machine)."
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
            ray=ray,
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


def main() -> None:
    try:
        app()
    except AgentRLError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
