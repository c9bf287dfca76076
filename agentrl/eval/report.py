"""Eval outputs: per-episode records (JSONL), aggregate metrics (JSON), a Markdown report and plots.

Every episode lands in exactly one bucket:

- ``solved``: the success metric reached 1.
- ``episode error``: the episode crashed (recorded, the run went on).
- ``format error``: the agent never produced one valid action (every turn was malformed or void).
- ``budget hit``: the turn or token budget ended the episode before an answer.
- ``no answer``: it ended without a final answer for another reason.
- ``tool error``: it answered wrongly after at least one failed tool call.
- ``wrong answer``: it answered wrongly with every tool call fine.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BUCKETS = ("solved", "wrong answer", "tool error", "format error", "budget hit", "no answer", "episode error")


def failure_bucket(record: dict[str, Any]) -> str:
    """The one bucket an episode record falls in (see module doc)."""
    if record.get("error"):
        return "episode error"
    if record["success"] >= 1.0:
        return "solved"
    if record["turns"] > 0 and record["void_turns"] >= record["turns"] and not record["answered"]:
        return "format error"
    if record["truncated"]:
        return "budget hit"
    if not record["answered"]:
        return "no answer"
    if record["tool_errors"] > 0:
        return "tool error"
    return "wrong answer"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c successes (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def summarize(records: Sequence[dict[str, Any]], metric_names: Sequence[str], k: int = 1) -> dict[str, Any]:
    """Aggregate a group of episode records: rates, means, buckets and pass@k."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_task[record["task_id"]].append(record)
    summary: dict[str, Any] = {
        "tasks": len(by_task),
        "episodes": len(records),
        "success_rate": _mean([r["success"] for r in records]),
        "mean_reward": _mean([r["reward"] for r in records]),
        "mean_turns": _mean([r["turns"] for r in records]),
        "mean_tool_calls": _mean([r["tool_calls"] for r in records]),
        "tool_error_rate": sum(r["tool_errors"] for r in records)
        / max(1.0, sum(r["tool_calls"] for r in records)),
        "format_errors_per_episode": _mean([r["format_errors"] for r in records]),
        "answered_rate": _mean([float(r["answered"]) for r in records]),
        "metrics": {name: _mean([r["metrics"].get(name, 0.0) for r in records]) for name in metric_names},
        "buckets": {b: c for b, c in Counter(r["bucket"] for r in records).items()},
    }
    if k > 1:
        summary[f"pass@{k}"] = _mean(
            [pass_at_k(len(rs), sum(r["success"] >= 1.0 for r in rs), k) for rs in by_task.values()]
        )
    return summary


def aggregate(records: Sequence[dict[str, Any]], metric_names: Sequence[str], k: int = 1) -> dict[str, Any]:
    """Overall summary plus one summary per subset label."""
    subsets: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        subsets[record["subset"]].append(record)
    return {
        "overall": summarize(records, metric_names, k),
        "subsets": {label: summarize(rs, metric_names, k) for label, rs in sorted(subsets.items())},
    }


# --------------------------------------------------------------------------- writing
def write_records(records: Sequence[dict[str, Any]], path: Path) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, default=str) + "\n")


def _row(label: str, s: dict[str, Any], metric_names: Sequence[str], k: int) -> list[str]:
    cells = [label, str(s["tasks"]), str(s["episodes"]), f"{100 * s['success_rate']:.1f}"]
    if k > 1:
        cells.append(f"{100 * s[f'pass@{k}']:.1f}")
    cells += [f"{s['metrics'][m]:.3f}" for m in metric_names]
    cells += [f"{s['mean_turns']:.1f}", f"{s['mean_tool_calls']:.1f}", f"{100 * s['answered_rate']:.0f}"]
    return cells


def table_lines(metrics: dict[str, Any]) -> list[str]:
    """The per-subset Markdown table (also printed by the CLI)."""
    names, k = metrics["metric_names"], metrics["k"]
    header = ["subset", "tasks", "episodes", "success %"] + ([f"pass@{k} %"] if k > 1 else [])
    header += [*names, "turns", "tool calls", "answered %"]
    rows = [_row(label, s, names, k) for label, s in metrics["subsets"].items()]
    rows.append(_row("**all**", metrics["overall"], names, k))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def bucket_lines(metrics: dict[str, Any]) -> list[str]:
    lines = ["| subset | " + " | ".join(BUCKETS) + " |", "|" + "---|" * (len(BUCKETS) + 1)]
    groups = [*metrics["subsets"].items(), ("**all**", metrics["overall"])]
    for label, s in groups:
        lines.append(f"| {label} | " + " | ".join(str(s["buckets"].get(b, 0)) for b in BUCKETS) + " |")
    return lines


