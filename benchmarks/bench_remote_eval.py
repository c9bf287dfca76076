"""Remote-agent eval under failure: wall time and episodes scored when one request hangs or the
server always fails, for the chat agent (``chat:URL#model``) and the token-id completions agent
(``openai:URL#model``), against local scripted servers over real HTTP (tests/eval/chat_servers.py)
on a GAIA-layout split with absent and LFS-pointer attachments.

Issue 16 measured the old path at 125/165 scored with task 0 hanging and 1,787 s for 165 errors
from an always-500 server. Here: every answerable episode is scored, the hung one costs its own
episode timeout, and the circuit breaker ends an always-500 run after a few requests.

    python benchmarks/bench_remote_eval.py            # 165 tasks, episode timeout 10 s, request timeout 5 s
    python benchmarks/bench_remote_eval.py --quick    # 24 tasks, episode timeout 3 s, request timeout 1 s
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "eval"))

from chat_servers import ScriptedChat, ScriptedCompletions, write_gaia_download  # noqa: E402
from common import Row, parser, print_table, write_json  # noqa: E402

from agentrl.eval.model_agent import ModelEvalConfig  # noqa: E402
from agentrl.eval.runner import evaluate  # noqa: E402
from agentrl.eval.suites import parse_suite  # noqa: E402
from agentrl.serve.server import BackgroundServer  # noqa: E402


def measure(kind: str, mode: str, tasks: int, episode_s: float, request_s: float) -> Row:
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-gaia-") as tmp:
        root = Path(tmp)
        records = write_gaia_download(root, hang=mode == "hang", extra=tasks - 9 - (mode == "hang"))
        if kind == "chat":
            server = ScriptedChat(records, mode="500" if mode == "500" else "answer")
        else:
            from agentrl.rollout.model import load_tokenizer

            server = ScriptedCompletions(
                records, load_tokenizer("smollm2-135m"), mode="500" if mode == "500" else "answer"
            )
        settings = ModelEvalConfig.resolve(
            episode_timeout_s=episode_s, request_timeout_s=request_s, max_retries=2 if mode == "500" else 5
        )
        suite = parse_suite("gaia", [f"data_dir={root}", "python=false"])
        with BackgroundServer(server.app) as http:
            agent = f"{kind}:{http.url}#" + ("scripted" if kind == "chat" else "smollm2-135m")
            start = time.perf_counter()
            # one round: the figures are what a hung request costs once (`--replays` would run the
            # always-hung task twice more, adding two episode timeouts)
            result = evaluate(suite, agent, concurrency=8, settings=settings, replays=0)
            wall = time.perf_counter() - start
    records_out = result.records
    scored = sum(r["error"] is None for r in records_out)
    solved = sum(r["success"] >= 1.0 for r in records_out)
    note = (
        f"{scored}/{len(records_out)} scored, {solved} solved, {server.requests} requests; "
        f"episode timeout {episode_s:g}s, request timeout {request_s:g}s, concurrency 8"
    )
    return Row(f"{kind} agent, {mode}, {len(records_out)} tasks", wall, "s", note=note)


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    tasks, episode_s, request_s = (24, 3.0, 1.0) if args.quick else (165, 10.0, 5.0)
    rows = [
        measure(kind, mode, tasks, episode_s, request_s)
        for kind in ("chat", "openai")
        for mode in ("answer", "hang", "500")
    ]
    print_table(rows, "remote eval under failure (wall seconds of the whole run)")
    write_json(args.json_path, "bench_remote_eval", rows, args.quick)


if __name__ == "__main__":
    main()
