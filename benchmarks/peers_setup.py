"""Plumbing for ``bench_peers.py``: the peers' own venv, its worker process, the retrieval server.

The peers (GEM, SkyRL-Gym, TRL) live in a separate virtual environment (``$AGENTRL_PEERS_VENV``,
else ``.cache/peers-venv``), created with pip on first use and reused after; they are never
dependencies of agentrl. ``peers_worker.py`` runs inside it.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PEER_PACKAGES = ["torch==2.13.0", "gem-llm", "skyrl-gym", "trl"]
HOST_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
THREADS = 1  # both sides; the shared machine's other load makes more threads noisy
RESULT_MARK = "@@peers-worker-result@@ "  # as in peers_worker.py


# ---------------------------------------------------------------- peers venv


def venv_dir(arg: str | None) -> Path:
    return Path(arg or os.environ.get("AGENTRL_PEERS_VENV") or REPO / ".cache" / "peers-venv")


class Peers:
    """The peers' venv: created once, then reused; runs ``peers_worker.py`` commands in it."""

    def __init__(self, path: Path, workdir: Path):
        self.path, self.workdir = path, workdir
        self.python = path / "bin" / "python"
        self.versions: dict[str, Any] = {}
        self.problem = ""  # why nothing runs in the venv, if so
        self.setup_s = 0.0
        self._proc: subprocess.Popen | None = None
        self._log: Any = None
        # GEM's and SkyRL's tools run "python" from PATH: point it at the same interpreter build the
        # subprocess baseline uses, never a pyenv shim (hundreds of ms on its own).
        shim = workdir / "bin"
        shim.mkdir(exist_ok=True)
        (shim / "python").symlink_to(HOST_PYTHON)
        self.env = {
            **os.environ,
            "PATH": f"{shim}:{os.environ.get('PATH', '')}",
            "OMP_NUM_THREADS": str(THREADS),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }

    def ensure(self) -> None:
        """Create the venv if missing, then start the worker and ask it for the peers' versions."""
        start = time.perf_counter()
        if not self.python.exists():
            steps = [
                [sys.executable, "-m", "venv", str(self.path)],
                [str(self.python), "-m", "pip", "install", "-q", *PEER_PACKAGES],
            ]
            for cmd in steps:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
                if proc.returncode != 0:
                    self.problem = f"`{' '.join(cmd[-4:])}` failed: {tail(proc.stderr or proc.stdout)}"
                    break
        if not self.problem:
            self._log = open(self.workdir / "worker.log", "w")  # noqa: SIM115 - closed in close()
            self._proc = subprocess.Popen(
                [str(self.python), str(HERE / "peers_worker.py"), "serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                text=True,
                env=self.env,
                cwd=self.workdir,
            )
            result = self.run("versions", {}, timeout=300)
            if isinstance(result, str):
                self.problem = result
            else:
                self.versions = result
        self.setup_s = time.perf_counter() - start

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def missing(self, dist: str) -> str:
        """Why ``dist`` cannot be measured ('' when it can)."""
        if self.problem:
            return f"peers venv unusable: {self.problem}"
        if not self.versions.get(dist):
            return f"{dist} not installable here: {self.versions.get(f'{dist}_error', 'missing')}"
        return ""

    def run(self, command: str, spec: dict, timeout: float = 600) -> dict | str:
        """One command through the long-lived worker; its JSON result, or the error text."""
        if self.problem:
            return self.problem
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return f"the peers worker is not running: {self._log_tail()}"
        proc.stdin.write(json.dumps({"command": command, "spec": spec}) + "\n")
        proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                proc.kill()
                return f"worker `{command}` ran over {timeout:.0f} s"
            line = proc.stdout.readline()
            if not line:
                return f"the peers worker died during `{command}`: {self._log_tail()}"
            if line.startswith(RESULT_MARK):
                result = json.loads(line[len(RESULT_MARK) :])
                if isinstance(result, dict) and "__error__" in result:
                    return f"`{command}` raised {result['__error__']}"
                return result

    def run_fresh(self, command: str, spec: dict, timeout: float = 900) -> dict | str:
        """One command in a NEW worker process (peak-memory measurements need their own process)."""
        if self.problem:
            return self.problem
        spec_path = self.workdir / f"{command}-spec.json"
        out_path = self.workdir / f"{command}-out.json"
        spec_path.write_text(json.dumps(spec))
        out_path.unlink(missing_ok=True)
        try:
            proc = subprocess.run(
                [str(self.python), str(HERE / "peers_worker.py"), command, str(spec_path), str(out_path)],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=self.env,
                cwd=self.workdir,
            )
        except subprocess.TimeoutExpired:
            return f"worker `{command}` ran over {timeout:.0f} s"
        if proc.returncode != 0 or not out_path.exists():
            return f"worker `{command}` failed (rc {proc.returncode}): {tail(proc.stderr)}"
        return json.loads(out_path.read_text())

    def _log_tail(self) -> str:
        if self._log is not None:
            self._log.flush()
        return (
            tail((self.workdir / "worker.log").read_text()) if (self.workdir / "worker.log").exists() else ""
        )


def tail(text: str, n: int = 240) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "no output")[-n:]


# ---------------------------------------------------------------- the shared retrieval server


def retrieval_app(retriever: Any) -> Any:
    """Search-R1 ``/retrieve`` over our retriever, in the three dialects the platforms speak.

    JSON ``{"queries": [...]}`` (Search-R1, agentrl) and JSON ``{"query": q}`` (SkyRL) answer
    ``{"result": [[hit, ...], ...]}``; msgpack ``{"query": q}`` (GEM's mosec server) answers msgpack
    ``{"result": [hit, ...]}``. A hit is ``{"document": {"id", "contents": "title\\ntext"}, "score"}``.
    """
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def hits(query: str, topk: int) -> list[dict]:
        return [
            {"document": {"id": h.doc_id, "contents": f"{h.title}\n{h.text}"}, "score": h.score}
            for h in retriever.search(query, topk)
        ]

    async def retrieve(request: Request) -> Response:
        raw = await request.body()
        if request.headers.get("content-type", "").startswith("application/json"):
            body = json.loads(raw)
            queries = body["queries"] if "queries" in body else [body["query"]]
            return JSONResponse({"result": [hits(q, int(body.get("topk", 3))) for q in queries]})
        import msgpack  # GEM's dialect only

        body = msgpack.unpackb(raw)
        result = hits(body["query"], int(body.get("topk") or 3))
        return Response(msgpack.packb({"result": result}), media_type="application/msgpack")

    return Starlette(routes=[Route("/retrieve", retrieve, methods=["POST"])])


def start_server(app: Any) -> tuple[str, Any]:
    """Serve ``app`` on 127.0.0.1 (any free port) in a thread; ``(url, server)``."""
    import socket
    import threading

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # Accepted connections inherit TCP_NODELAY. Without it every keep-alive request (httpx client,
    # requests.Session) stalls ~40 ms on Nagle + delayed ACK here, which would swamp the env cost.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the retrieval server did not start within 20 s")
        time.sleep(0.01)
    return f"http://127.0.0.1:{sock.getsockname()[1]}/retrieve", server
