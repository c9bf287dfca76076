"""Real GAIA from a local copy in the benchmark's own layout.

GAIA ships one folder per split (``2023/validation/``, ``2023/test/``), each with a
``metadata.jsonl`` (one JSON object per line: ``task_id``, ``Question``, ``Level``,
``Final answer``, ``file_name``, ``Annotator Metadata``) and the attachments beside it. Point the env
at the folder that holds the split folders (or at one split folder). ``Annotator Metadata`` (the
annotators' solution steps) stays out of everything the agent sees; it is kept only in the task
payload for reports. Test-split answers are ``?`` upstream: such tasks load, but scoring them is
meaningless, so the eval runner refuses them.

No data is downloaded: the data folder comes from the ``data_dir`` argument or ``AGENTRL_GAIA_DIR``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from agentrl.env import Task
from agentrl.envs.gaia.base import GaiaBaseEnv
from agentrl.errors import ConfigError, EnvError

REQUIRED_FIELDS = ("task_id", "Question", "Level", "Final answer")
#: Used when neither ``data_dir`` nor AGENTRL_GAIA_DIR is given: a 6-task fixture in GAIA's layout
#: (made by ``data/fixture/make_fixture.py``, shipped as package data; GAIA itself is gated).
FIXTURE_DIR = Path(__file__).resolve().parent / "data" / "fixture" / "2023"


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """The GAIA folder: the argument, else ``AGENTRL_GAIA_DIR``, else the bundled test fixture."""
    chosen = data_dir or os.environ.get("AGENTRL_GAIA_DIR")
    path = Path(chosen) if chosen else FIXTURE_DIR
    if not path.is_dir():
        raise ConfigError(
            "data_dir",
            f"GAIA folder {path} does not exist",
            "download GAIA yourself and pass data_dir=... (or set AGENTRL_GAIA_DIR) to the folder holding "
            "validation/metadata.jsonl",
        )
    return path


def metadata_file(data_dir: Path, split: str) -> Path:
    """``<dir>/<split>/metadata.jsonl``, or ``<dir>/metadata.jsonl`` when the folder is one split."""
    for candidate in (data_dir / split / "metadata.jsonl", data_dir / "metadata.jsonl"):
        if candidate.is_file():
            return candidate
    raise ConfigError(
        "data_dir",
        f"no metadata.jsonl for split {split!r} under {data_dir}",
        f"point data_dir at GAIA's year folder (with {split}/metadata.jsonl) or at one split folder",
    )


def load_gaia_split(data_dir: str | Path, split: str) -> list[Task]:
    """Read one split's ``metadata.jsonl`` into tasks (attachments resolved beside it)."""
    path = metadata_file(Path(data_dir), split)
    tasks = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EnvError(f"{path}:{line_no} is not valid JSON ({exc.msg})") from exc
        missing = [f for f in REQUIRED_FIELDS if f not in record]
        if missing:
            raise EnvError(f"{path}:{line_no} lacks GAIA field(s) {', '.join(missing)}")
        file_name = record.get("file_name") or ""
        file_path = path.parent / file_name if file_name else None
        if file_path is not None and not file_path.is_file():
            raise EnvError(f"{path}:{line_no}: attachment {file_name!r} is not beside metadata.jsonl")
        tasks.append(
            Task(
                id=str(record["task_id"]),
                question=str(record["Question"]),
                answer=str(record["Final answer"]),
                split=split,
                level=int(record["Level"]),
                payload={
                    "file_name": file_name,
                    "file_path": str(file_path) if file_path else "",
                    "annotator_metadata": record.get("Annotator Metadata", {}),
                },
            )
        )
    return tasks


class GaiaRealEnv(GaiaBaseEnv):
    """GAIA's own tasks with the file reader and the sandboxed python tool (no web access offline).

    Args:
        split: ``validation`` (answers public) or ``test`` (answers are ``?``).
        data_dir: the GAIA folder; default ``AGENTRL_GAIA_DIR``, else the small bundled fixture.
        level: keep only tasks of this level (1-3).
        python: offer the sandboxed ``python`` tool.
        sandbox_backend: ``auto``, ``docker`` or ``bwrap``.
        python_timeout_s: time limit of one python call.
    """

    splits = ("validation", "test")

    def __init__(
        self,
        *,
        split: str = "validation",
        render_mode: str | None = None,
        data_dir: str | None = None,
        level: int | None = None,
        python: bool = True,
        sandbox_backend: str = "auto",
        python_timeout_s: float = 10.0,
    ):
        super().__init__(split=split, render_mode=render_mode)
        self.python = python
        self.sandbox_backend = sandbox_backend
        self.python_timeout_s = python_timeout_s
        self.data_dir = resolve_data_dir(data_dir)
        if level is not None and level not in (1, 2, 3):
            raise ConfigError("level", f"GAIA levels are 1, 2 and 3, got {level!r}", "pass level=1, 2 or 3")
        self.level = level

    def load_tasks(self, split: str) -> Sequence[Task]:
        tasks = load_gaia_split(self.data_dir, split)
        return [t for t in tasks if self.level is None or t.level == self.level]
