"""What the search agent's answer turn chose, per step of a saved run (quickstart levers, round 3).

For runs whose warm-up cites the infobox line (``CitingSearchOracle``, ``PlanningSearchOracle``):
per file of saved episodes, the sampled reward, the trees' make-up (mixed / all wrong / all right),
how often the quoted label is the one the question asks for, how often the planned label
(``Looking for: X`` in the first turn) is right, and how often the answer quotes the planned label.

    python benchmarks/answer_labels.py RUN_DIR [RUN_DIR ...]

RUN_DIR is a run saved with ``train.save_episodes=true`` (its ``episodes/step-*.jsonl``) or with only
an eval (``eval/step-*.jsonl``).
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from agentrl.envs.search.questions import QUESTIONS
from agentrl.envs.search.wiki import RELATIONS

# question text -> the infobox label it asks for (the question's entity name is any text)
PATTERNS = [(re.compile("^" + re.escape(q).replace(re.escape("{x}"), ".+") + "$"), RELATIONS[r][0])
            for r, q in QUESTIONS.items()]  # fmt: skip


def wanted_label(question: str) -> str | None:
    return next((label for pattern, label in PATTERNS if pattern.match(question)), None)


def quoted_label(text: str) -> str | None:
    """``Label`` of a ``Label: value`` first line (None: the turn did not quote a line)."""
    first = text.split("\n", 1)[0]
    return first.split(":", 1)[0] if ":" in first and not first.startswith("<") else None


def planned_label(text: str) -> str | None:
    first = text.split("\n", 1)[0]
    return first.removeprefix("Looking for: ") if first.startswith("Looking for: ") else None


def row(path: Path, tokenizer) -> str:
    episodes = [json.loads(line) for line in path.open()]
    questions: dict[tuple[int, ...], str] = {}
    trees: dict[str, list[float]] = defaultdict(list)
    label_right = quoted = plan_right = roots = copied = planned = 0
    for ep in episodes:
        segment = ep["segments"][0]
        key = tuple(segment["prompt_ids"])
        if key not in questions:
            text = tokenizer.decode(segment["prompt_ids"])
            questions[key] = text.split("<|im_start|>user\n")[-1].split("<|im_end|>")[0].strip()
        want = wanted_label(questions[key])
        trees[ep["group_id"]].append(ep["outcome"])
        turns = segment["turns"]
        label, plan = quoted_label(turns[-1]["action_text"]), planned_label(turns[0]["action_text"])
        if label is not None:
            quoted += 1
            label_right += label == want
            if plan is not None:
                planned += 1
                copied += label == plan
        if not ep.get("parent_id"):
            roots += 1
            plan_right += plan is not None and plan == want
    mixed = sum(1 for v in trees.values() if 0 < sum(v) < len(v))
    wrong = sum(1 for v in trees.values() if sum(v) == 0)
    right = sum(1 for v in trees.values() if sum(v) == len(v))
    reward = sum(ep["outcome"] for ep in episodes) / max(len(episodes), 1)
    return (f"| {path.parent.parent.name}/{path.name} | {reward:.3f} | {mixed} / {wrong} / {right} | "
            f"{label_right} / {quoted} | {plan_right} / {roots} | {copied} / {planned} |")  # fmt: skip


def main(dirs: list[str]) -> None:
    from agentrl.rollout.model import load_tokenizer

    tokenizer = load_tokenizer()
    print("| file | sampled reward | trees mixed / all wrong / all right | label right / quoted | "
          "plan right / roots | answer quotes the plan / planned |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for d in dirs:
        files = sorted(Path(d).glob("episodes/step-*.jsonl")) or sorted(Path(d).glob("eval/step-*.jsonl"))
        for path in files:
            print(row(path, tokenizer))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
