"""FoldGRPO vs GRPO, both folding (foldgrpo_vs_grpo_quickstart.yaml), every model re-evaluated on the
same 128 held-out tasks sampled at the training temperature (0.6): per seed and pooled sign tests.

Usage: python analyse.py DIR  (DIR holds w<seed>/, g<seed>/, f<seed>/ runs of `agentrl train ...
train.steps=0 train.eval_temperature=0.6 model.adapter=<model>`: warm-up, GRPO arm, FoldGRPO arm)."""

import json
import sys
from pathlib import Path

from agentrl.study.report import detectable_gain
from agentrl.train.heldout import sign_test_p


def outcomes(run: Path, seed: int) -> dict[str, float]:
    tasks = json.loads((run / "summary.json").read_text())["eval_tasks"]["before"]
    return {f"{seed}/{task}": value for task, value in tasks.items()}


def paired(a: dict[str, float], b: dict[str, float]) -> tuple[int, int, int, float]:
    assert a.keys() == b.keys(), "not the same tasks"
    gained = sum(b[k] > a[k] for k in a)
    lost = sum(b[k] < a[k] for k in a)
    return len(a), gained, lost, sign_test_p(gained, lost)


def row(label: str, a: dict[str, float], b: dict[str, float], power: bool = False) -> str:
    n, gained, lost, p = paired(a, b)
    mean_a, mean_b = sum(a.values()) / n, sum(b.values()) / n
    extra = f" | {detectable_gain(n, gained + lost):.3f}" if power else " | –"
    return f"| {label} | {n} | {mean_a:.3f} -> {mean_b:.3f} | {gained} / {lost} | {p:.2g} | {(gained - lost) / n:+.3f}{extra} |"


def main() -> None:
    root = Path(sys.argv[1])
    seeds = sorted(int(p.name[1:]) for p in root.glob("w*") if (p / "summary.json").exists())
    runs = {(kind, s): outcomes(root / f"{kind}{s}", s) for s in seeds for kind in "wgf"
            if (root / f"{kind}{s}" / "summary.json").exists()}  # fmt: skip
    print("| comparison | tasks | success | gained / lost | sign-test p | net gain | detectable gain |")
    print("|---|---|---|---|---|---|---|")
    pooled: dict[tuple[str, str], dict[str, float]] = {}
    for s in seeds:
        for (a, b, label, power) in (("w", "g", "GRPO over its warm-up", False), ("w", "f", "FoldGRPO over its warm-up", False),
                                     ("g", "f", "FoldGRPO vs GRPO", True)):  # fmt: skip
            if (a, s) in runs and (b, s) in runs:
                print(row(f"seed {s}: {label}", runs[(a, s)], runs[(b, s)], power))
                pooled.setdefault((a, b), {}).update(runs[(a, s)])
                pooled.setdefault((b, a), {}).update(runs[(b, s)])
    for a, b, label, power in (("w", "g", "GRPO over its warm-up", False), ("w", "f", "FoldGRPO over its warm-up", False),
                               ("g", "f", "FoldGRPO vs GRPO", True)):  # fmt: skip
        if (a, b) in pooled:
            print(row(f"pooled: {label}", pooled[(a, b)], pooled[(b, a)], power))


if __name__ == "__main__":
    main()
