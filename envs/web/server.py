"""The shop: a Starlette app with WebShop's pages, one session per episode.

Pages (all HTML, every user-supplied string escaped):

- ``GET /s/{sid}``: search page with the instruction and a search box;
- ``GET /s/{sid}/search?q=..&page=N``: 10 results per page (BM25 over title, type and bullet
  points; at most 50 results; ties by the rule of :mod:`agentrl.tools.search`: a product titled as
  the query, then the smaller ASIN), Back to Search, < Prev / Next >;
- ``GET /s/{sid}/item/{asin}?q=..&page=N&opt_<name>=<value>``: title, price, rating, options (each
  value a link that selects it), Description / Features / Reviews, Buy Now, < Prev, Back to Search;
- ``GET /s/{sid}/item/{asin}/{description|features|reviews}?..``: the sub-page, < Prev;
- ``POST /s/{sid}/buy/{asin}`` (form with the chosen options): the done page, which ends the
  session and carries the purchase as JSON in ``<script id="purchase">``.

JSON API: ``POST /api/sessions`` ``{"instruction": str, "goal": {...}?}`` -> ``{"session_id"}``,
``DELETE /api/sessions/{sid}``, ``POST /api/sessions/{sid}/fork`` -> ``{"session_id"}`` (a new
session in the same state: instruction, goal, purchase; the page state lives in the URLs), ``GET /api/health``. An unknown session answers 404 with the header
``X-Shop-Error: unknown-session`` (the server restarted or the session was evicted).

Run: ``python -m agentrl.envs.web.server --port 0 --seed 0`` prints one ``READY {json}`` line
(port, pid, catalogue fingerprint) once it accepts connections, and exits when its parent dies.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import sys
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qs, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from agentrl.envs.web.catalog import Catalog, Goal, Product
from agentrl.envs.web.reward import reward_for_purchase
from agentrl.serve.sockets import listen_socket
from agentrl.tools.search import TieBreak, import_bm25s, rank_top_k

RESULTS_PER_PAGE = 10
MAX_RESULTS = 50
MAX_SESSIONS = 20000
MAX_QUERY_CHARS = 1000
SUB_PAGES = ("description", "features", "reviews")
_STOPWORDS = frozenset(
    "a an the and or of for in on with to is are be that this it its i im am me my we you your want "
    "need looking would like find some please price lower than dollars buy get".split()
)


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens without stop words, with a crude plural strip (same for docs and queries)."""
    tokens = []
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        if word in _STOPWORDS:
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        tokens.append(word)
    return tokens


class SearchIndex:
    """BM25 (bm25s) over the products' search text, ranked by :func:`rank_top_k` (same on every CPU)."""

    def __init__(self, products: list[Product]):
        self.products = products
        self.retriever = import_bm25s().BM25()
        self.retriever.index([tokenize(p.search_text()) for p in products], show_progress=False)
        self.vocab = set(self.retriever.vocab_dict)
        self.ties = TieBreak([p.asin for p in products], [p.title for p in products])
        self.search = lru_cache(maxsize=4096)(self._search)

    def _search(self, query: str) -> tuple[str, ...]:
        tokens = [t for t in tokenize(query) if t in self.vocab]
        if not tokens:
            return ()
        scores = self.retriever.get_scores(tokens)  # [N]
        top, top_scores = rank_top_k(scores, MAX_RESULTS, self.ties, query)
        return tuple(self.products[int(d)].asin for d, s in zip(top, top_scores, strict=True) if s > 0)


@dataclass
class Session:
    instruction: str
    goal: Goal | None = None
    purchase: dict[str, Any] | None = None
    created: float = field(default_factory=time.time)


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _page(session: Session | None, body: str) -> str:
    instruction = (
        f'<div id="instruction">Instruction: <span>{_esc(session.instruction)}</span></div>'
        if session
        else ""
    )
    return f"<!DOCTYPE html><html><head><title>WebShop</title></head><body>{instruction}{body}</body></html>"


