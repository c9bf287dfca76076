"""A Search-R1-compatible retrieval server over any local retriever (starlette + uvicorn).

``POST /retrieve`` with ``{"queries": [...], "topk": k, "return_scores": true}`` answers
``{"result": [[{"document": {"id": ..., "contents": "title\\ntext"}, "score": s}, ...], ...]}``
(without ``return_scores``: the documents themselves). This serves the fictional wiki to
remote rollout workers and is the real server the remote-retriever tests talk to.

    python -m agentrl.envs.search.server --port 8000 --n-entities 100000
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass
from typing import Any

from agentrl.serve.sockets import listen_socket
from agentrl.tools.search import Retriever


def make_app(retriever: Retriever, *, max_topk: int = 100) -> Any:
    """The starlette app serving ``retriever`` with the Search-R1 ``/retrieve`` protocol."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def retrieve(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "body must be JSON"}, status_code=400)
        queries = body.get("queries") if isinstance(body, dict) else None
        topk = body.get("topk", 3) if isinstance(body, dict) else 3
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            return JSONResponse({"error": "'queries' must be a list of strings"}, status_code=400)
        if not isinstance(topk, int) or not 1 <= topk <= max_topk:
            return JSONResponse({"error": f"'topk' must be an integer in 1..{max_topk}"}, status_code=400)
        with_scores = bool(body.get("return_scores", False))
        result = []
        for query in queries:
            hits = retriever.search(query, topk)
            docs = [{"id": h.doc_id, "contents": f"{h.title}\n{h.text}"} for h in hits]
            if with_scores:
                result.append([{"document": d, "score": h.score} for d, h in zip(docs, hits, strict=True)])
            else:
                result.append(docs)
        return JSONResponse({"result": result})

    return Starlette(routes=[Route("/retrieve", retrieve, methods=["POST"])])


@dataclass
class BackgroundServer:
    """A server running in a daemon thread; ``stop()`` shuts it down."""

    url: str
    _server: Any
    _thread: threading.Thread

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_background(retriever: Retriever, host: str = "127.0.0.1", port: int = 0) -> BackgroundServer:
    """Serve ``retriever`` in a background thread (``port=0``: any free port); returns when ready."""
    import uvicorn

    sock = listen_socket(host, port)
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(make_app(retriever), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the retrieval server did not start within 10 s")
        time.sleep(0.01)
    return BackgroundServer(f"http://{host}:{bound_port}/retrieve", server, thread)


def main(argv: list[str] | None = None) -> None:
    """Serve the fictional wiki (BM25 or dense) over HTTP."""
    import uvicorn

    from agentrl.envs.search.env import wiki_retriever

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--wiki-seed", type=int, default=0)
    parser.add_argument("--n-entities", type=int, default=2000)
    parser.add_argument("--retriever", choices=["bm25", "dense"], default="bm25")
    args = parser.parse_args(argv)
    retriever = wiki_retriever(args.wiki_seed, args.n_entities, args.retriever)
    config = uvicorn.Config(make_app(retriever), log_level="info", lifespan="off")
    uvicorn.Server(config).run(sockets=[listen_socket(args.host, args.port)])


if __name__ == "__main__":
    main()