_HTTP_ANSWER = re.compile(r"(?P<url>\S+) answered HTTP (?P<status>\d{3}): (?P<body>.*)", re.DOTALL)


def readable_error(error: str) -> str:
    """An episode error as a user reads it: its first line, with a server's JSON error answer
    reduced to the server's own message (``HTTP 400 from URL: Unsupported value: 'temperature' ...``)."""
    text = error.strip()
    first = text.splitlines()[0] if text else "?"
    match = _HTTP_ANSWER.search(text)
    if match:
        body = match.group("body").strip()
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        inner = payload.get("error") if isinstance(payload, dict) else None
        if isinstance(inner, dict) and inner.get("message"):
            body = str(inner["message"])
        elif isinstance(inner, str):
            body = inner
        kind = text[: match.start()].strip().rstrip(":").rsplit(".", 1)[-1]
        return f"{kind + ': ' if kind else ''}HTTP {match.group('status')} from {match.group('url')}: {body}"
    return first


def error_kind(error: str) -> str:
    """The normalised text errors are grouped by: the readable message without its per-episode
    details (numbers, ids, long quoted text); short quoted words stay, so "temperature" and
    "max_tokens" refusals are two groups."""
    text = readable_error(error)
    text = re.sub(r"'[^']{40,}'|\"[^\"]{40,}\"", "'…'", text)
    text = re.sub(r"\b[0-9a-f]{8,}\b", "X", text)
    return re.sub(r"\d+(?:\.\d+)?", "N", text)[:200]


def error_lines(records: Sequence[dict[str, Any]], examples: int = 3) -> list[str]:
    """Episode errors grouped by their normalised text, most frequent first: count, one real
    message (the first episode's, readable) and example task ids."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        if record.get("error"):
            groups[error_kind(str(record["error"]))].append(record)
    if not groups:
        return []
    lines = ["| episodes | error (one episode's message) | example tasks |", "|---|---|---|"]
    for _, group in sorted(groups.items(), key=lambda item: -len(item[1])):
        ids = ", ".join(str(r["task_id"]) for r in group[:examples]) + (" …" if len(group) > examples else "")
        message = readable_error(str(group[0]["error"])).replace("|", "\\|").replace("\n", " ")[:400]
        lines.append(f"| {len(group)} | {message} | {ids} |")
    return lines


def write_plots(records: Sequence[dict[str, Any]], metrics: dict[str, Any], out: Path) -> list[str]:
    """Success per subset, failure buckets and turns per episode as PNG files; returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    labels = list(metrics["subsets"])
    fig, ax = plt.subplots(figsize=(max(4, 1 + 0.8 * len(labels)), 3))
    ax.bar(labels, [100 * metrics["subsets"][s]["success_rate"] for s in labels], color="#4878a8")
    ax.set_ylabel("success %")
    ax.set_ylim(0, 100)
    ax.set_title(f"{metrics['suite']} - {metrics['agent']}")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(out / "success_by_subset.png", dpi=100)
    plt.close(fig)
    names.append("success_by_subset.png")

    fig, ax = plt.subplots(figsize=(6, 3))
    counts = [metrics["overall"]["buckets"].get(b, 0) for b in BUCKETS]
    ax.barh(list(BUCKETS), counts, color="#a85848")
    ax.set_xlabel("episodes")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out / "failure_buckets.png", dpi=100)
    plt.close(fig)
    names.append("failure_buckets.png")

    fig, ax = plt.subplots(figsize=(5, 3))
    turns = [r["turns"] for r in records]
    ax.hist(turns, bins=range(0, int(max(turns, default=1)) + 2), color="#58a878")
    ax.set_xlabel("turns per episode")
    ax.set_ylabel("episodes")
    fig.tight_layout()
    fig.savefig(out / "turns.png", dpi=100)
    plt.close(fig)
    names.append("turns.png")
    return names


