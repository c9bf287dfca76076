"""Compare two runs' saved episodes step by step: turns whose tokens differ, turns whose sampler log-probs differ.
python compare.py RUN_A RUN_B (each a train.out_dir with episodes/step-N.jsonl, train.save_episodes=true)"""
import json
import sys
from pathlib import Path

a_dir, b_dir = Path(sys.argv[1]), Path(sys.argv[2])
for path in sorted((a_dir / "episodes").glob("step-*.jsonl")):
    a = [json.loads(line) for line in path.read_text().splitlines()]
    b = [json.loads(line) for line in (b_dir / "episodes" / path.name).read_text().splitlines()]
    turns = tokens = logprobs = 0
    largest = 0.0
    for ea, eb in zip(a, b, strict=True):
        for sa, sb in zip(ea["segments"], eb["segments"], strict=True):
            for ta, tb in zip(sa["turns"], sb["turns"], strict=True):
                turns += 1
                tokens += ta["output_ids"] != tb["output_ids"]
                if ta["output_logprobs"] != tb["output_logprobs"]:
                    logprobs += 1
                    largest = max(largest, max(abs(x - y) for x, y in zip(ta["output_logprobs"], tb["output_logprobs"])))
    print(f"{path.stem}: {len(a)} episodes, {turns} turns, tokens differ in {tokens}, "
          f"sampler log-probs differ in {logprobs} (largest {largest:.2e})")
