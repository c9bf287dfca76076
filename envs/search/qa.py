"""Real open-domain QA sets (the Search-R1 / DeepResearcher / IGPO test samples) as tasks.

Files: ``data/search_qa/<name>.jsonl`` shipped with this package (checked against their ``SHA256SUMS``;
``AGENTRL_DATA`` overrides, see :mod:`agentrl.paths`), one JSON object a line with
``id``, ``source``, ``question`` and ``golden_answers`` (a list of accepted answers).
Without a retriever the env is closed-book (no tools: the model answers from memory); with
``retriever_url`` the ``search``/``open`` tools query a Search-R1 retrieval server (e.g. over
Wikipedia). The rows are test samples, so the env has a single split, ``test``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentrl.env import Task
from agentrl.envs.search.env import TOOL_PROMPT, RetrievalQAEnv, build_retriever, check_reward
from agentrl.errors import EnvError
from agentrl.paths import benchmark_dir, check_file

QA_FILES: dict[str, str] = {
    "nq": "nq.jsonl",
    "triviaqa": "triviaqa.jsonl",
    "popqa": "popqa.jsonl",
    "hotpotqa": "hotpotqa.jsonl",
    "2wiki": "2wikimultihopqa.jsonl",
    "musique": "musique.jsonl",
    "bamboogle": "bamboogle.jsonl",
}

CLOSED_BOOK_PROMPT = """\
Answer the question from your own knowledge. Reply with only the short answer: <answer>...</answer>"""


@dataclass(frozen=True)
class QARecord:
    id: str
    source: str
    question: str
    golden_answers: tuple[str, ...]


def qa_dir(data_dir: str | Path | None = None) -> Path:
    """The folder holding the QA files (``data_dir``, else the shipped ``data/search_qa``)."""
    folder = Path(data_dir) if data_dir is not None else benchmark_dir("search_qa")
    if not folder.is_dir():
        raise EnvError(f"no QA folder at {folder}; pass data_dir=<folder with *.jsonl> or leave it unset")
    return folder


def load_qa(name: str, data_dir: str | Path | None = None) -> list[QARecord]:
    """Load one QA set by name (a key of :data:`QA_FILES`); bad rows fail naming file and line."""
    if name not in QA_FILES:
        raise EnvError(f"unknown QA set {name!r}; choose from {', '.join(QA_FILES)}")
    path = qa_dir(data_dir) / QA_FILES[name]
    if not path.is_file():
        raise EnvError(f"QA file {path} is missing")
    check_file(path)  # against the SHA256SUMS beside it, when the folder has one
    return list(_read(str(path)))


@functools.lru_cache(maxsize=16)
def _read(path: str) -> tuple[QARecord, ...]:
    records = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                answers = row["golden_answers"]
                if isinstance(answers, str):
                    answers = [answers]
                if not isinstance(answers, list) or not answers:
                    raise ValueError("golden_answers must be a non-empty list")
                records.append(
                    QARecord(
                        str(row["id"]), str(row["source"]), str(row["question"]), tuple(map(str, answers))
                    )
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise EnvError(
                    f"{path}:{line_no}: bad QA row ({exc}); need id, source, question, golden_answers"
                ) from exc
    return tuple(records)


class SearchQAEnv(RetrievalQAEnv):
    """Real QA sets; closed-book by default, search tools over a remote retriever when configured."""

    splits = ("test",)

    def __init__(
        self,
        *,
        split: str = "test",
        render_mode: str | None = None,
        sources: Sequence[str] | str | None = None,
        data_dir: str | None = None,
        retriever: str | None = None,
        retriever_url: str | None = None,
        reward: str = "em",
        default_k: int = 3,
        max_k: int = 10,
        timeout: float = 10.0,
    ):
        """Args:
        sources: QA sets to load (keys of QA_FILES); default: every file present.
        data_dir: folder with the jsonl files; default: the shipped ``data/search_qa``.
        retriever: "none" (closed-book) or "remote" (needs ``retriever_url``); default: "remote"
            when ``retriever_url`` is given, else "none".
        retriever_url: endpoint of a Search-R1 retrieval server, e.g. http://127.0.0.1:8000/retrieve.
        reward: "em" or "f1"; both are always reported in ``info["metrics"]``.
        """
        super().__init__(split=split, render_mode=render_mode)
        if retriever not in (None, "none", "remote"):
            raise EnvError(
                f"SearchQA has no local corpus: retriever must be 'none' or 'remote', got {retriever!r}"
            )
        check_reward(reward)
        folder = qa_dir(data_dir)  # fail now, not at the first reset, when the data is missing
        if sources is None:
            self.sources = [name for name, file in QA_FILES.items() if (folder / file).is_file()]
            if not self.sources:
                raise EnvError(f"no QA files ({', '.join(QA_FILES.values())}) in {folder}")
        else:
            self.sources = [sources] if isinstance(sources, str) else list(sources)
        unknown = [s for s in self.sources if s not in QA_FILES]
        if unknown:
            raise EnvError(f"unknown QA source(s) {unknown}; choose from {', '.join(QA_FILES)}")
        missing = [QA_FILES[s] for s in self.sources if not (folder / QA_FILES[s]).is_file()]
        if missing:
            raise EnvError(f"QA file(s) {', '.join(missing)} missing in {folder}")
        self.data_dir = data_dir
        built = build_retriever(retriever, retriever_url=retriever_url, local=None, timeout=timeout)
        self._setup_retrieval(reward, default_k, max_k, built)

    @property
    def system_prompt(self) -> str:  # type: ignore[override]
        return CLOSED_BOOK_PROMPT if self.retriever is None else TOOL_PROMPT

    def load_tasks(self, split: str) -> Sequence[Task]:
        return [
            Task(
                id=r.id,
                question=r.question,
                answer=list(r.golden_answers),
                split=split,
                level=r.source,
                payload={"source": r.source},
            )
            for source in self.sources
            for r in load_qa(source, self.data_dir)
        ]
