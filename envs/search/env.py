"""Search environment over the fictional wiki: ``search``/``open`` tools, answer with ``<answer>``.

Task payload (``Task.payload``): ``hops``, ``start`` (name in the question), ``start_id``,
``relations`` (the chain), ``path`` (entity ids), ``doc_ids`` (pages that hold the chain),
``wiki_seed``. ``Task.answer`` is the list of gold aliases; ``Task.level`` the number of hops.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from agentrl.env import Score, Task, TextEnv
from agentrl.envs.search.questions import HOP_MIXES, generate_questions
from agentrl.envs.search.wiki import generate_wiki
from agentrl.errors import ConfigError, EnvError
from agentrl.scorers.qa import qa_scores
from agentrl.tools.base import Tool
from agentrl.tools.search import Doc, RemoteRetriever, Retriever, make_retriever, search_tools

RETRIEVER_URL_HELP = (
    "pass retriever_url='http://HOST:PORT/retrieve', the endpoint of a Search-R1-compatible retrieval "
    "server, e.g. agentrl.make(id, retriever_url=...); `python -m agentrl.envs.search.server` serves the wiki"
)

TOOL_PROMPT = """\
Answer the question by searching a knowledge base. Do not guess: look the facts up.
Tools:
- search(query, k): ranked pages with their doc ids and a snippet.
- open(doc_id): the full text of one page.
Call a tool like this:
<tool_call>{"name": "search", "arguments": {"query": "Alvar Quenton", "k": 3}}</tool_call>
Questions may need several hops (e.g. find a company's founder, then the founder's birthplace).
When you know the answer, reply with only the short answer: <answer>...</answer>"""


@functools.lru_cache(maxsize=4)
def wiki_retriever(wiki_seed: int, n_entities: int, kind: str) -> Retriever:
    """A local retriever over ``generate_wiki(wiki_seed, n_entities)``, built once per process."""
    from agentrl.paths import cache_dir

    wiki = generate_wiki(wiki_seed, n_entities)
    docs = [Doc(doc_id, title, text) for doc_id, title, text in wiki.iter_passages()]
    extra = {"cache_dir": cache_dir()} if kind == "dense" else {}
    return make_retriever(kind, docs, **extra)


def build_retriever(
    kind: str | None, *, retriever_url: str | None, local: tuple[int, int] | None, timeout: float = 10.0
) -> Retriever | None:
    """Validate the retriever kwargs of a search env and build its retriever (None: closed-book).

    ``kind=None`` picks "remote" when a URL is given, else "bm25" (local corpus) or "none".
    """
    if kind is None:
        kind = "remote" if retriever_url else "bm25" if local is not None else "none"
    if retriever_url and kind != "remote":
        raise EnvError(f"retriever_url is only used with retriever='remote', not {kind!r}; drop one of them")
    if kind == "none":
        return None
    if kind == "remote":
        if not retriever_url:
            raise EnvError(f"retriever='remote' needs a server URL: {RETRIEVER_URL_HELP}")
        try:
            return RemoteRetriever(retriever_url, timeout=timeout)
        except ConfigError as exc:
            raise EnvError(f"bad retriever_url: {exc}") from exc
    if kind not in ("bm25", "dense"):
        raise EnvError(f"unknown retriever {kind!r}; use 'bm25', 'dense' or 'remote' (with retriever_url)")
    if local is None:
        raise EnvError(
            f"retriever={kind!r} needs a local corpus and this env has none; use 'none' or 'remote'"
        )
    return wiki_retriever(local[0], local[1], kind)


def check_reward(reward: str) -> str:
    if reward not in ("em", "f1"):
        raise EnvError(f"reward must be 'em' (exact match) or 'f1' (token F1), got {reward!r}")
    return reward


class RetrievalQAEnv(TextEnv):
    """What every search env shares: QA scoring (EM and F1 always reported, one of them the
    reward), the ``search``/``open`` tools over ``self.retriever`` (none: closed-book), and a remote
    retriever's HTTP client per env: its own after a fork, closed with the env."""

    success_metric = "em"
    # the state is the episode record (a local retriever is read-only and shared, a remote one gets
    # a client of its own): a fork copies it
    fork_method = "copy"
    retriever: Retriever | None = None
    reward_kind = "em"
    default_k, max_k = 3, 10

    def _setup_retrieval(self, reward: str, default_k: int, max_k: int, retriever: Retriever | None) -> None:
        self.reward_kind = check_reward(reward)
        self.default_k, self.max_k = default_k, max_k
        self.retriever = retriever

    def make_tools(self) -> list[Tool]:
        if self.retriever is None:
            return []
        return search_tools(self.retriever, default_k=self.default_k, max_k=self.max_k)

    def score(self, answer: str | None, task: Task) -> Score:
        metrics = qa_scores(answer, task.answer)
        return Score(reward=metrics[self.reward_kind], metrics=metrics)

    def fork_detach(self) -> None:
        if isinstance(self.retriever, RemoteRetriever):
            self.retriever = None  # the parent's HTTP client: the fork opens its own (fork_attach)

    def fork_attach(self, parent: TextEnv) -> None:
        retriever = getattr(parent, "retriever", None)
        if isinstance(retriever, RemoteRetriever):
            self.retriever = RemoteRetriever(retriever.url, timeout=retriever._client.timeout.read or 10.0)

    def on_close(self) -> None:
        if isinstance(self.retriever, RemoteRetriever):
            self.retriever.close()


