"""The documentation is tested like code: its generated parts are current, the site builds strictly,
and every command or Python snippet in the README and the guides runs.

Snippets: each ```` ```bash ```` / ```` ```python ```` block of the README and of ``docs/`` (except the
dated results pages, which record commands as they were run, and the generated references) is
executed, from a scratch folder with ``configs/`` linked in and the venv first on ``PATH``. A comment
on the line before a block says how, when it cannot run as it is:

- ``<!-- test: skip REASON -->``: not run (reported as skipped with the reason);
- ``<!-- test: covered TEST_ID ... -->``: a named test runs it (the test must exist);
- ``<!-- test: tiny -->``: each ``agentrl train`` line gets a one-block random model and CI-sized
  overrides (``TINY``), so the command and its config are what runs, not the 15-minute run;
- ``<!-- test: server="COMMAND" -->``: COMMAND (an ``agentrl serve``) runs beside the block;
- ``slow``, ``docker``, ``gpu``: the pytest markers of the same name.

In bash blocks a line ending in ``&`` starts a server: the next line runs once its ``--port`` answers.
Port 8000 is replaced by a free port everywhere in the block.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from processes import dies_with_tests

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
VENV_BIN = Path(sys.executable).parent
# pages whose snippets are handed over to their owners: tested once they carry test comments
UNMARKED_PAGES_OWNED_ELSEWHERE = ("docs/sandboxes.md", "docs/serving.md", "docs/vllm.md")
TINY = [
    "train.steps=1", "train.sft_warmup_steps=1", "train.sft_demos=2", "train.sft_batch_size=1",
    "train.micro_batch_size=1", "train.minibatch_size=2", "train.eval_episodes=1", "train.trainable_layers=0",
    "rollout.tasks_per_step=1", "rollout.group_size=2", "rollout.concurrency=2", "rollout.max_new_tokens=16",
    "train.num_threads=1",
]  # fmt: skip
TEST_COMMAND = "bash scripts/setup.sh --sandbox && .venv/bin/python -m pytest -q"
MAIN_COMMAND = "bash scripts/setup.sh && .venv/bin/agentrl train configs/quickstart.yaml"


@dataclass(frozen=True)
class Block:
    page: str  # path from the repo root
    line: int  # of the opening fence
    lang: str
    code: str
    marker: dict[str, str]  # kind -> argument ("" when none)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _marker(text: str) -> dict[str, str]:
    kind, _, rest = text.strip().partition(" ")
    if kind in ("skip", "covered"):  # the rest is free text: a reason, or test ids
        return {kind: rest.strip()}
    words = shlex.split(text)
    out = {}
    for word in words:
        key, _, value = word.partition("=")
        out[key] = value
    return out


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = re.fullmatch(r"```(bash|python)\s*", lines[i])
        if not fence:
            if lines[i].startswith("```"):  # another language: skip to its end
                i += 1
                while i < len(lines) and not lines[i].startswith("```"):
                    i += 1
            i += 1
            continue
        end = i + 1
        while not lines[end].startswith("```"):
            end += 1
        prev = lines[i - 1] if i else ""
        comment = re.fullmatch(r"<!-- test: (.*) -->", prev.strip())
        found.append(Block(str(page.relative_to(REPO)), i + 1, fence[1], "\n".join(lines[i + 1 : end]),
                           _marker(comment[1]) if comment else {}))  # fmt: skip
        i = end + 1
    return found


def documented_pages() -> list[Path]:
    pages = [README]
    for page in sorted(DOCS.rglob("*.md")):
        rel = str(page.relative_to(REPO))
        if rel.startswith(("docs/results/", "docs/reference/")):
            continue
        if rel in UNMARKED_PAGES_OWNED_ELSEWHERE and "<!-- test:" not in page.read_text():
            continue
        pages.append(page)
    return pages


def _params() -> list:
    params = []
    for page in documented_pages():
        for block in blocks_of(page):
            marks = [getattr(pytest.mark, m) for m in ("slow", "docker", "gpu") if m in block.marker]
            params.append(pytest.param(block, id=block.id, marks=marks))
    return params


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(port: int, proc: subprocess.Popen | None = None, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode} before answering on port {port}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
            return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"nothing answered on port {port} within {timeout} s")


def _environment() -> dict[str, str]:
    return {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": "", "NO_MKDOCS_2_WARNING": "1"}  # fmt: skip


def _scratch(tmp_path: Path) -> Path:
    work = tmp_path / "cwd"
    work.mkdir()
    for name in ("configs", "benchmarks"):
        (work / name).symlink_to(REPO / name)
    return work


def _bash(block: Block, port: int, tiny_model: Path | None) -> str:
    """The block as a bash script: the port swapped, servers waited for, ``tiny`` overrides added."""
    wait = f'"{sys.executable}" -c "import sys; sys.path.insert(0, {str(REPO / "tests")!r}); ' \
           f'from test_docs import _wait_for; _wait_for(int(sys.argv[1]))"'  # fmt: skip
    script = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    for line in block.code.replace("8000", str(port)).splitlines():
        code = line.split("  #")[0].rstrip()
        if "tiny" in block.marker and code.startswith("agentrl train") and "|" not in code:
            code += " " + " ".join([f"model.name={tiny_model}", *TINY])
        script.append(code)
        if code.endswith("&"):
            script.append(f"{wait} {port}")
    return "\n".join(script)


@pytest.mark.parametrize("block", _params())
def test_documented_snippet_runs(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if "skip" in block.marker:
        assert block.marker["skip"], f"{block.id}: a skipped snippet says why (<!-- test: skip REASON -->)"
        pytest.skip(f"{block.id}: {block.marker['skip']}")
    if "covered" in block.marker:
        ids = block.marker["covered"].split()
        assert ids, f"{block.id}: 'covered' names the tests that run it"
        for test_id in ids:
            path, _, name = test_id.partition("::")
            assert (REPO / path).is_file() and f"def {name}(" in (REPO / path).read_text(), (
                f"{block.id} says {test_id} runs it, but there is no such test"
            )
        return
    work, port, env = _scratch(tmp_path), _free_port(), _environment()
    tiny = request.getfixturevalue("tiny_model_dir") if "tiny" in block.marker else None
    server = None
    if "server" in block.marker:
        command = block.marker["server"].replace("8000", str(port))
        server = subprocess.Popen(dies_with_tests(shlex.split(command)), cwd=work, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        if server is not None:
            _wait_for(port, server)
        if block.lang == "bash":
            proc = subprocess.run(["bash", "-c", _bash(block, port, tiny)], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=900)  # fmt: skip
        else:
            (work / "snippet.py").write_text(block.code.replace("8000", str(port)))
            proc = subprocess.run([sys.executable, "snippet.py"], cwd=work, env=env, capture_output=True,
                                  text=True, timeout=900)  # fmt: skip
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    assert proc.returncode == 0, (
        f"{block.id} failed:\n{block.code}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    )


def test_every_documented_page_has_its_snippets_collected() -> None:
    """The collector sees the README's blocks (a regex that matched nothing would pass every test)."""
    readme = blocks_of(README)
    assert [b.lang for b in readme].count("python") >= 2 and [b.lang for b in readme].count("bash") >= 3
    assert all(b.code.strip() for b in readme)


