"""A study's results from its runs' ``summary.json`` and ``metrics.jsonl``: results.json, report.md, plots.

Per method x seed: held-out success before/after RL (the same ``eval_tasks`` tasks, greedy unless
the study sets ``train.eval_temperature``: the report says which), tasks
gained/lost, the paired exact sign test against the baseline arm of the same seed on the same tasks
(:func:`agentrl.train.trainer.compare_evals`, pooled over seeds too), and the mechanism metrics the
trainer logs per RL step, aggregated over the run (:func:`mechanism_labels`). Beside success, the held-out
means of each task's details (the reward, which gives partial credit, and the env's metrics: search's
F1, WebShop's score), where the runs kept them (runs from before 2026-11-27 did not).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from agentrl.train.heldout import sign_test_p
from agentrl.train.trainer import compare_evals

# metrics.jsonl key -> what the report calls it; mean over the run's RL steps where logged. Each
# estimator's diagnostics carry their own labels (agentrl.algos.spec.Estimator.labels/table):
# see mechanism_labels().
MECHANISMS = {
    "env/reward": "train reward",
    "loss/clipfrac": "clip fraction",
    "loss/clip_bias_scale": "ST-PPO: clip-bias scale",
    "ctx/main_tokens": "main-thread tokens / episode",
    "ctx/peak_tokens": "largest context / episode",
    "fold/branches": "branches / episode",
    "fold/summaries": "summaries / episode",
    "fold/process_penalty": "process-reward penalty / episode",
    "fold/penalised_tokens": "penalised tokens / episode",
    "fold/penalised_in_success": "penalised tokens in successes / episode (FoldGRPO acts on these only)",
}
# shown in report.md's table when any arm has them (after the estimators' own table keys)
TABLE_MECHANISMS = (
    "loss/clipfrac", "ctx/main_tokens", "fold/branches", "fold/process_penalty", "fold/penalised_in_success"
)  # fmt: skip


def _estimators() -> list[Any]:
    """The built-in estimators in their declared order, then any other registered one (yours)."""
    from agentrl.algos.spec import ESTIMATORS
    from agentrl.registry import ADVANTAGES

    entries = {est.name: est for est in ESTIMATORS}
    for name in ADVANTAGES.names():
        entries.setdefault(name, ADVANTAGES.get(name))
    return list(entries.values())


def mechanism_labels() -> dict[str, str]:
    """Every mechanism metric the report aggregates -> its label: the registered estimators' own
    diagnostics (built-in or yours), then the trainer's."""
    labels = {key: label for est in _estimators() for key, label in getattr(est, "labels", {}).items()}
    return {"env/reward": MECHANISMS["env/reward"], **labels, **MECHANISMS}


def table_mechanisms() -> tuple[str, ...]:
    """The keys report.md's table shows when any arm has them: the estimators' table keys, then the trainer's."""
    keys = [key for est in _estimators() for key in getattr(est, "table", ())]
    return (*dict.fromkeys(keys), *TABLE_MECHANISMS)


def rl_records(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metrics.jsonl records of RL steps (step >= 1, training metrics only)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("step", 0) >= 1 and "env/reward" in r]


def eval_failed(run_dir: Path) -> list[float]:
    """``eval/failed`` of each held-out eval of the run, in order (failed episodes count as 0 success:
    a timeout under load reads as a wrong answer, so the report shows them)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["eval/failed"] for r in records if "eval/failed" in r]


def mechanisms(records: list[dict[str, Any]]) -> dict[str, float]:
    """Means over RL steps of :func:`mechanism_labels`' keys, plus clip-fraction max and grad-norm percentiles."""
    out: dict[str, float] = {}
    for key in mechanism_labels():
        values = [r[key] for r in records if key in r]
        if values:
            out[key] = float(np.mean(values))
    clip = [r["loss/clipfrac"] for r in records if "loss/clipfrac" in r]
    if clip:
        out["loss/clipfrac_max"] = float(np.max(clip))
    norms = [
        r["loss/grad_norm"] for r in records if "loss/grad_norm" in r
    ]  # per step: mean over optimizer steps
    if norms:
        p50, p90 = np.percentile(norms, [50, 90])
        out |= {"loss/grad_norm_p50": float(p50), "loss/grad_norm_p90": float(p90)}
    peaks = [r["loss/grad_norm_max"] for r in records if "loss/grad_norm_max" in r]
    if peaks:
        out["loss/grad_norm_max"] = float(np.max(peaks))  # largest single optimizer step of the run
    return out


