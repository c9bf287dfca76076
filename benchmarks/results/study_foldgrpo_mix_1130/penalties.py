"""Process penalties (FoldGRPO's) in a run's held-out episodes, successes against failures, and the main
thread's and branches' largest context per episode.
python penalties.py RUN_DIR/eval/step-000000.jsonl  (the study's warmup/eval: 128 greedy episodes, folding)"""
import collections
import json
import statistics
import sys

episodes = [json.loads(line) for line in open(sys.argv[1])]
for outcome, name in ((1.0, "successes"), (0.0, "failures")):
    chosen = [e for e in episodes if e["outcome"] == outcome]
    tokens = collections.Counter()
    for e in chosen:
        for kind in ("unfolded", "failure", "out_of_scope", "penalised"):
            tokens[kind] += e["metrics"].get(f"process/{kind}_tokens", 0)
    penalised = sum(e["metrics"].get("process/penalised_tokens", 0) > 0 for e in chosen)
    print(f"{name}: {len(chosen)} episodes, {penalised} with a penalised token; tokens {dict(tokens)}")
    for kind in ("main", "branch"):
        sizes = [max(len(s["prompt_ids"]) + sum(len(t["output_ids"]) + len(t.get("obs_ids") or []) for t in s["turns"])
                     for s in e["segments"] if s.get("kind") == kind) for e in chosen
                 if any(s.get("kind") == kind for s in e["segments"])]
        if sizes:
            print(f"  {kind} context (largest per episode): median {statistics.median(sizes):.0f}, max {max(sizes)}")