# --------------------------------------------------------------------------- the README as a front page
def test_the_readme_is_a_front_page() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 215, f"README.md has {len(lines)} lines: move detail to docs/ (it is the front page)"
    first_screen = "\n".join(lines[:20])
    assert MAIN_COMMAND in first_screen and TEST_COMMAND in first_screen
    for heading in ("## Commands", "## Environments", "## Objectives", "## Quickstart results", "## Results",
                    "## Documentation"):  # fmt: skip
        assert heading in lines, f"README.md lost its {heading!r} section"


def test_relative_links_in_the_readme_resolve() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if not link.startswith(("http://", "https://", "mailto:"))]
    assert local, "the README links into docs/"
    missing = [link for link in local if not (REPO / link).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run runs the README's test command (set-up with the sandbox, then pytest as written)."""
    ci = (REPO / ".ci" / "run").read_text()
    setup, _, pytest_command = TEST_COMMAND.partition(" && ")
    assert TEST_COMMAND in README.read_text()
    assert re.search(rf"^{re.escape(setup)}$", ci, re.M) and re.search(
        rf"^{re.escape(pytest_command)}$", ci, re.M
    )


# --------------------------------------------------------------------------- generated parts, the site
def test_the_generated_docs_are_current() -> None:
    """The README's env catalogue and objectives table and docs/reference/ equal what the code gives."""
    proc = subprocess.run([sys.executable, "scripts/gen_docs.py", "--check"], cwd=REPO, capture_output=True,
                          text=True, env=_environment(), timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_env_catalogue_is_every_registered_env() -> None:
    import json

    from agentrl.env import registered_ids

    envs = json.loads(subprocess.run([sys.executable, "-m", "agentrl.cli", "envs", "--json"], capture_output=True,
                                     text=True, check=True, cwd=REPO).stdout)  # fmt: skip
    # the platform's own ids: other tests of this process register toy envs (test/...) beside them
    ours = [env_id for env_id in registered_ids() if env_id.startswith("agentrl/")]
    assert [e["id"] for e in envs] == ours and len(envs) >= 10
    table = README.read_text().split("<!-- generated: envs -->")[1].split("<!-- /generated -->")[0]
    assert [row.split("`")[1] for row in table.strip().splitlines()[2:]] == ours


def test_the_config_reference_lists_every_field() -> None:
    from agentrl.config import EVAL_SETTINGS, help_text

    page = (DOCS / "reference" / "config.md").read_text()
    for name, _default, _help in help_text():
        assert f"| `{name}` |" in page, f"{name} is missing from docs/reference/config.md"
    assert page.count("| **yes** |") == len(EVAL_SETTINGS) - 2  # top_p/top_k: "only when sampled"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """`mkdocs build --strict`: no broken link, anchor, page left out of the nav or API reference."""
    mkdocs = VENV_BIN / "mkdocs"
    assert mkdocs.exists(), "mkdocs is not installed: run `bash scripts/setup.sh` (the dev extra has it)"
    proc = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
                          capture_output=True, text=True, env=_environment(), timeout=600)  # fmt: skip
    hint = "\n(a new page under docs/ needs its line in mkdocs.yml's nav; a changed link must resolve)"
    assert proc.returncode == 0, proc.stderr[-5000:] + hint
    assert (tmp_path / "site" / "reference" / "config" / "index.html").exists()


def test_the_getting_started_page_describes_the_quickstart_config_as_it_is() -> None:
    """Its numbers are configs/quickstart.yaml's: a change to the config must change the page too."""
    import yaml

    config = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())
    train, rollout = config["train"], config["rollout"]
    text = " ".join((DOCS / "getting-started.md").read_text().split())
    expected = [
        f"({train['sft_warmup_steps']} steps on {train['sft_demos']} demos, the top {train['trainable_layers']} of",
        f"({train['steps']} steps × {rollout['tasks_per_step']} tasks × trees of "
        f"{rollout['group_size'] * (1 + rollout['branches'])} at temperature {rollout['temperature']}",
        f"the first {train['eval_episodes']} test tasks",
        f"`agentrl/{config['env']['id'].split('/')[1]}`",
    ]
    for phrase in expected:
        assert phrase in text, f"docs/getting-started.md should say {phrase!r} (configs/quickstart.yaml)"
