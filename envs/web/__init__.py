"""Web shopping envs: a WebShop-style shop served over real HTTP (see env.py)."""

from agentrl.env import register

register(
    "agentrl/WebShop-v0",
    "agentrl.envs.web.env:WebShopEnv",
    description="WebShop-style shopping over HTTP: search[...] / click[...], WebShop's reward, 15 steps",
    max_turns=15,
    max_obs_chars=8192,
    kwargs={"split": "train", "n_products": 1500},
)
register(
    "agentrl/Web-v0",
    "agentrl.envs.web.env:WebShopEnv",
    description="generic web shop preset: train split, 1,000 products, 20 steps",
    max_turns=20,
    max_obs_chars=8192,
    kwargs={"split": "train", "n_products": 1000},
)
