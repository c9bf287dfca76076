"""Greedy episodes of the folding study's warm-up model under the ReAct and the folding prompt: first actions."""
import collections, sys, json
import agentrl
from agentrl.rollout.model import load_model
from agentrl.rollout.generators.base import make_generator
from agentrl.rollout.runner import run_episodes
from agentrl.rollout.settings import RolloutConfig
model_dir = sys.argv[1]; n = int(sys.argv[2])
model, tok = load_model("smollm2-135m", adapter=model_dir)
gen = make_generator("hf", model=model, tokenizer=tok, seed=0, max_batch_size=32)
env = agentrl.make("agentrl/SearchMultiHop-v0", hops="multi", max_turns=10)
tasks = list(env.unwrapped.load_tasks("test"))[:n]; env.close()
mk = lambda: agentrl.make("agentrl/SearchMultiHop-v0", hops="multi", max_turns=10)
for folding in ("none", "branch"):
    cfg = RolloutConfig(folding=folding, max_new_tokens=64, max_context_tokens=1536, tool_schemas=False, group_size=1, concurrency=32, temperature=0.0)
    eps = run_episodes(mk, tasks, gen, tok, cfg, seed=0)
    first = collections.Counter()
    for e in eps:
        out = tok.decode(e.segments[0].turns[0].output_ids) if e.segments[0].turns else ""
        first[out.split('"name": "')[1].split('"')[0] if '"name": "' in out else out[:30]] += 1
    print(folding, "success", sum(e.outcome > 0 for e in eps), "/", len(eps), "segments/ep", sum(len(e.segments) for e in eps) / len(eps), "first actions", dict(first))
    print("  metrics of ep0", {k: v for k, v in eps[0].metrics.items()})
    print("  ep0 outputs", [tok.decode(t.output_ids)[:120] for t in eps[0].segments[0].turns][:4])