def _paired(base: dict[str, float], other: dict[str, float]) -> dict[str, Any]:
    """``other`` vs ``base`` on their common tasks: gained/lost/p from the trainer's sign test."""
    c = compare_evals(base, other)
    return {"tasks": c["eval_episodes"], "gained": c["gained"], "lost": c["lost"], "p_value": c["p_value"]}


def detectable_gain(tasks: int, discordant: int, *, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """The smallest net gain in success rate, ``extra / tasks``, that the paired exact sign test finds at
    two-sided ``alpha`` with probability ``power``, if the two arms' disagreement seen here
    (``discordant`` tasks, taken as noise: half gained, half lost) stays and the better arm solves
    ``extra`` more tasks on top: then ``discordant + extra`` tasks differ, each a gain with probability
    ``(discordant / 2 + extra) / (discordant + extra)``. None where even every task would not do."""
    from math import comb

    def critical(n: int) -> int | None:  # fewest gains of n with a two-sided p below alpha
        return next((k for k in range(n // 2 + 1, n + 1) if sign_test_p(k, n - k) < alpha), None)

    for extra in range(1, tasks - discordant + 1):
        n = discordant + extra
        need, q = critical(n), (discordant / 2 + extra) / n
        if need is not None and sum(comb(n, j) * q**j * (1 - q) ** (n - j) for j in range(need, n + 1)) >= power:
            return extra / tasks
    return None


def _pooled(summaries: dict[tuple[int, str], Any], seeds: list[int], method: str, when: str) -> dict[str, float]:
    """``seed/task -> outcome`` over ``seeds`` of one method's eval ``when`` (before / after)."""
    return {f"{seed}/{t}": v for seed in seeds for t, v in summaries[(seed, method)]["eval_tasks"][when].items()}


def collect(study: Any, runs: list[Any]) -> dict[str, Any]:
    """results.json's content (see the module docstring)."""
    arms = [r for r in runs if r.method is not None]
    summaries = {(r.seed, r.method): json.loads((r.out_dir / "summary.json").read_text())
                 for r in arms if r.finished}  # fmt: skip
    per_run: list[dict[str, Any]] = []
    for run in arms:
        s = summaries.get((run.seed, run.method))
        if s is None:
            continue
        base = summaries.get((run.seed, study.baseline))
        tasks = s["eval_tasks"]
        records = rl_records(run.out_dir)
        resolved_path = run.out_dir / "resolved_config.yaml"
        resolved = yaml.safe_load(resolved_path.read_text()) if resolved_path.exists() else {}
        row = {
            "method": run.method, "seed": run.seed, "out_dir": str(run.out_dir), "steps": s["steps"],
            # what the arm sampled: episodes and generated tokens (shared tree turns once), from its step metrics
            "episodes": int(sum(r.get("rollout/episodes", 0.0) for r in records)) or study.episodes,
            "generated_tokens": int(sum(r.get("rollout/sampled_tokens", 0.0) for r in records)) or None,
            "eval_tasks": s["eval_episodes"],
            # 0: greedy; > 0: one sample a task from streams keyed by the task (the same for every arm)
            "eval_temperature": float(((resolved or {}).get("train") or {}).get("eval_temperature", 0.0)),
            "success_before": s["success_before"], "success_after": s["success_after"],
            "gained": s["gained"], "lost": s["lost"], "p_value": s["p_value"],
            "objective": s["objective"], "mechanisms": mechanisms(records),
            "eval_failed": eval_failed(run.out_dir),
            "peak_rss_gib": s.get("peak_rss_gib", {}),  # per phase, this run's process (older runs: none)
            "held_out_means": s.get("held_out_means", {"before": {}, "after": {}}),  # outcome, f1, score...
            "same_start_as_baseline": None if base is None else base["eval_tasks"]["before"] == tasks["before"],
            "own_eval_before": list(run.own_eval),  # evaluated itself: how its eval differs
            "vs_baseline": None if base is None or run.method == study.baseline
            else _paired(base["eval_tasks"]["after"], tasks["after"]),
        }  # fmt: skip
        per_run.append(row)
    methods: dict[str, Any] = {}
    for method in study.methods:
        rows = [r for r in per_run if r["method"] == method.name]
        if not rows:
            continue
        entry: dict[str, Any] = {
            "overrides": list(method.overrides),
            "seeds": [r["seed"] for r in rows],
            "success_before": [r["success_before"] for r in rows],
            "success_after": [r["success_after"] for r in rows],
            "success_after_mean": float(np.mean([r["success_after"] for r in rows])),
            "success_before_mean": float(np.mean([r["success_before"] for r in rows])),
            "mechanisms": {k: float(np.mean([r["mechanisms"][k] for r in rows if k in r["mechanisms"]]))
                           for k in sorted({k for r in rows for k in r["mechanisms"]})},
            # held-out means over seeds, for the details every seed kept (partial credit: outcome, f1, score)
            "held_out_means": {when: {k: float(np.mean([r["held_out_means"][when][k] for r in rows]))
                                      for k in set.intersection(*(set(r["held_out_means"][when]) for r in rows))}
                               for when in ("before", "after")},
        }  # fmt: skip
        # its own gain over the warm-up, pooled over seeds: a comparison counts only where the baseline's is real
        seeds = [r["seed"] for r in rows]
        own = _paired(_pooled(summaries, seeds, method.name, "before"), _pooled(summaries, seeds, method.name, "after"))
        entry["own_gain_pooled"] = {**own, "gain": (own["gained"] - own["lost"]) / own["tasks"] if own["tasks"] else 0.0}
        if method.name != study.baseline:
            both = [seed for seed in seeds if (seed, study.baseline) in summaries]  # seeds the baseline finished
            pooled_base = _pooled(summaries, both, study.baseline, "after")
            pooled = _pooled(summaries, both, method.name, "after")
            entry["vs_baseline_pooled"] = vs = _paired(pooled_base, pooled) if pooled else None
            # power: the smallest net gain over the baseline these tasks and disagreements could show
            entry["detectable_vs_baseline"] = None if vs is None else detectable_gain(vs["tasks"], vs["gained"] + vs["lost"])
        methods[method.name] = entry
    expected = len(arms)
    return {
        "study": study.name, "baseline": study.baseline, "seeds": list(study.seeds),
        "episodes_per_arm": study.episodes, "generated_tokens_per_arm": study.generated_tokens,
        "budget": study.budget, "eval_tasks": study.eval_tasks, "base_config": str(study.base),
        "eval_temperatures": sorted({r["eval_temperature"] for r in per_run}),
        "complete": len(per_run) == expected, "runs_finished": len(per_run), "runs_expected": expected,
        "methods": methods, "runs": per_run,
    }  # fmt: skip


def _fmt(value: Any, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}g}" if isinstance(value, float) else str(value)


#: Held-out details shown in the report (partial credit beside success): the reward, search's F1, WebShop's score.
HEADLINE_MEANS = ("outcome", "f1", "score")


def _means(means: dict[str, dict[str, float]]) -> str:
    """``outcome 0.31 → 0.35; f1 0.40 → 0.44`` for the headline details both evals kept, else –."""
    keys = [k for k in HEADLINE_MEANS if k in means.get("before", {}) and k in means.get("after", {})]
    return "; ".join(f"{k} {means['before'][k]:.3g} → {means['after'][k]:.3g}" for k in keys) or "–"


def _own(own: dict[str, Any] | None) -> str:
    """``+0.104: 21 / 1 of 192 (1.1e-05)``: a method's gain over its warm-up, pooled over seeds."""
    return "–" if not own else f"{own['gain']:+.3f}: {own['gained']} / {own['lost']} of {own['tasks']} ({own['p_value']:.2g})"


def _detectable(gain: float | None) -> str:
    return "none" if gain is None else f"{gain:.3f}"


def _start(row: dict[str, Any]) -> str:
    """The "same start" cell: whether the arm's eval before RL equals the baseline's, and why not
    when the arm evaluated itself in another mode."""
    own = row.get("own_eval_before") or []
    return _fmt(row["same_start_as_baseline"]) + (f" (own eval: {'; '.join(own)})" if own else "")


def eval_wording(temperatures: list[float]) -> str:
    """How the held-out evals sampled (``train.eval_temperature`` of the finished runs), for the report."""
    if not temperatures or temperatures == [0.0]:
        return "greedy, the same for every arm"
    if len(temperatures) == 1:
        return (f"sampled at temperature {temperatures[0]:g}, one sample a task from sampling streams keyed by "
                "the task, the same for every arm")  # fmt: skip
    return f"evaluated at differing temperatures: {', '.join(f'{t:g}' for t in temperatures)} (0 = greedy)"


def report_markdown(results: dict[str, Any]) -> str:
    """report.md: the side-by-side table, then one row per run."""
    methods = results["methods"]
    shown = [k for k in table_mechanisms() if any(k in m["mechanisms"] for m in methods.values())]
    labels = mechanism_labels()
    lines = [
        f"# Study `{results['study']}`" + ("" if results["complete"] else " (incomplete)"),
        "",
        f"Baseline arm: `{results['baseline']}`. Seeds: {results['seeds']}. Budget: "
        f"{results.get('budget') or str(results['episodes_per_arm']) + ' sampled episodes per arm'}. Held-out tasks: {results['eval_tasks']} ({eval_wording(results.get('eval_temperatures', [0.0]))}). "
        f"Runs finished: {results['runs_finished']}/{results['runs_expected']}. Base config: `{results['base_config']}`.",
        "",
        "| method | overrides | seeds | held-out before | held-out after (per seed) | after, mean | own gain over the warm-up, pooled: gained / lost (p) | vs baseline: gained / lost (pooled) | sign-test p | detectable gain vs baseline | "
        + " | ".join(labels[k] for k in shown) + " |",
        "|" + "---|" * (10 + len(shown)),
    ]  # fmt: skip
    for name, m in methods.items():
        vs = m.get("vs_baseline_pooled")
        cells = [
            f"`{name}`", "<br>".join(f"`{o}`" for o in m["overrides"]) or "(base)", str(len(m["seeds"])),
            _fmt(m["success_before_mean"]), ", ".join(f"{v:.3f}" for v in m["success_after"]),
            f"{m['success_after_mean']:.3f}", _own(m.get("own_gain_pooled")),
            "baseline" if name == results["baseline"] else (f"{vs['gained']} / {vs['lost']} of {vs['tasks']}" if vs else "–"),
            "–" if not vs else f"{vs['p_value']:.3g}",
            "–" if name == results["baseline"] or not vs else _detectable(m.get("detectable_vs_baseline")),
            *(_fmt(m["mechanisms"].get(k)) for k in shown),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Runs", "",
              "| method | seed | steps | episodes / generated tokens | before | after | gained / lost vs before (p) | vs baseline same seed: gained / lost (p) | same start | failed eval episodes (before, after) | grad-norm p50 / p90 / max | clip frac mean / max | held-out means before → after |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results["runs"]:
        vs, mech = r["vs_baseline"], r["mechanisms"]
        grad = "/".join(
            _fmt(mech.get(k)) for k in ("loss/grad_norm_p50", "loss/grad_norm_p90", "loss/grad_norm_max")
        )
        clip = "/".join(_fmt(mech.get(k)) for k in ("loss/clipfrac", "loss/clipfrac_max"))
        lines.append(
            f"| `{r['method']}` | {r['seed']} | {r['steps']} | {r['episodes']} / {_fmt(r.get('generated_tokens'))} | "
            f"{r['success_before']:.3f} | {r['success_after']:.3f} | "
            f"{r['gained']} / {r['lost']} ({r['p_value']:.3g}) | "
            + ("–" if vs is None else f"{vs['gained']} / {vs['lost']} ({vs['p_value']:.3g})")
            + f" | {_start(r)} | {', '.join(f'{x:.0f}' for x in r['eval_failed']) or '–'}"
            + f" | {grad} | {clip} | {_means(r['held_out_means'])} |"
        )  # fmt: skip
    lines += ["", "Own gain: held-out tasks gained / lost after RL over the warm-up's eval, pooled over seeds "
              "(exact sign test). Detectable gain: the smallest net difference in success rate from the "
              "baseline that the pooled sign test would find at p < 0.05 with 80% power, the arms' observed "
              "disagreements counted as noise (`agentrl.study.report.detectable_gain`).", "",
              "Plots: `success.png` (held-out success per method, one point per seed), `reward.png` "
              "(training reward per step), `clipfrac.png`, `context.png` where logged.", ""]  # fmt: skip
    return "\n".join(lines)


def plot(results: dict[str, Any], runs: list[Any], out_dir: Path) -> list[Path]:
    """success.png, reward.png, clipfrac.png (runs with a clip fraction), context.png (main-thread tokens)."""
    try:
        import matplotlib
    except ImportError:
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    names = list(results["methods"])
    colors = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(names), 3.6))
    for i, name in enumerate(names):
        m = results["methods"][name]
        ax.bar(i, m["success_after_mean"], color=colors[name], alpha=0.35, width=0.6)
        xs = i + np.linspace(-0.15, 0.15, len(m["seeds"])) if len(m["seeds"]) > 1 else [i]
        ax.scatter(xs, m["success_after"], color=colors[name], zorder=3, label=None)
        ax.scatter(xs, m["success_before"], facecolors="none", edgecolors="gray", zorder=3)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(f"held-out success ({results['eval_tasks']} tasks)")
    ax.set_title("after RL (filled, per seed; bar = mean); before RL (hollow)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    written.append(out_dir / "success.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    arms = [r for r in runs if r.method is not None and r.finished]
    for key, fname, title in (("env/reward", "reward.png", "training reward"),
                              ("loss/clipfrac", "clipfrac.png", "clip fraction"),
                              ("ctx/main_tokens", "context.png", "main-thread tokens / episode")):  # fmt: skip
        curves = [(r, [(x["step"], x[key]) for x in rl_records(r.out_dir) if key in x]) for r in arms]
        curves = [(r, c) for r, c in curves if c]
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for r, c in curves:
            ax.plot([p[0] for p in c], [p[1] for p in c], marker="o", markersize=3, color=colors[r.method],
                    alpha=0.85, label=f"{r.method} s{r.seed}")  # fmt: skip
        ax.set_xlabel("RL step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        written.append(out_dir / fname)
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def write_results(study: Any, runs: list[Any], extra: dict[str, Any] | None = None,
                  notes: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """Write results.json, report.md and the plots into the study's out_dir; returns the results.
    ``extra``: more keys for results.json; ``notes``: lines after the report (a re-evaluation says
    where it came from)."""
    results = collect(study, runs)
    if results["runs"]:
        results["plots"] = [p.name for p in plot(results, runs, study.out_dir)]
    results.update(extra or {})
    (study.out_dir / "results.json").write_text(json.dumps(results, indent=2))
    report = report_markdown(results)
    (study.out_dir / "report.md").write_text(report + ("\n" + "\n".join(notes) + "\n" if notes else ""))
    return results


__all__ = ["MECHANISMS", "collect", "mechanism_labels", "mechanisms", "plot", "report_markdown", "write_results"]
