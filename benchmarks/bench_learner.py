"""Learner benchmarks: log-prob + entropy memory/time, quickstart training tokens/s and step split.

    python benchmarks/bench_learner.py [--quick] [--json PATH] [--skip-train]

1. Log-prob + entropy of the taken token from ``[T, H]`` hidden states and a ``[V, H]`` LM head,
   forward + backward, for V = 49,152 (SmolLM2, H = 576) and V = 151,936 (Qwen2.5, H = 896, the
   0.5B model's hidden size), T = 4,096 (``--quick``: T = 1,024): naive (full logits) vs chunked
   (CPU and GPU) vs the fused Triton kernel (GPU only; reported as "needs CUDA" elsewhere). Each
   case runs in a fresh subprocess; peak memory is the process's peak RSS growth on CPU and
   ``torch.cuda.max_memory_allocated`` growth on GPU.
2. ``train.bf16_autocast``: policy forward + backward (top 6 blocks trained) of SmolLM2-135M on
   ``[4, 600]`` tokens (a quickstart micro-batch), float32 vs bfloat16 autocast, tokens/s. The
   bf16 row is measured only where the trainer's own probe (``agentrl.train.precision``) finds
   fast bf16 kernels; on a CPU without them (AVX2 only: ~10x slower) it reads "skipped: no bf16
   on this CPU" with the probe's timings.
3. A short quickstart run (SmolLM2-135M, search env, no warm-up; ``bf16_autocast: auto``, so the
   probe picks the precision; the quickstart's trees of 16 episodes, 4 trees a step for 2 steps,
   ``--quick`` 2 trees for 1 step, where the quickstart runs 16): training tokens/s of the PPO update
   and the wall-time split of a step (generation+env / scoring / learner), from the run's metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CASES = ((49_152, 576), (151_936, 896))


def _one_case(impl: str, vocab: int, hidden: int, tokens: int, device: str) -> dict[str, float]:
    """Runs inside a subprocess: time and peak memory of forward + backward."""
    import resource

    import torch

    from agentrl.kernels import token_logprobs_entropy

    torch.manual_seed(0)
    h = torch.randn(tokens, hidden, device=device).requires_grad_()
    w = (torch.randn(vocab, hidden, device=device) / hidden**0.5).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), device=device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    times = []
    for _ in range(2 if device == "cuda" else 1):  # GPU: first run compiles/warms up
        t0 = time.perf_counter()
        logp, ent = token_logprobs_entropy(h, w, targets, impl=impl)
        (logp.sum() + 0.1 * ent.sum()).backward()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        h.grad = w.grad = None
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {"seconds": times[-1], "peak_mib": peak / 2**20}


def kernel_table(tokens: int, device: str, max_naive_gib: float) -> list[dict[str, object]]:
    rows = []
    for vocab, hidden in CASES:
        for impl in ("naive", "chunked", "triton"):
            row: dict[str, object] = {"V": vocab, "H": hidden, "T": tokens, "impl": impl, "device": device}
            if impl == "triton" and device != "cuda":
                row.update(seconds=None, peak_mib=None, note="needs CUDA (GPU only)")
                rows.append(row)
                continue
            # naive keeps about six [T, V] fp32 tensors alive (logits, log-softmax, probs, grads)
            estimate = 6 * tokens * vocab * 4 / 2**30
            if impl == "naive" and estimate > max_naive_gib:
                row.update(
                    seconds=None, peak_mib=None, note=f"skipped: ~{estimate:.0f} GiB > --max-naive-gib"
                )
                rows.append(row)
                continue
            code = (
                "import json, sys; sys.path.insert(0, 'benchmarks'); from bench_learner import _one_case; "
                f"print(json.dumps(_one_case({impl!r}, {vocab}, {hidden}, {tokens}, {device!r})))"
            )
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                row.update(
                    seconds=None, peak_mib=None, note=f"failed: {proc.stderr.strip().splitlines()[-1:]}"
                )
            else:
                row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
            rows.append(row)
    return rows


def train_table(quick: bool) -> dict[str, float]:
    """A short quickstart run without warm-up; returns mean per-step perf metrics. Its output
    folder is removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:  # a run leaves ~1.3 GB (model + checkpoint)
        return _train_once(Path(tmp), quick)


