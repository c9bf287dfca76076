"""local-gaia (``agentrl/GAIA-v0``): GAIA-shaped tasks over the fictional wiki, as an RL env.

Tools: ``search`` / ``open`` over the same generated wiki the search env uses (BM25 by default),
``read_file`` (and ``query_sqlite`` when the attachment is a SQLite database) for the task's
attachment, and ``python``, a stateful interpreter in a sandbox (Docker or bubblewrap). Answers
come after ``FINAL ANSWER:`` (``<answer>`` works too) and are scored by GAIA's official rules.

Attachments are written on first use under ``agentrl.paths.cache_dir()/local-gaia/...`` from the
task's document, so the same seed gives the same files. Splits: ``test`` is the reported suite
(150 tasks, levels 50/70/30); ``dev`` and ``train`` are drawn with other seeds for training.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentrl.env import Task
from agentrl.envs.gaia.attachments import TableDoc, write_attachment
from agentrl.envs.gaia.base import GaiaBaseEnv
from agentrl.envs.gaia.tasks import DEFAULT_COUNTS, SPLIT_SEEDS, generate_tasks
from agentrl.errors import ConfigError
from agentrl.paths import cache_dir
from agentrl.tools.base import Tool

GENERATOR_VERSION = 1  # bump when templates change, so cached attachments are not reused


class LocalGaiaEnv(GaiaBaseEnv):
    """GAIA-style tasks over the shared fictional wiki.

    Args:
        split: ``train``, ``dev`` or ``test`` (the 150-task suite).
        seed: task-generation seed (added to the split's own seed).
        wiki_seed: seed of the wiki (0 = the search env's default wiki).
        n_entities: wiki size (2000 = the search env's default).
        retriever: ``bm25`` or ``dense`` for the search tool.
        python: offer the sandboxed ``python`` tool.
        sandbox_backend: ``auto``, ``docker`` or ``bwrap`` for the python tool.
        python_timeout_s: time limit of one python call.
        levels: keep only these levels (``2`` or ``[1, 2]``; suite option ``local-gaia:levels=2``).
    """

    def __init__(
        self,
        *,
        split: str = "test",
        render_mode: str | None = None,
        seed: int = 0,
        wiki_seed: int = 0,
        n_entities: int = 2000,
        retriever: str = "bm25",
        python: bool = True,
        sandbox_backend: str = "auto",
        python_timeout_s: float = 10.0,
        levels: int | Sequence[int] | None = None,
    ):
        super().__init__(split=split, render_mode=render_mode)
        if retriever not in ("bm25", "dense"):
            raise ConfigError("retriever", f"unknown retriever {retriever!r}", "use 'bm25' or 'dense'")
        if isinstance(levels, int):
            levels = [levels]
        if levels is not None and not set(levels) <= {1, 2, 3}:
            raise ConfigError(
                "levels", f"levels must be among 1, 2, 3; got {list(levels)}", "e.g. levels=[1, 2]"
            )
        self.seed = seed
        self.wiki_seed = wiki_seed
        self.n_entities = n_entities
        self.retriever_kind = retriever
        self.python = python
        self.sandbox_backend = sandbox_backend
        self.python_timeout_s = python_timeout_s
        self.levels = set(levels) if levels is not None else None

    @property
    def files_dir(self) -> Path:
        tag = f"v{GENERATOR_VERSION}-w{self.wiki_seed}-n{self.n_entities}-s{self.seed}"
        return cache_dir() / "local-gaia" / tag

    def load_tasks(self, split: str) -> Sequence[Task]:
        from agentrl.envs.search.wiki import generate_wiki

        wiki = generate_wiki(self.wiki_seed, self.n_entities)
        # train/dev never repeat a test question (questions with attachments differ by their file)
        exclude = (
            {t.question for t in self.tasks("test") if not t.payload["file_name"]}
            if split != "test"
            else set()
        )
        tasks = generate_tasks(
            wiki, split, DEFAULT_COUNTS[split], SPLIT_SEEDS[split] + 1000 * self.seed, exclude
        )
        return [t for t in tasks if self.levels is None or t.level in self.levels]

    def attachment_path(self, task: Task) -> Path | None:
        name = task.payload.get("file_name")
        document = task.payload.get("document")
        if not name or document is None:
            return None
        path = self.files_dir / task.split / name
        if not path.is_file():
            write_attachment(TableDoc.from_dict(document), task.payload["file_format"], path)
        return path

    def make_tools(self) -> list[Tool]:
        from agentrl.envs.search.env import wiki_retriever
        from agentrl.tools.search import search_tools

        tools = search_tools(
            wiki_retriever(self.wiki_seed, self.n_entities, self.retriever_kind), default_k=5
        )
        return tools + super().make_tools()  # file reader (+ python, when enabled)
