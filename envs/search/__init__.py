"""Search environments: a fictional-entity wiki behind search/open tools, and real QA sets."""

from agentrl.env import register

register(
    "agentrl/Search-v0",
    "agentrl.envs.search.env:SearchEnv",
    description="Fictional-wiki QA (1-3 hops) with search/open tools over BM25; reward = exact match",
    max_turns=16,
    kwargs={"hops": "mix"},
)
register(
    "agentrl/SearchMultiHop-v0",
    "agentrl.envs.search.env:SearchEnv",
    description="Fictional-wiki multi-hop QA (2-3 hops) with search/open tools over BM25",
    max_turns=16,
    kwargs={"hops": "multi"},
)
register(
    "agentrl/SearchQA-v0",
    "agentrl.envs.search.qa:SearchQAEnv",
    description="Real QA sets (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue, Bamboogle); closed-book "
    "unless retriever_url points at a Search-R1 retrieval server",
    max_turns=10,
)