def write_report(records: Sequence[dict[str, Any]], metrics: dict[str, Any], out: Path) -> Path:
    """Write records.jsonl, metrics.json, the plots and report.md into ``out``; return report.md."""
    out.mkdir(parents=True, exist_ok=True)
    write_records(records, out / "records.jsonl")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str), encoding="utf-8")
    plots = write_plots(records, metrics, out)
    overall = metrics["overall"]
    lines = [
        f"# Evaluation: {metrics['suite']} with {metrics['agent']}",
        "",
        f"- command: `{metrics['command']}`",
        f"- tasks: {overall['tasks']}, episodes: {overall['episodes']} (k={metrics['k']}), seed {metrics['seed']}"
        + (f", limit {metrics['limit']}" if metrics["limit"] else ""),
        f"- success: **{100 * overall['success_rate']:.1f}%**, mean reward {overall['mean_reward']:.3f}",
        f"- wall time {metrics['wall_s']:.1f} s, {metrics['episodes_per_minute']:.1f} episodes/min "
        f"(concurrency {metrics['concurrency']}; model loading, {metrics.get('setup_s', 0.0):.1f} s, not counted)",
    ]
    if metrics.get("notes"):
        lines.append(f"- note: {metrics['notes']}")
    if metrics.get("settings"):
        shown = ", ".join(f"{k}={v}" for k, v in metrics["settings"].items() if k != "sources")
        lines.append(f"- model agent settings: {shown}")
    chat = metrics.get("chat")
    if chat:
        fields = ", ".join(f"{k}={json.dumps(v)}" for k, v in chat["fields"].items()) or "none"
        bound = chat["context_bound"]
        lines.append(
            f"- chat requests: model {chat['model']!r}, fields besides the conversation: {fields}; "
            + (
                f"an episode ends at {bound} context tokens"
                if bound
                else "an episode ends when the context is full"
            )
            + f" ({chat['context_bound_from']})"
        )
    unavailable = metrics.get("attachment_problems") or []
    if unavailable:
        lines += ["", f"## Tasks with an unavailable attachment ({len(unavailable)})", ""]
        lines += ["Kept and scored; reading the file told the agent it is unavailable.", ""]
        lines += [
            f"- {p['task_id']}: {p['file_name']} ({p['problem'].replace('_', ' ')})" for p in unavailable
        ]
    errors = error_lines(records)
    if errors:
        lines += ["", "## Episode errors", "", *errors]
    replayed = [r for r in records if r.get("replayed_errors")]
    if replayed:
        lines += ["", f"## Replayed episodes ({len(replayed)})", "",
                  f"Crashed, then run again with the same task and seed (`--replays {metrics.get('replays')}`); "
                  "the result above is the last run's.", ""]  # fmt: skip
        for r in replayed:
            first = str(r["replayed_errors"][0]).replace("\n", " ")[:300]
            now = "crashed again" if r.get("error") else f"success {r['success']:g}"
            lines.append(
                f"- {r['episode_id']}: {len(r['replayed_errors'])} crash(es), then {now}; first: {first}"
            )
    lines += ["", "## Results by subset", "", *table_lines(metrics), "", "## Failure buckets", ""]
    lines += [
        *bucket_lines(metrics),
        "",
        "Buckets: " + __doc__.split("Every episode lands in exactly one bucket:")[1],
    ]
    lines += ["## Plots", ""] + [f"![{name}]({name})" for name in plots]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def results_table(metric_files: Sequence[Path]) -> str:
    """One Markdown row per eval run (suite, agent, success, main metrics, command), for the README."""
    lines = [
        "| suite | agent | tasks | episodes | success % | metrics | command |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in metric_files:
        metrics = json.loads(Path(path).read_text(encoding="utf-8"))
        overall = metrics["overall"]
        shown = ", ".join(f"{name} {value:.3f}" for name, value in overall["metrics"].items())
        k = metrics["k"]
        if k > 1:
            shown += f", pass@{k} {overall[f'pass@{k}']:.3f}"
        lines.append(
            f"| {metrics['suite']} | {metrics['agent']} | {overall['tasks']} | {overall['episodes']} | "
            f"{100 * overall['success_rate']:.1f} | {shown} | `{metrics.get('command', '')}` |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    # python -m agentrl.eval.report OUT_DIR [OUT_DIR ...]: the README results table
    print(results_table([Path(d) / "metrics.json" for d in sys.argv[1:]]))
