"""hf vs vllm as the rollout backend of the quickstart: tokens/s, RL step time, peak RSS, mismatch.

Runs ``agentrl train configs/quickstart.yaml`` twice with the same seed and tasks, once per
``rollout.backend``, both with the same interpreter (the vLLM venv when it has vLLM, so both use
the same torch and transformers) and in float32 (vLLM's CPU build and the learner alike). The
warm-up is skipped and dynamic sampling is off, so every step trains; the behaviour log-probs are
recomputed (``algo.old_logprobs=recompute``), so both runs log the sampler-learner mismatch (for
hf it is the batching noise of one model, for vllm another engine's kernels). From each run's
metrics.jsonl and summary.json:

- rollout tokens/s: generated tokens / rollout wall time, over the RL steps;
- RL step wall time (mean over steps; rollout + scoring + learner + weight sync);
- peak RSS of the trainer process during rollouts and over the run (vLLM's CPU engine runs in it);
- the run's wall time including model load / engine start and the two held-out evals;
- mismatch/abs_mean, abs_max, over_cap (mean over steps).

    .cache/vllm-venv/bin/python benchmarks/bench_vllm.py                 # quickstart trees: 4 tasks x 16, 2 steps
    .cache/vllm-venv/bin/python benchmarks/bench_vllm.py --tasks 2 --branches 7 --steps 2 --json out.json
    python benchmarks/bench_vllm.py --quick                              # CI: hf only where vLLM is missing

The machine's load (``uptime``) is printed before and after: on a shared machine, compare the two
backends of one run, not runs of different times.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import Row, parser, print_table, write_json  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VLLM_VENV = REPO / ".cache" / "vllm-venv" / "bin" / "python"


def has_vllm(python: str) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec("vllm") is not None
    return subprocess.run([python, "-c", "import vllm"], capture_output=True).returncode == 0


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def run(python: str, backend: str, args, out: Path) -> dict:
    """One ``agentrl train`` run; returns its per-step metrics, summary and wall time."""
    overrides = [
        f"rollout.backend={backend}", f"train.steps={args.steps}", "train.sft_warmup_steps=0",
        f"train.eval_episodes={args.eval_episodes}", "train.resume=false", "train.bf16_autocast=false",
        "algo.dynamic_sampling=false", "algo.old_logprobs=recompute", f"rollout.tasks_per_step={args.tasks}",
        f"rollout.group_size={args.group}", f"rollout.branches={args.branches}",
        f"train.num_threads={args.threads}", f"train.out_dir={out}",
        # the hf generator's prefix cache is its own setting; vLLM keeps its own prefix cache
        *(["rollout.prefix_cache_tokens=null"] if backend != "hf" else []),
        *args.override,
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
           "OMP_NUM_THREADS": str(args.threads)}  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(
        [python, "-m", "agentrl.cli", "train", str(REPO / "configs" / "quickstart.yaml"), *overrides],
        capture_output=True, text=True, cwd=REPO, env=env,
    )  # fmt: skip
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{backend} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in records if r.get("step", 0) > 0 and "perf/step_s" in r]
    return {"steps": steps, "summary": json.loads((out / "summary.json").read_text()), "wall": wall}


def figures(result: dict) -> dict[str, float]:
    steps = result["steps"]

    def mean(key: str) -> float:
        values = [s[key] for s in steps if key in s]
        return statistics.fmean(values) if values else float("nan")

    tokens = sum(s.get("rollout/generated_tokens", 0.0) for s in steps)
    rollout_s = sum(s["perf/rollout_s"] for s in steps)
    peaks = result["summary"].get("peak_rss_gib", {})
    return {
        "tokens_per_s": tokens / rollout_s,
        "tokens": tokens,
        "step_s": mean("perf/step_s"),
        "rollout_s": mean("perf/rollout_s"),
        "learner_s": mean("perf/learner_s"),
        "rss_rollout": peaks.get("rollout", float("nan")),
        "rss_run": max(peaks.values()) if peaks else float("nan"),
        "wall": result["wall"],
        "abs_mean": mean("mismatch/abs_mean"),
        "abs_max": max(
            (s["mismatch/abs_max"] for s in steps if "mismatch/abs_max" in s), default=float("nan")
        ),
        "over_cap": mean("mismatch/over_cap"),
    }


ROWS = (  # key, row name, unit
    ("tokens_per_s", "rollout tokens/s", "tok/s"),
    ("step_s", "RL step wall (mean)", "s"),
    ("rollout_s", "  of which rollout (mean)", "s"),
    ("learner_s", "  of which learner (mean)", "s"),
    ("rss_rollout", "peak RSS during rollouts", "GiB"),
    ("rss_run", "peak RSS over the run", "GiB"),
    ("wall", "run wall (load/start, evals, steps)", "s"),
    ("abs_mean", "mismatch mean |dlogp| (learner - sampler)", "nats"),
    ("abs_max", "mismatch max |dlogp| (over steps)", "nats"),
    ("over_cap", "mismatch share of tokens past ratio 2", "share"),
)


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=None, help="RL steps per backend (default 2; --quick 1)")
    p.add_argument(
        "--tasks", type=int, default=None, help="tasks per step (default 4, the quickstart's; --quick 1)"
    )
    p.add_argument(
        "--group",
        type=int,
        default=None,
        help="root episodes per task (default 1, the quickstart's; --quick 2)",
    )
    p.add_argument(
        "--branches", type=int, default=None,
        help="branches forked before each root's answer (default 15, the quickstart's trees of 16; --quick 0)",
    )  # fmt: skip
    p.add_argument(
        "--eval-episodes", type=int, default=None, help="held-out tasks per eval (default 4; --quick 1)"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--python", default=None, help="interpreter for both runs (default: the vLLM venv if it has vLLM)"
    )
    p.add_argument(
        "--override", action="append", default=[], help="extra dotted override for both runs (repeat)"
    )
    args = p.parse_args()
    quick = args.quick
    args.steps = args.steps or (1 if quick else 2)
    args.tasks = args.tasks or (1 if quick else 4)
    args.group = args.group or (2 if quick else 1)
    args.branches = args.branches if args.branches is not None else (0 if quick else 15)
    args.eval_episodes = args.eval_episodes or (1 if quick else 4)
    if quick:
        args.override = [
            "rollout.max_new_tokens=16",
            "env.max_turns=2",
            "train.trainable_layers=2",
            *args.override,
        ]
    python = args.python or (str(VLLM_VENV) if not quick and VLLM_VENV.exists() else sys.executable)
    vllm_here = has_vllm(python)
    load_before = uptime()
    print(f"load before: {load_before}\ninterpreter: {python}; vLLM {'found' if vllm_here else 'missing'}")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        for backend in ("hf", "vllm") if vllm_here else ("hf",):
            results[backend] = figures(run(python, backend, args, Path(tmp) / backend))
            print(
                f"{backend}: {json.dumps({k: round(v, 4) for k, v in results[backend].items()})}", flush=True
            )
    load_after = uptime()
    print(f"load after: {load_after}")
    trees = f" x (1 + {args.branches} branches)" if args.branches else ""
    size = f"{args.tasks} tasks x {args.group}{trees}, {args.steps} steps"
    rows = []
    for key, name, unit in ROWS:
        hf = results["hf"][key]
        rows.append(Row(f"{name}: hf", hf, unit, note=size))
        if vllm_here:
            rows.append(Row(f"{name}: vllm", results["vllm"][key], unit, baseline="hf", baseline_value=hf,
                            note=size))  # fmt: skip
        else:
            rows.append(Row(f"{name}: vllm", None, unit, note="needs vLLM: run with .cache/vllm-venv/bin/python (.ci/vllm.sh --install-only)"))  # fmt: skip
    print_table(rows, f"rollout backend hf vs vllm on the quickstart's rollouts ({size}); load {load_before.split('load average:')[-1].strip()} -> {load_after.split('load average:')[-1].strip()}")  # fmt: skip
    write_json(args.json_path, "vllm", rows, quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
