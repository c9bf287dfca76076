"""WebShop-style shopping env: a real shop server over HTTP, WebShop's actions and reward.

Task payload: the goal (``Goal.to_dict()``: instruction, attributes, options, price_upper, query,
path, name, asin of the product it was made from). The episode ends when the agent clicks
[Buy Now] (``terminated``) or at the step budget (``truncated``, 15 steps by default).

Metrics on the last step: ``score`` (R x 100), ``success`` (R == 1), the reward's factors
(``r_type``, ``r_att``, ``r_opt``, ``r_price``), ``invalid_actions``, ``server_restarts``,
``purchased``, plus the base counters.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx

from agentrl.env import Score, Task, TextEnv
from agentrl.envs.web import manager
from agentrl.envs.web.browser import Browser
from agentrl.envs.web.catalog import Catalog, Goal, get_catalog
from agentrl.envs.web.reward import RewardParts, reward_for_purchase
from agentrl.errors import ConfigError, EnvError
from agentrl.tools.base import Tool
from agentrl.tools.browser import make_browser_tools

SYSTEM_PROMPT = """You are shopping on a web shop for a customer. The page shows the customer's \
instruction. Find a product that matches every requirement (attributes, options such as size or \
colour, and the price limit) and buy it.

Each turn, take exactly one action:
- search[keywords]: search the shop (only on the search page);
- click[element]: click a link or button shown in [brackets], e.g. click[B0ABC12345], click[Next >], \
click[large], click[Features], click[< Prev], click[Back to Search], click[Buy Now].
Select every option the customer asked for before clicking [Buy Now]; buying ends the episode."""


def purchase_reward(goal: Goal, purchase: dict[str, Any], catalog: Catalog) -> RewardParts:
    """Reward of a purchase record ``{"asin", "options"}`` for ``goal`` (used by the env and scorers)."""
    product = catalog.by_asin.get(str(purchase.get("asin")))
    if product is None:
        raise EnvError(f"purchase names an unknown product {purchase.get('asin')!r}")
    options = purchase.get("options") or {}
    chosen = {k: v for k, v in options.items() if v in product.options.get(k, [])}
    return reward_for_purchase(goal, product, chosen, catalog.noun_lexicon)


class WebShopEnv(TextEnv):
    """Shop for the product an instruction describes; see the module docstring."""

    success_metric = "success"
    system_prompt = SYSTEM_PROMPT
    splits = ("train", "dev", "test")
    # the state is the shop session (server side: instruction, goal, purchase; the page's URLs hold
    # the rest): a fork copies it over HTTP (POST /api/sessions/{sid}/fork) and holds the shared
    # server by a reference of its own
    fork_method = "session"
    shared_services = ("shop",)  # with env.placement ray: one shop server per node (or cluster)

    def __init__(
        self,
        *,
        split: str = "train",
        render_mode: str | None = None,
        seed: int = 0,
        n_products: int = 1500,
        data_dir: str | None = "auto",
        backend: str = "local",
        server_url: str | None = None,
        timeout_s: float = 30.0,
    ):
        """Args:
        split: "train", "dev" or "test" (500 goals).
        seed: catalogue and goal seed (not the episode seed; that one goes to reset()).
        n_products: catalogue size (>= 50; default 1500).
        data_dir: where the real WebShop vocabulary comes from: "auto" (the files shipped with
            agentrl, or $AGENTRL_DATA/webshop), a folder holding webshop/, or "builtin" (None) for
            the small built-in vocabulary. Missing files are an error, not a fallback.
        backend: "local" (a server process on 127.0.0.1) or "docker" (the server in a hardened
            sandbox container on its own internal network, reachable only from the host; see
            ``docker_backend.py``). Either is shared by envs with the same catalogue.
        server_url: use an already running shop at this URL instead of starting one.
        timeout_s: HTTP timeout per request.
        """
        super().__init__(split=split, render_mode=render_mode)
        if backend not in ("local", "docker"):
            raise ConfigError("env.backend", f"unknown backend {backend!r}", "use 'local' or 'docker'")
        self.catalog_seed = seed
        self.n_products = n_products
        self.data_dir = data_dir
        self.backend = backend
        self.server_url = server_url
        self.timeout_s = timeout_s
        self.catalog = get_catalog(seed, n_products, data_dir)
        self._server: manager.ShopServer | None = None
        self._client: httpx.Client | None = None
        self._browser: Browser | None = None
        self._closed = False

    # ------------------------------------------------------------------ hooks
    def load_tasks(self, split: str) -> Sequence[Task]:
        return [
            Task(
                id=goal.id,
                question=goal.instruction,
                answer={"asin": goal.asin, "options": goal.options, "price_upper": goal.price_upper},
                split=split,
                level=len(goal.attributes) + len(goal.options),
                payload=goal.to_dict(),
            )
            for goal in self.catalog.goals(split)
        ]

    def make_tools(self) -> list[Tool]:
        return make_browser_tools(self._current_browser)

    def render_task(self, task: Task) -> str:
        browser = self._ensure_browser()
        goal = self._goal_of(task)
        return browser.open(goal.instruction, goal.to_dict())

    def score(self, answer: str | None, task: Task) -> Score:
        browser = self._browser
        counters = {
            "invalid_actions": float(browser.invalid_actions if browser else 0),
            "server_restarts": float(browser.server_restarts if browser else 0),
        }
        purchase = self._purchase_from(answer)
        if purchase is None:
            return Score(0.0, {"score": 0.0, "success": 0.0, "purchased": 0.0, **counters})
        parts = purchase_reward(self._goal_of(task), purchase, self.catalog)
        return Score(
            parts.reward,
            {
                "score": 100.0 * parts.reward,
                "success": float(parts.reward >= 1.0 - 1e-9),
                "purchased": 1.0,
                "r_type": parts.r_type,
                "r_att": parts.r_att,
                "r_opt": parts.r_opt,
                "r_price": parts.r_price,
                **counters,
            },
        )

    def on_close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._browser is not None:
            self._browser.close()
            self._browser = None
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._server is not None:
            manager.release(self._server)
            self._server = None

    def fork_detach(self) -> None:
        self._server = self._client = self._browser = None
        self._closed = False

    def fork_attach(self, parent: TextEnv) -> None:
        assert isinstance(parent, WebShopEnv)
        browser = parent._browser
        if browser is None:
            raise EnvError("the web env has no shop session to fork: call reset() first")
        if parent._server is not None:  # a reference of our own to the shared server (released on close)
            self._server = manager.acquire(seed=self.catalog_seed, n_products=self.n_products,
                                           data_dir=self.data_dir, backend=self.backend)  # fmt: skip
        self._client = httpx.Client(timeout=self.timeout_s)
        self._browser = browser.fork(self._client, self._server or browser.server)

    # ------------------------------------------------------------------ internals
    def _goal_of(self, task: Task) -> Goal:
        if not task.payload:
            raise EnvError(f"web task {task.id!r} has no goal payload (Goal.to_dict())")
        return Goal.from_dict(task.payload)

    def _purchase_from(self, answer: str | None) -> dict[str, Any] | None:
        """The purchase this episode made; a typed <answer> that did not come from Buy Now scores 0."""
        purchase = self._browser.purchase if self._browser is not None else None
        if answer is None or purchase is None:
            return None
        return purchase if answer == json.dumps(purchase, sort_keys=True) else None

    def _ensure_browser(self) -> Browser:
        if self._closed:
            raise EnvError("this env is closed; make a new one")
        if self._browser is None:
            if self.server_url:
                server = manager.ShopServer(
                    seed=self.catalog_seed,
                    n_products=self.n_products,
                    data_dir=self.data_dir,
                    external_url=self.server_url,
                )
                try:
                    server.fingerprint = httpx.get(f"{server.url}/api/health", timeout=self.timeout_s).json()[
                        "fingerprint"
                    ]
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    raise EnvError(f"no shop answers at server_url={self.server_url!r}: {exc}") from exc
            else:
                server = manager.acquire(
                    seed=self.catalog_seed,
                    n_products=self.n_products,
                    data_dir=self.data_dir,
                    backend=self.backend,
                )
                self._server = server
            if server.fingerprint != self.catalog.fingerprint:
                raise EnvError(
                    f"the shop server's catalogue ({server.fingerprint}) differs from the env's "
                    f"({self.catalog.fingerprint}); both must be built from the same seed and data"
                )
            self._client = httpx.Client(timeout=self.timeout_s)
            self._browser = Browser(server, self._client)
        return self._browser

    def _current_browser(self) -> Browser:
        return self._ensure_browser()
