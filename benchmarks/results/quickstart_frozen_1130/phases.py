"""Phase times of a quickstart run: python phases.py DIR... (each with stdout.log, time.txt, and run/ or the run's files)"""
import json, re, sys
from pathlib import Path
print("| run | warm-up | eval before / after | rollouts | learner | groups trained | wall | peak RSS (phase) | before -> after | gained / lost | p |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for d in map(Path, sys.argv[1:]):
    run = d / "run" if (d / "run").is_dir() else d  # a run's folder, or its records (flat)
    out = (d / "stdout.log").read_text().replace("\r", "\n")
    m = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    sft = next(x["perf/sft_s"] for x in m if "perf/sft_s" in x)
    evals = re.findall(r"eval (?:before RL|after step \d+):\s+episode 64/64.*?done in (\S+)", out)
    roll = sum(x["perf/rollout_s"] for x in m if "perf/rollout_s" in x)
    learn = sum(x["perf/learner_s"] for x in m if "perf/learner_s" in x)
    groups = [int(x["rollout/groups_trained"]) for x in m if "rollout/groups_trained" in x]
    wall = re.search(r"Elapsed .*?: (\S+)", (d / "time.txt").read_text()).group(1)
    s = json.loads((run / "summary.json").read_text())
    peak = max(s["peak_rss_gib"].items(), key=lambda kv: kv[1])
    held = re.search(r"before RL: ([\d.]+)\s+after RL: ([\d.]+)\s+\((\d+) tasks gained, (\d+) lost, sign-test p=([\d.e-]+)\)", out)
    fm = lambda s: f"{int(s // 60)}:{int(round(s % 60)):02d}"
    print(f"| {d.name} | {fm(sft)} | {' / '.join(evals)} | {fm(roll)} | {fm(learn)} | {', '.join(map(str, groups))} | {wall[:-3] if wall.count(':') == 1 else wall} | {peak[1]:.2f} GiB ({peak[0]}) | {held.group(1)} -> {held.group(2)} | {held.group(3)} / {held.group(4)} | {float(held.group(5)):.3g} |")