def _link(href: str, label: str) -> str:
    return f'<a href="{_esc(href)}">{_esc(label)}</a>'


class Shop:
    """Catalogue, index and sessions; the route handlers are its methods."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self.index = SearchIndex(catalog.products)
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self.started = time.time()

    # ------------------------------------------------------------------ helpers
    def _session(self, request: Request) -> Session | Response:
        sid = request.path_params["sid"]
        session = self.sessions.get(sid)
        if session is None:
            body = "<h2>Unknown session</h2><p>This shopping session does not exist (any more).</p>"
            return HTMLResponse(
                _page(None, body), status_code=404, headers={"X-Shop-Error": "unknown-session"}
            )
        self.sessions.move_to_end(sid)
        if session.purchase is not None:
            return HTMLResponse(self._done_html(session), headers={"X-Shop-Done": "1"})
        return session

    @staticmethod
    def _options_of(params: Any, product: Product) -> dict[str, str]:
        chosen = {}
        for name, values in product.options.items():
            value = params.get(f"opt_{name}")
            if isinstance(value, list):
                value = value[0] if value else None
            if value in values:
                chosen[name] = value
        return chosen

    @staticmethod
    def _query(params: Any) -> tuple[str, int]:
        query = str(params.get("q", ""))[:MAX_QUERY_CHARS]
        try:
            page = max(1, int(params.get("page", 1)))
        except ValueError:
            page = 1
        return query, page

    def _nav(self, sid: str, prev_href: str | None) -> str:
        links = [_link(f"/s/{sid}", "Back to Search")]
        if prev_href:
            links.append(_link(prev_href, "< Prev"))
        return f'<div class="nav">{" ".join(links)}</div>'

    # ------------------------------------------------------------------ pages
    async def search_page(self, request: Request) -> Response:
        session = self._session(request)
        if isinstance(session, Response):
            return session
        sid = request.path_params["sid"]
        form = (
            f'<form method="get" action="/s/{_esc(sid)}/search">'
            '<input type="text" name="q" placeholder="search keywords"><button type="submit">Search</button></form>'
        )
        return HTMLResponse(_page(session, form))

    async def results(self, request: Request) -> Response:
        session = self._session(request)
        if isinstance(session, Response):
            return session
        sid = request.path_params["sid"]
        query, page = self._query(request.query_params)
        asins = self.index.search(query)
        pages = max(1, -(-len(asins) // RESULTS_PER_PAGE))
        page = min(page, pages)
        shown = asins[(page - 1) * RESULTS_PER_PAGE : page * RESULTS_PER_PAGE]
        parts = [
            self._nav(sid, None),
            f'<p class="query">Results for: {_esc(query)}</p>',
            f"<p>Page {page} (Total results: {len(asins)})</p>",
        ]
        paging = []
        if page > 1:
            paging.append(_link(f"/s/{sid}/search?" + urlencode({"q": query, "page": page - 1}), "< Prev"))
        if page < pages:
            paging.append(_link(f"/s/{sid}/search?" + urlencode({"q": query, "page": page + 1}), "Next >"))
        parts.append(f'<div class="paging">{" ".join(paging)}</div>')
        items = []
        for asin in shown:
            product = self.catalog.by_asin[asin]
            href = f"/s/{sid}/item/{asin}?" + urlencode({"q": query, "page": page})
            items.append(
                f'<li class="result">{_link(href, asin)}<div class="title">{_esc(product.title)}</div>'
                f'<div class="price">${product.price:.2f}</div></li>'
            )
        if not items:
            parts.append("<p>No products match your search. Go back and try other keywords.</p>")
        parts.append(f'<ul class="results">{"".join(items)}</ul>')
        return HTMLResponse(_page(session, "".join(parts)))

    def _item_context(self, request: Request) -> tuple[Session, Product, str, int, dict[str, str]] | Response:
        session = self._session(request)
        if isinstance(session, Response):
            return session
        product = self.catalog.by_asin.get(request.path_params["asin"])
        if product is None:
            return HTMLResponse(_page(session, "<h2>No such product</h2>"), status_code=404)
        query, page = self._query(request.query_params)
        return session, product, query, page, self._options_of(request.query_params, product)

    def _item_href(
        self, sid: str, product: Product, query: str, page: int, chosen: dict[str, str], sub: str = ""
    ) -> str:
        params = {"q": query, "page": page, **{f"opt_{k}": v for k, v in chosen.items()}}
        return f"/s/{sid}/item/{product.asin}{'/' + sub if sub else ''}?" + urlencode(params)

    async def item(self, request: Request) -> Response:
        context = self._item_context(request)
        if isinstance(context, Response):
            return context
        session, product, query, page, chosen = context
        sid = request.path_params["sid"]
        results_href = f"/s/{sid}/search?" + urlencode({"q": query, "page": page})
        parts = [
            self._nav(sid, results_href),
            f'<h2 class="title">{_esc(product.title)}</h2>',
            f'<div class="price">Price: ${product.price:.2f}</div>',
            f'<div class="rating">Rating: {product.rating:.1f} out of 5</div>',
        ]
        for name, values in product.options.items():
            links = []
            for value in values:
                href = self._item_href(sid, product, query, page, {**chosen, name: value})
                mark = " (selected)" if chosen.get(name) == value else ""
                links.append(f"{_link(href, value)}{mark}")
            parts.append(f'<div class="option">{_esc(name)}: {" ".join(links)}</div>')
        subs = " ".join(
            _link(self._item_href(sid, product, query, page, chosen, sub), sub.title()) for sub in SUB_PAGES
        )
        parts.append(f'<div class="subpages">{subs}</div>')
        hidden = "".join(
            f'<input type="hidden" name="opt_{_esc(k)}" value="{_esc(v)}">' for k, v in chosen.items()
        )
        parts.append(
            f'<form method="post" action="/s/{_esc(sid)}/buy/{product.asin}">{hidden}'
            '<button type="submit">Buy Now</button></form>'
        )
        return HTMLResponse(_page(session, "".join(parts)))

    async def sub_page(self, request: Request) -> Response:
        context = self._item_context(request)
        if isinstance(context, Response):
            return context
        session, product, query, page, chosen = context
        sub = request.path_params["sub"]
        if sub not in SUB_PAGES:
            return HTMLResponse(_page(session, "<h2>No such page</h2>"), status_code=404)
        sid = request.path_params["sid"]
        parts = [
            self._nav(sid, self._item_href(sid, product, query, page, chosen)),
            f"<h3>{sub.title()}</h3>",
        ]
        if sub == "description":
            parts.append(f"<p>{_esc(product.description)}</p>")
        elif sub == "features":
            parts.append("<ul>" + "".join(f"<li>{_esc(f)}</li>" for f in product.features) + "</ul>")
        else:
            parts.append(
                "<ul>"
                + "".join(
                    f"<li>Rating: {r['rating']} out of 5<p>{_esc(r['text'])}</p></li>"
                    for r in product.reviews
                )
                + "</ul>"
            )
        return HTMLResponse(_page(session, "".join(parts)))

    async def buy(self, request: Request) -> Response:
        session = self._session(request)
        if isinstance(session, Response):
            return session
        product = self.catalog.by_asin.get(request.path_params["asin"])
        if product is None:
            return HTMLResponse(_page(session, "<h2>No such product</h2>"), status_code=404)
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        chosen = self._options_of(form, product)
        purchase: dict[str, Any] = {"asin": product.asin, "options": chosen, "price": product.price}
        if session.goal is not None:
            parts = reward_for_purchase(session.goal, product, chosen, self.catalog.noun_lexicon)
            purchase["reward"] = parts.reward
        session.purchase = purchase
        return HTMLResponse(self._done_html(session), headers={"X-Shop-Done": "1"})

    def _done_html(self, session: Session) -> str:
        purchase = session.purchase or {}
        product = self.catalog.by_asin[purchase["asin"]]
        options = ", ".join(f"{k}: {v}" for k, v in purchase["options"].items()) or "none"
        parts = [
            "<h2>Thank you for shopping with us!</h2>",
            f"<p>You bought: {_esc(product.title)} (${product.price:.2f})</p>",
            f"<p>Options: {_esc(options)}</p>",
        ]
        if "reward" in purchase:
            parts.append(f"<p>Your score (min 0.0, max 1.0): {purchase['reward']:.2f}</p>")
        payload = json.dumps(purchase).replace("</", "<\\/")
        parts.append(f'<script type="application/json" id="purchase">{payload}</script>')
        return _page(session, "".join(parts))

    # ------------------------------------------------------------------ API
    async def create_session(self, request: Request) -> Response:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return JSONResponse({"error": "body must be JSON"}, status_code=400)
        if not isinstance(body, dict) or not isinstance(body.get("instruction"), str):
            return JSONResponse({"error": 'body needs "instruction" (string)'}, status_code=400)
        goal = Goal.from_dict(body["goal"]) if isinstance(body.get("goal"), dict) else None
        sid = uuid.uuid4().hex
        self.sessions[sid] = Session(instruction=body["instruction"], goal=goal)
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        return JSONResponse({"session_id": sid})

    async def fork_session(self, request: Request) -> Response:
        session = self.sessions.get(request.path_params["sid"])
        if session is None:
            return JSONResponse({"error": "unknown session"}, status_code=404, headers={"X-Shop-Error": "unknown-session"})
        sid = uuid.uuid4().hex
        purchase = dict(session.purchase) if session.purchase is not None else None
        self.sessions[sid] = Session(instruction=session.instruction, goal=session.goal, purchase=purchase)
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        return JSONResponse({"session_id": sid})

    async def delete_session(self, request: Request) -> Response:
        existed = self.sessions.pop(request.path_params["sid"], None) is not None
        return JSONResponse({"deleted": existed})

    async def health(self, request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ok",
                "pid": os.getpid(),
                "fingerprint": self.catalog.fingerprint,
                "products": len(self.catalog.products),
                "sessions": len(self.sessions),
                "uptime_s": time.time() - self.started,
            }
        )


def create_app(catalog: Catalog) -> Starlette:
    shop = Shop(catalog)
    routes = [
        Route("/api/health", shop.health),
        Route("/api/sessions", shop.create_session, methods=["POST"]),
        Route("/api/sessions/{sid}", shop.delete_session, methods=["DELETE"]),
        Route("/api/sessions/{sid}/fork", shop.fork_session, methods=["POST"]),
        Route("/s/{sid}", shop.search_page),
        Route("/s/{sid}/search", shop.results),
        Route("/s/{sid}/item/{asin}", shop.item),
        Route("/s/{sid}/item/{asin}/{sub}", shop.sub_page),
        Route("/s/{sid}/buy/{asin}", shop.buy, methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.shop = shop
    return app


def _watch_parent(parent_pid: int) -> None:
    """Exit when the process that started us is gone, so a crashed env leaks no server."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(0)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="agentrl WebShop-style shop server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-products", type=int, default=1500)
    parser.add_argument(
        "--data-dir", default="auto", help='folder with webshop/, "auto" (the shipped files) or "builtin"'
    )
    parser.add_argument("--watch-parent", action="store_true", help="exit when the parent process dies")
    args = parser.parse_args(argv)

    data_dir = "builtin" if args.data_dir == "none" else args.data_dir
    catalog = Catalog(seed=args.seed, n_products=args.n_products, data_dir=data_dir)
    app = create_app(catalog)
    sock = listen_socket(args.host, args.port)
    if args.watch_parent:
        threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    ready = {"port": sock.getsockname()[1], "pid": os.getpid(), "fingerprint": catalog.fingerprint}
    print("READY " + json.dumps(ready), flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
