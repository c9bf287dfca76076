"""Where a tree-rollout run's learning signal is: per step, how many trees had the answer in view
and how many of those were all wrong, mixed (informative) or all right.

    python benchmarks/tree_signal.py --from runs/quickstart    # a run with train.save_episodes=true

A tree "had the answer in view" when a gold answer appears in one of its root's observations (the
search results or the opened page). Such a tree with every answer wrong is a confident mistake of
the policy: group-relative advantages are all zero there, so RL cannot fix it from this tree.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def tree_rows(run: Path) -> list[dict[str, int]]:
    """One row per step file: trees, in view, and the in-view trees by how many answers were right."""
    rows = []
    for path in sorted((run / "episodes").glob("step-*.jsonl")):
        trees: dict[str, list[dict]] = defaultdict(list)
        with path.open() as fh:
            for line in fh:
                episode = json.loads(line)
                trees[episode["group_id"]].append(episode)
        row = {"step": int(path.stem.split("-")[1]), "trees": 0, "in_view": 0, "all_wrong": 0, "mixed": 0,
               "all_right": 0}  # fmt: skip
        for episodes in trees.values():
            root = next((e for e in episodes if not e.get("parent_id")), episodes[0])
            seen = " ".join(t.get("observation") or "" for s in root["segments"] for t in s["turns"])
            gold = root["ground_truth"] if isinstance(root["ground_truth"], list) else [root["ground_truth"]]
            right = sum(e["outcome"] >= 1 for e in episodes)
            row["trees"] += 1
            if any(str(g) and str(g) in seen for g in gold):
                row["in_view"] += 1
                key = "all_wrong" if right == 0 else "all_right" if right == len(episodes) else "mixed"
                row[key] += 1
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="runs", nargs="+", required=True, help="run directories with episodes/")
    args = p.parse_args()
    for run in map(Path, args.runs):
        rows = tree_rows(run)
        if not rows:
            raise SystemExit(f"{run}: no episodes/step-*.jsonl (train with train.save_episodes=true)")
        total = {k: sum(r[k] for r in rows) for k in rows[0] if k != "step"}
        print(f"\n{run}")
        print("| step | trees | answer in view | in view, all wrong | in view, mixed | in view, all right |")
        print("|---|---|---|---|---|---|")
        for r in [*rows, {"step": "all", **total}]:
            print(f"| {r['step']} | {r['trees']} | {r['in_view']} | {r['all_wrong']} | {r['mixed']} | {r['all_right']} |")


if __name__ == "__main__":
    main()