def _train_once(out: Path, quick: bool) -> dict[str, float]:
    from agentrl.cli import train_main as main

    # the quickstart's own step shape (trees of 1 root + 15 branches, its learner settings), fewer trees:
    # --quick 2 trees (32 episodes) for 1 step, else 4 trees (64 episodes) for 2 steps
    steps, trees = (1, 2) if quick else (2, 4)
    overrides = [
        f"train.steps={steps}", "train.sft_warmup_steps=0", "train.eval_episodes=0", "train.resume=false",
        f"train.out_dir={out}", f"rollout.tasks_per_step={trees}",
        "algo.dynamic_sampling=false",  # no warm-up, so every group is all-zero: train on them anyway
    ]  # fmt: skip
    t0 = time.perf_counter()
    code = main("configs/quickstart.yaml", overrides)
    wall = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"quickstart run failed with exit code {code}")
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps_rec = [r for r in records if "perf/step_s" in r]
    keys = ("perf/step_s", "perf/rollout_s", "perf/scoring_s", "perf/learner_s", "perf/train_tokens_per_s",
            "perf/seq_tokens_per_s", "perf/generate_s_sum", "perf/env_s_sum", "rollout/generated_tokens",
            "rollout/episodes")  # fmt: skip
    mean = {k: sum(r.get(k, 0.0) for r in steps_rec) / max(len(steps_rec), 1) for k in keys}
    mean["wall_s"] = wall
    mean["steps"] = float(len(steps_rec))
    # the tree size and the quickstart's own trees a step, from its config (not written twice here)
    from agentrl.config import load_config

    rollout = load_config("configs/quickstart.yaml").rollout
    mean["trees"] = float(trees)
    mean["tree_size"] = float(rollout.group_size * (1 + rollout.branches))
    mean["quickstart_trees"] = float(rollout.tasks_per_step)
    mean["bf16_autocast"] = float(
        json.loads((out / "summary.json").read_text())["precision"]["bf16_autocast"]
    )
    return mean


