import agentrl, collections
from agentrl.envs.search.oracle import SnippetPlanningSearchOracle, PlanningSearchOracle
for hops in ("single", "multi"):
  for cls in (PlanningSearchOracle, SnippetPlanningSearchOracle):
    env = agentrl.make("agentrl/Search-v0", hops=hops, split="train", max_obs_chars=600)
    turns = collections.Counter(); ok = 0; N = 300
    for i in range(N):
        obs, info = env.reset(seed=i)
        task = env.unwrapped.task
        o = cls(); o.reset(task)
        for t in range(8):
            obs, r, term, trunc, info = env.step(o.act(obs))
            if term or trunc: break
        turns[t+1] += 1; ok += r > 0.99
    print(hops, cls.__name__, ok/N, sorted(turns.items()))
