"""Real GAIA from a local copy in the benchmark's own layout.

GAIA ships one folder per split (``2023/validation/``, ``2023/test/``), each with a
``metadata.jsonl`` (one JSON object per line: ``task_id``, ``Question``, ``Level``,
``Final answer``, ``file_name``, ``Annotator Metadata``) and the attachments beside it. Point the env
at the folder that holds the split folders (or at one split folder). ``Annotator Metadata`` (the
annotators' solution steps) stays out of everything the agent sees; it is kept only in the task
payload for reports. Test-split answers are ``?`` upstream: such tasks load, but scoring them is
meaningless, so the eval runner refuses them.

GAIA as people download it: attachments may be absent, or be Git-LFS pointer files (a clone without
``git lfs pull``). Such tasks still load, marked with ``payload["attachment_problem"]`` (``missing`` |
``lfs_pointer``); reading the file then gives the model an observation that says so, and
``skip_missing_attachments=true`` leaves them out instead; the eval report lists them all.

No data is downloaded: the data folder comes from the ``data_dir`` argument or ``AGENTRL_GAIA_DIR``;
``data_dir=fixture`` selects the small bundled test fixture (only when asked for).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from agentrl.env import Task
from agentrl.envs.gaia.base import GaiaBaseEnv
from agentrl.errors import ConfigError, EnvError
from agentrl.tools.files import is_lfs_pointer

REQUIRED_FIELDS = ("task_id", "Question", "Level", "Final answer")
#: The bundled 6-task fixture in GAIA's layout, used only with ``data_dir=fixture``.
FIXTURE_DIR = Path(__file__).resolve().parent / "data" / "fixture" / "2023"  # shipped as package data
WHERE_DATA_GOES = (
    "download GAIA (huggingface.co/datasets/gaia-benchmark/GAIA, gated; `git lfs pull` for the "
    "attachments) and pass data_dir=PATH (e.g. --suite gaia --suite-option data_dir=~/GAIA/2023) or set "
    "AGENTRL_GAIA_DIR to the folder holding validation/metadata.jsonl; data_dir=fixture (suite "
    "gaia-fixture) runs the 6-task test fixture"
)


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """The GAIA folder: the argument (``~`` expanded; ``fixture``: the bundled fixture), else
    ``AGENTRL_GAIA_DIR``; an error naming both when neither is given or the folder is absent."""
    if data_dir is not None and str(data_dir) == "fixture":
        return FIXTURE_DIR
    field = "data_dir" if data_dir else "AGENTRL_GAIA_DIR"
    chosen = data_dir or os.environ.get("AGENTRL_GAIA_DIR")
    if not chosen:
        raise ConfigError("data_dir", "no GAIA data folder was given", WHERE_DATA_GOES)
    path = Path(chosen).expanduser()
    if not path.is_dir():
        raise ConfigError(field, f"GAIA folder {path} does not exist", WHERE_DATA_GOES)
    return path


def attachment_problem(path: Path) -> str | None:
    """``missing``, ``lfs_pointer`` (a Git-LFS pointer file, not the content) or ``None`` (usable)."""
    if not path.is_file():
        return "missing"
    return "lfs_pointer" if is_lfs_pointer(path) else None


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
        payload = {
            "file_name": file_name,
            "file_path": str(file_path) if file_path else "",
            "annotator_metadata": record.get("Annotator Metadata", {}),
        }
        if file_path is not None and (problem := attachment_problem(file_path)):
            payload["attachment_problem"] = problem
        tasks.append(
            Task(
                id=str(record["task_id"]),
                question=str(record["Question"]),
                answer=str(record["Final answer"]),
                split=split,
                level=int(record["Level"]),
                payload=payload,
            )
        )
    return tasks


class GaiaRealEnv(GaiaBaseEnv):
    """GAIA's own tasks with the file reader and the sandboxed python tool (no web access offline).

    Args:
        split: ``validation`` (answers public) or ``test`` (answers are ``?``).
        data_dir: the GAIA folder (``~`` expands); default ``AGENTRL_GAIA_DIR``; ``fixture`` for the
            small bundled fixture. Neither given: a ConfigError that says where the data goes.
        level: keep only tasks of this level (1-3).
        skip_missing_attachments: leave out tasks whose attachment is absent or an LFS pointer
            (default: keep them, marked; reading the file tells the model it is unavailable).
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
        skip_missing_attachments: bool = False,
    ):
        super().__init__(split=split, render_mode=render_mode)
        self.skip_missing_attachments = skip_missing_attachments
        self.python = python
        self.sandbox_backend = sandbox_backend
        self.python_timeout_s = python_timeout_s
        self.data_dir = resolve_data_dir(data_dir)
        if level is not None and level not in (1, 2, 3):
            raise ConfigError("level", f"GAIA levels are 1, 2 and 3, got {level!r}", "pass level=1, 2 or 3")
        self.level = level

    def load_tasks(self, split: str) -> Sequence[Task]:
        tasks = load_gaia_split(self.data_dir, split)
        return [
            t
            for t in tasks
            if (self.level is None or t.level == self.level)
            and not (self.skip_missing_attachments and t.payload.get("attachment_problem"))
        ]