class SearchEnv(RetrievalQAEnv):
    """Questions about a generated fictional encyclopedia, answered through search and open."""

    system_prompt = TOOL_PROMPT
    splits = ("train", "dev", "test")

    def __init__(
        self,
        *,
        split: str = "train",
        render_mode: str | None = None,
        wiki_seed: int = 0,
        n_entities: int = 2000,
        n_questions: int = 3000,
        hops: str = "mix",
        retriever: str | None = None,
        retriever_url: str | None = None,
        reward: str = "em",
        default_k: int = 3,
        max_k: int = 10,
        timeout: float = 10.0,
    ):
        """Args:
        split: train, dev or test (disjoint by question).
        wiki_seed: seed of the generated wiki (and its questions).
        n_entities: wiki size in pages (>= 20).
        n_questions: questions generated over all splits (80/10/10).
        hops: "mix" (1-3 hops), "single" or "multi" (2-3 hops).
        retriever: "bm25", "dense" (MiniLM) or "remote" (needs ``retriever_url``); default: "remote"
            when ``retriever_url`` is given, else "bm25".
        retriever_url: a Search-R1 retrieval server serving this wiki (see envs/search/server.py).
        reward: "em" or "f1"; both are always reported in ``info["metrics"]``.
        default_k, max_k: default and largest ``k`` of the search tool.
        timeout: seconds per request to a remote retriever.
        """
        super().__init__(split=split, render_mode=render_mode)
        if hops not in HOP_MIXES:
            raise EnvError(f"hops must be one of {sorted(HOP_MIXES)}, got {hops!r}")
        if n_entities < 20:
            raise EnvError(f"n_entities must be >= 20, got {n_entities}")
        if not 1 <= default_k <= max_k:
            raise EnvError(f"need 1 <= default_k <= max_k, got default_k={default_k}, max_k={max_k}")
        self.wiki_seed, self.n_entities, self.n_questions, self.hops = (
            wiki_seed,
            n_entities,
            n_questions,
            hops,
        )
        self.wiki = generate_wiki(wiki_seed, n_entities)
        built = build_retriever(
            retriever, retriever_url=retriever_url, local=(wiki_seed, n_entities), timeout=timeout
        )
        if built is None:
            raise EnvError(
                "SearchEnv's questions need the search tools: use retriever 'bm25', 'dense' or 'remote'"
            )
        self._setup_retrieval(reward, default_k, max_k, built)

    def load_tasks(self, split: str) -> Sequence[Task]:
        questions = generate_questions(self.wiki_seed, self.n_entities, self.n_questions, self.hops)
        return [
            Task(
                id=q.id,
                question=q.text,
                answer=list(q.answers),
                split=q.split,
                level=q.hops,
                payload=q.payload(self.wiki),
            )
            for q in questions
            if q.split == split
        ]