def autocast_table(repeats: int = 2) -> tuple[list[dict[str, float]], str | None]:
    """Policy forward + backward tokens/s of SmolLM2-135M, float32 vs bf16 autocast (best of
    ``repeats``); the bf16 row only where the probe finds fast bf16 kernels. Returns the rows and
    the reason bf16 was skipped (None when it was measured)."""
    import torch

    from agentrl.rollout.model import load_model
    from agentrl.train.learner import Policy, freeze_below
    from agentrl.train.precision import probe_bf16

    model, _ = load_model("smollm2-135m", dtype="float32")
    probe = probe_bf16(model, rows=4)
    print(probe.line())
    skipped = None if probe.bf16_kernels else f"skipped: no bf16 on this CPU ({probe.reason}; {probe.cpu})"
    freeze_below(model, 6)
    ids = torch.randint(0, 49_000, (4, 600), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    loss_mask = torch.zeros(ids.shape)
    loss_mask[:, 400:] = 1.0
    rows = []
    for autocast in (False, True) if skipped is None else (False,):
        policy = Policy(model, autocast=autocast)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            policy(ids, mask, loss_mask).logp.sum().backward()
            best = min(best, time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
        rows.append({"autocast": float(autocast), "seconds": best, "tokens_per_s": ids.numel() / best})
    return rows, skipped


def _fmt(value: object, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="T=1024 and a 1-step training run of 2 trees")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--skip-train", action="store_true", help="only the log-prob kernels")
    parser.add_argument(
        "--max-naive-gib", type=float, default=8.0, help="skip naive cases estimated above this"
    )
    args = parser.parse_args()
    os.chdir(Path(__file__).resolve().parents[1])
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokens = 1024 if args.quick else 4096
    results: dict[str, object] = {"device": device, "threads": torch.get_num_threads()}

    kernels = kernel_table(tokens, device, args.max_naive_gib)
    results["logprob_entropy"] = kernels
    print(f"\nlog-prob + entropy, forward + backward ({device}, {torch.get_num_threads()} threads)")
    print(f"{'V':>8} {'H':>5} {'T':>6} {'impl':>8} {'seconds':>9} {'peak MiB':>10}  note")
    for row in kernels:
        print(f"{row['V']:>8} {row['H']:>5} {row['T']:>6} {row['impl']:>8} {_fmt(row['seconds']):>9} "
              f"{_fmt(row['peak_mib'], 0):>10}  {row.get('note', '')}")  # fmt: skip

    if not args.skip_train:
        autocast, skipped = autocast_table()
        results["autocast"] = autocast
        results["autocast_skipped"] = skipped
        print("\npolicy forward + backward, SmolLM2-135M [4, 600], top 6 blocks trained")
        for row in autocast:
            name = "bf16 autocast" if row["autocast"] else "float32"
            print(f"{name:<14} {row['seconds']:>7.2f} s  {row['tokens_per_s']:>8.0f} tok/s")
        if skipped:
            print(f"{'bf16 autocast':<14} {skipped}")
        perf = train_table(args.quick)
        results["quickstart_step"] = perf
        step = perf["perf/step_s"] or 1.0
        precision = "bf16 autocast" if perf["bf16_autocast"] else "float32"
        print(f"\nquickstart step (SmolLM2-135M, search env, {perf['trees']:.0f} trees of {perf['tree_size']:.0f} = "
              f"{perf['rollout/episodes']:.0f} episodes (the quickstart's steps: {perf['quickstart_trees']:.0f} trees), "
              f"learner {precision} "
              f"(bf16_autocast: auto); mean of {perf['steps']:.0f} steps)")  # fmt: skip
        print(f"{'part':<28} {'seconds':>9} {'share':>7}")
        for name, key in (("rollout (generation + env)", "perf/rollout_s"), ("scoring (old/ref/IG passes)", "perf/scoring_s"),
                          ("learner (PPO update)", "perf/learner_s")):  # fmt: skip
            print(f"{name:<28} {perf[key]:>9.2f} {perf[key] / step:>7.1%}")
        print(f"{'whole step':<28} {step:>9.2f}")
        gen, env = perf["perf/generate_s_sum"], perf["perf/env_s_sum"]
        print(f"inside rollouts (summed over concurrent episodes): generation {gen:.1f} s, env/tools {env:.2f} s "
              f"({env / max(gen + env, 1e-9):.1%} env)")  # fmt: skip
        print(
            f"training tokens/s: {perf['perf/train_tokens_per_s']:.1f} trained (loss) tokens, "
            f"{perf['perf/seq_tokens_per_s']:.1f} sequence tokens (forward + backward)"
        )
    if args.json:
        args.json.write_text(json.dumps(shared_format(results, args.quick), indent=2))


def shared_format(results: dict[str, Any], quick: bool) -> dict[str, Any]:
    """The benchmarks' shared JSON format (``rows`` of name/value/unit/baseline), details kept."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import Row, machine

    rows: list[Row] = []
    naive = {(r["V"], r["T"]): r for r in results["logprob_entropy"] if r["impl"] == "naive"}
    for r in results["logprob_entropy"]:
        base = naive.get((r["V"], r["T"])) if r["impl"] != "naive" else None
        for key, unit in (("seconds", "s"), ("peak_mib", "MiB")):
            has_base = base is not None and base.get(key) is not None and r.get(key) is not None
            rows.append(
                Row(
                    name=f"logprob+entropy fwd+bwd {key} V={r['V']} H={r['H']} T={r['T']} {r['impl']} ({r['device']})",
                    value=r.get(key),
                    unit=unit,
                    baseline=f"naive V={r['V']}" if has_base else None,
                    baseline_value=base.get(key) if has_base else None,
                    note=str(r.get("note", "")),
                )
            )
    autocast = results.get("autocast")
    if autocast:
        name = "policy fwd+bwd SmolLM2 [4,600] bf16 autocast"
        fp32 = autocast[0]
        rows.append(Row("policy fwd+bwd SmolLM2 [4,600] float32", fp32["tokens_per_s"], "tok/s"))
        if len(autocast) > 1:
            rows.append(Row(name, autocast[1]["tokens_per_s"], "tok/s", "float32", fp32["tokens_per_s"]))
        else:
            rows.append(Row(name, None, "tok/s", note=results["autocast_skipped"]))  # type: ignore[arg-type]
    perf = results.get("quickstart_step")
    if perf:
        step = perf["perf/step_s"]
        for name, key in (("rollout (generation + env)", "perf/rollout_s"), ("scoring passes", "perf/scoring_s"),
                          ("learner (PPO update)", "perf/learner_s")):  # fmt: skip
            rows.append(Row(f"quickstart step: {name}", perf[key], "s", "whole step", step))
        rows.append(
            Row("quickstart training tokens/s (loss tokens)", perf["perf/train_tokens_per_s"], "tok/s")
        )
        rows.append(
            Row("quickstart training tokens/s (sequence tokens)", perf["perf/seq_tokens_per_s"], "tok/s")
        )
    from dataclasses import asdict

    return {
        "bench": "learner",
        "machine": machine(),
        "quick": quick,
        "rows": [{**asdict(r), "ratio": r.ratio} for r in rows],
        "details": results,
    }


if __name__ == "__main__":
    main()
