"""agentrl side by side with the platforms people use today: GEM, SkyRL-Gym and TRL.

The peers are installed from PyPI into their OWN virtual environment (``$AGENTRL_PEERS_VENV``, else
``.cache/peers-venv``; created on first use, reused after) and measured there by
``peers_worker.py``; they are never dependencies of agentrl. A peer that cannot be installed
gives rows that say so. Rows (every one against a baseline measured in the same run):

- search env per step: ours (``agentrl/Search-v0``), GEM (``ToolEnvWrapper`` + ``SearchTool``) and
  SkyRL-Gym (``SearchEnv``), all against ONE Search-R1 server started here over our wiki, the same
  scripted actions and step count; baseline: the bare retrieval POST.
- Python execution per call on the same snippets: GEM's ``PythonCodeTool`` (none / bwrap), SkyRL's
  python tool, our Docker sandbox from the pool (warm session, exec) and bubblewrap; baseline:
  plain ``subprocess`` ``python -c``.
- batch building: our ``build_batch`` vs TRL's ``pad`` (GEM and SkyRL-Gym ship none).
- GRPO loss forward+backward: our ``ppo_clip`` vs TRL's own ``GRPOTrainer._compute_loss`` on the
  same tensors, with the max abs difference of loss and gradient.
- peak memory (fresh process each, ``ru_maxrss``) of log-probs forward+backward: our chunked
  kernel from hidden states vs TRL's ``selective_log_softmax`` and plain torch on full logits.

    python benchmarks/bench_peers.py [--quick] [--json PATH] [--venv DIR]
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402
from common import median, parser, write_json  # noqa: E402
from peers_setup import HOST_PYTHON, THREADS, Peers, retrieval_app, start_server, tail, venv_dir  # noqa: E402


class Row(common.Row):
    """A row whose value may be None (peer missing, needs GPU): then it has no ratio."""

    @property
    def ratio(self) -> float | None:
        return None if self.value is None else super().ratio


PEERS = {"gem-llm": "GEM", "skyrl-gym": "SkyRL-Gym", "trl": "TRL"}
SNIPPETS = [
    "print(1)",
    "import math\nprint(round(sum(math.sqrt(i) for i in range(200000)), 3))",
    "import json\nprint(json.dumps({'a': [1, 2, 3], 'b': 'x' * 8}))",
]


def ms(seconds: float) -> float:
    return seconds * 1000.0


# ---------------------------------------------------------------- search env rows


def scripted_episodes(env: Any, n: int) -> list[dict]:
    """Same actions for every platform: 3 searches (entity, entity + relation, question), then answer."""
    episodes = []
    for task in list(env.unwrapped.load_tasks("train"))[:n]:
        start = task.payload["start"]
        relation = task.payload["relations"][0].replace("_", " ")
        episodes.append(
            {
                "task_id": task.id,
                "question": task.question,
                "answers": list(task.answer),
                "queries": [start, f"{start} {relation}", task.question],
            }
        )
    return episodes


def search_rows(peers: Peers, quick: bool) -> list[Row]:
    import httpx

    import agentrl
    from agentrl.envs.search.env import wiki_retriever
    from agentrl.envs.search.oracle import tool_call

    n_entities, n_episodes, repeat, topk = (2000, 4, 1, 3) if quick else (2000, 25, 2, 3)
    url, server = start_server(retrieval_app(wiki_retriever(0, n_entities, "bm25")))
    try:
        env = agentrl.make("agentrl/Search-v0", n_entities=n_entities, retriever_url=url, default_k=topk)
        episodes = scripted_episodes(env, n_episodes)
        with httpx.Client() as client:  # the bare request every step pays, as the floor
            queries = [q for e in episodes for q in e["queries"]]
            client.post(url, json={"queries": queries[:1], "topk": topk}).raise_for_status()
            post_s = []
            for q in queries * repeat:
                start = time.perf_counter()
                client.post(url, json={"queries": [q], "topk": topk}).raise_for_status()
                post_s.append(time.perf_counter() - start)
        ours_s, failed = [], 0
        for _ in range(repeat):
            for e in episodes:
                env.reset(seed=0, options={"task_id": e["task_id"]})
                for q in e["queries"]:
                    start = time.perf_counter()
                    obs, *_ = env.step(tool_call("search", query=q, k=topk))
                    ours_s.append(time.perf_counter() - start)
                    failed += int(obs.startswith("Error") or "Error:" in obs[:200])
                start = time.perf_counter()
                env.step(f"<answer>{e['answers'][0]}</answer>")
                ours_s.append(time.perf_counter() - start)
        env.close()
        spec = {"url": url, "topk": topk, "episodes": episodes, "repeat": repeat}
        theirs = peers.run("search", spec)
    finally:
        server.should_exit = True
    base = ("retrieval POST alone (same server)", ms(median(post_s)))
    steps = len(ours_s)
    ours = ms(median(ours_s))
    rows = [
        Row(
            "search env step p50: agentrl Search-v0 (remote)",
            ours,
            "ms",
            *base,
            note=f"{steps} steps ({len(episodes)} episodes x 4 x {repeat}); {failed} failed searches",
        )
    ]
    for key, dist, label in (
        ("gem", "gem-llm", "GEM ToolEnvWrapper+SearchTool"),
        ("skyrl", "skyrl-gym", "SkyRL-Gym SearchEnv"),
    ):
        name = f"search env step p50: {label}"
        problem = peers.missing(dist) or (theirs if isinstance(theirs, str) else theirs[key].get("error", ""))
        if problem:
            rows.append(Row(name, None, "ms", *base, note=problem))  # type: ignore[arg-type]
            continue
        value = ms(median(theirs[key]["step_s"]))
        rows.append(
            Row(
                name,
                value,
                "ms",
                *base,
                note=f"{len(theirs[key]['step_s'])} steps; "
                f"{theirs[key]['failed_searches']} failed searches; {value / ours:.2f}x agentrl's",
            )
        )
    return rows


# ---------------------------------------------------------------- Python execution rows


def python_rows(peers: Peers, quick: bool) -> list[Row]:
    from agentrl.errors import SandboxError
    from agentrl.sandboxes import SandboxPool, make_sandbox

    repeat = 3 if quick else 15
    expected = [
        subprocess.run([HOST_PYTHON, "-c", c], capture_output=True, text=True).stdout.strip()
        for c in SNIPPETS
    ]

    def measure(fn) -> tuple[float, str]:
        times, mismatches = [], 0
        for code, want in zip(SNIPPETS, expected, strict=True):
            fn(code)
            for _ in range(repeat):
                start = time.perf_counter()
                out = fn(code)
                times.append(time.perf_counter() - start)
            mismatches += int(out.strip() != want)
        return ms(median(times)), ("" if not mismatches else f"{mismatches} snippet(s) gave other output")

    base_ms, _ = measure(
        lambda c: subprocess.run([HOST_PYTHON, "-c", c], capture_output=True, text=True).stdout
    )
    base = ("subprocess python -c", base_ms)
    label = f"python exec p50 ({len(SNIPPETS)} snippets x {repeat})"
    rows = []
    for backend in ("docker", "bwrap"):
        try:
            if backend == "docker":
                with SandboxPool(backend="docker", size=1) as pool, pool.lease() as sb:
                    session = sb.python_session()
                    sess_ms, sess_note = measure(lambda c, s=session: s.run(c).stdout)
                    exec_ms, exec_note = measure(lambda c, b=sb: b.exec(c).stdout)
            else:
                with make_sandbox("bwrap") as sb:
                    session = sb.python_session()
                    sess_ms, sess_note = measure(lambda c, s=session: s.run(c).stdout)
                    exec_ms, exec_note = measure(lambda c, b=sb: b.exec(c).stdout)
        except SandboxError as exc:
            for kind in ("warm PythonSession", "exec (fresh interpreter)"):
                rows.append(
                    Row(
                        f"{label}: agentrl {backend} {kind}",
                        None,
                        "ms",
                        *base,  # type: ignore[arg-type]
                        note=f"{backend} unavailable: {exc}",
                    )
                )
            continue
        where = "pooled Docker sandbox" if backend == "docker" else "bubblewrap"
        rows.append(
            Row(f"{label}: agentrl {where}, warm PythonSession", sess_ms, "ms", *base, note=sess_note)
        )
        rows.append(Row(f"{label}: agentrl {where}, exec", exec_ms, "ms", *base, note=exec_note))
    theirs = peers.run("python", {"snippets": SNIPPETS, "repeat": repeat})
    for key, dist, name in (
        ("gem_none", "gem-llm", "GEM PythonCodeTool sandbox=none"),
        ("gem_bwrap", "gem-llm", "GEM PythonCodeTool sandbox=bwrap"),
        ("skyrl", "skyrl-gym", "SkyRL-Gym python tool"),
    ):
        problem = peers.missing(dist) or (theirs if isinstance(theirs, str) else theirs[key].get("error", ""))
        if problem:
            rows.append(Row(f"{label}: {name}", None, "ms", *base, note=problem))  # type: ignore[arg-type]
            continue
        got = [o.strip() for o in theirs[key]["outputs"]]
        bad = [o for o, w in zip(got, expected, strict=True) if o != w]
        note = "" if not bad else f"{len(bad)}/{len(got)} snippets gave other output: {bad[0][:90]!r}"
        if bad and key == "gem_bwrap" and "execvp python" in bad[0]:
            note += (
                " (GEM's bwrap mode binds only sys.prefix, /lib* and /usr/lib; a standard venv's python is a "
                "symlink to an interpreter outside them)"
            )
        value = None if len(bad) == len(got) else ms(median(theirs[key]["call_s"]))  # no time for a failure
        rows.append(Row(f"{label}: {name}", value, "ms", *base, note=note))  # type: ignore[arg-type]
    return rows


# ---------------------------------------------------------------- batch building


def make_episodes(n_episodes: int, turns: int, seed: int = 0) -> list[Any]:
    import random

    from agentrl.trajectory import Episode, Segment, Source, Turn

    rng = random.Random(seed)
    episodes = []
    for e in range(n_episodes):
        segment = Segment(prompt_ids=[rng.randrange(50000) for _ in range(rng.randint(100, 300))])
        for k in range(turns):
            n_out, n_obs = rng.randint(20, 120), rng.randint(30, 200)
            segment.turns.append(
                Turn(
                    index=k,
                    output_ids=[rng.randrange(50000) for _ in range(n_out)],
                    output_logprobs=[-rng.random() for _ in range(n_out)],
                    obs_ids=[rng.randrange(50000) for _ in range(n_obs)],
                    obs_source=[int(Source.TOOL)] * n_obs,
                )
            )
        episodes.append(Episode(episode_id=f"e{e}", env_id="bench", task_id=f"t{e}", segments=[segment]))
    return episodes


def batch_rows(peers: Peers, quick: bool) -> list[Row]:
    """Our ``build_batch`` now and before issue #15 (``reference_batch``, row-by-row lists) vs TRL's ``pad``."""
    import torch

    from agentrl.trajectory import build_batch, reference_batch, segment_arrays

    torch.set_num_threads(THREADS)  # as the peers' worker
    n_episodes, turns, repeat = (16, 4, 3) if quick else (256, 8, 10)
    episodes = make_episodes(n_episodes, turns)
    rows_data = [{k: segment_arrays(e.segments[0])[k] for k in ("ids", "mask", "logp")} for e in episodes]
    batch = build_batch(episodes)
    times: dict[str, list[float]] = {"after": [], "before": [], "trl": []}
    problem = peers.missing("trl")
    spec = {"rows": rows_data, "pad_id": 0, "repeat": 1}
    for _ in range(repeat):  # rounds interleave the three, so all see the same machine load
        for key, fn in (("after", build_batch), ("before", reference_batch)):
            start = time.perf_counter()
            fn(episodes)
            times[key].append(time.perf_counter() - start)
        theirs = problem or peers.run("batch", spec)
        if isinstance(theirs, str):
            problem = theirs
        else:
            times["trl"] += theirs["time_s"]
    shape = "x".join(map(str, batch.input_ids.shape))
    name = f"batch building p50 ({n_episodes} episodes x {turns} turns -> {shape})"
    labels = {
        "after": f"{name}: agentrl build_batch",
        "before": f"{name}: agentrl build_batch before #15 (row-by-row lists)",
    }
    note = (
        "ours flattens multi-turn episodes and also builds turn_id/source/process/fold; "
        "TRL pads already-flat rows (it has no multi-turn structure)"
    )
    out = []
    for key in ("before", "after"):
        if problem:
            out.append(Row(labels[key], ms(median(times[key])), "ms", note=f"TRL: {problem}"))
        else:
            base = ("TRL pad (ids, attention, mask, logps)", ms(median(times["trl"])))
            out.append(Row(labels[key], ms(median(times[key])), "ms", *base, note=note))
    for dist, label in (("gem-llm", "GEM"), ("skyrl-gym", "SkyRL-Gym")):
        out.append(
            Row(
                f"batch building: {label}",
                None,
                "ms",  # type: ignore[arg-type]
                note=peers.missing(dist)
                or f"{label}'s PyPI package ships no trajectory/batch builder "
                "(envs only; batching lives in the trainers that use it)",
            )
        )
    return out


# ---------------------------------------------------------------- GRPO loss vs TRL


def grpo_rows(peers: Peers, quick: bool) -> list[Row]:
    import torch

    from agentrl.algos.losses import ppo_clip

    torch.set_num_threads(THREADS)
    b, length, repeat = (4, 128, 5) if quick else (32, 2048, 20)
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(b, length, generator=gen) * 3  # [B, L]
    logp = old + 0.15 * torch.randn(b, length, generator=gen)  # [B, L]
    lengths = torch.randint(length // 4, length + 1, (b,), generator=gen)
    mask = (torch.arange(length)[None] < lengths[:, None]).float()  # [B, L]
    adv = torch.randn(b, generator=gen)  # [B], one per completion (GRPO)
    path = peers.workdir / "grpo.pt"
    torch.save({"logp": logp, "old_logp": old, "mask": mask, "adv": adv}, path)
    types = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean"}
    problem = peers.missing("trl")
    theirs = problem or peers.run(
        "grpo",
        {
            "tensors": str(path),
            "loss_types": list(types),
            "repeat": repeat,
            "threads": THREADS,
            "out_prefix": str(peers.workdir / "grad-"),
        },
    )
    rows = []
    for loss_type, agg in types.items():
        x = logp.clone().requires_grad_(True)

        def step(x=x, agg=agg):
            x.grad = None
            loss, _ = ppo_clip(x, old, adv[:, None].expand(b, length), mask, agg=agg)
            loss.backward()
            return loss

        loss = step()
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        name = f"GRPO loss fwd+bwd p50 [{b}x{length}]: agentrl ppo_clip agg={agg}"
        if isinstance(theirs, str):
            rows.append(Row(name, ms(median(times)), "ms", note=f"TRL: {theirs}"))
            continue
        t = theirs[loss_type]
        d_loss = abs(float(loss.detach()) - t["loss"])
        d_grad = float((x.grad - torch.load(t["grad_path"])).abs().max())
        rows.append(
            Row(
                name,
                ms(median(times)),
                "ms",
                f"TRL _compute_loss loss_type={loss_type}",
                ms(median(t["time_s"])),
                note=f"max |dloss| {d_loss:.2e}, max |dgrad| {d_grad:.2e}; TRL's "
                "own method on a GRPOTrainer shell (model forward replaced by the same log-probs)",
            )
        )
    return rows


# ---------------------------------------------------------------- peak memory of log-probs


def mem_child(impl: str, n: int, v: int, h: int) -> dict:
    """One measurement in this fresh process: forward + backward, peak RSS above the inputs."""
    import torch

    from agentrl.kernels import chunked_logprobs_entropy

    torch.set_num_threads(THREADS)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=gen).requires_grad_(True)  # [T, H]
    weight = (torch.randn(v, h, generator=gen) * 0.02).requires_grad_(True)  # [V, H]
    targets = torch.randint(0, v, (n,), generator=gen)  # [T]
    with open("/proc/self/status") as fh:
        before = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024.0
    start = time.perf_counter()
    if impl == "chunked":
        logp, _entropy = chunked_logprobs_entropy(hidden, weight, targets)  # [T], [T]
    else:  # plain torch: full logits, log_softmax, gather
        logp = torch.log_softmax(hidden @ weight.t(), dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    logp.sum().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return {"before_mb": before, "peak_mb": peak, "seconds": seconds, "logp_sum": float(logp.sum())}


def mem_rows(peers: Peers, quick: bool) -> list[Row]:
    sizes = [(256, 8192, 64)] if quick else [(4096, 49152, 576), (4096, 151936, 576)]
    rows = []
    for n, v, h in sizes:
        logits_mb = n * v * 4 / 2**20
        with open("/proc/meminfo") as fh:
            avail_mb = next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable:")) / 1024.0
        name = f"log-prob fwd+bwd peak RSS above inputs, T={n} V={v} H={h} fp32"
        if avail_mb < 5 * logits_mb:  # full logits + grad + softmax copies must fit beside other users
            rows.append(
                Row(
                    f"{name}: agentrl chunked",
                    None,
                    "MiB",  # type: ignore[arg-type]
                    note=f"skipped: {avail_mb:.0f} MiB available, one logits tensor is {logits_mb:.0f} MiB",
                )
            )
            continue
        results: dict[str, dict | str] = {}
        for impl in ("chunked", "naive"):
            proc = subprocess.run(
                [sys.executable, __file__, "--mem-child", impl, str(n), str(v), str(h)],
                capture_output=True,
                text=True,
                timeout=900,
            )
            results[impl] = (
                json.loads(proc.stdout.strip().splitlines()[-1])
                if proc.returncode == 0
                else f"failed: {tail(proc.stderr)}"
            )
        problem = peers.missing("trl")
        results["trl"] = problem or peers.run_fresh(
            "logprob_mem", {"T": n, "V": v, "H": h, "threads": THREADS}
        )
        trl = results["trl"]
        base = (
            ("TRL selective_log_softmax on full logits", trl["peak_mb"] - trl["before_mb"])
            if isinstance(trl, dict)
            else (None, None)
        )
        for impl, label in (
            ("chunked", "agentrl chunked from hidden states"),
            ("naive", "plain torch log_softmax+gather"),
        ):
            r = results[impl]
            if isinstance(r, str):
                rows.append(Row(f"{name}: {label}", None, "MiB", *base, note=r))  # type: ignore[arg-type]
                continue
            note = f"{r['seconds']:.1f} s; one [T,V] fp32 logits = {logits_mb:.0f} MiB"
            if isinstance(trl, dict):
                note += f"; TRL {trl['seconds']:.1f} s, logp sums differ by {abs(r['logp_sum'] - trl['logp_sum']):.2e}"
            else:
                note += f"; TRL: {trl}"
            rows.append(Row(f"{name}: {label}", r["peak_mb"] - r["before_mb"], "MiB", *base, note=note))
    return rows


def gpu_rows() -> list[Row]:
    import torch

    if torch.cuda.is_available():
        note = "GPU present, but this script measures CPU only; GPU figures come from bench_learner.py"
    else:
        note = "needs GPU (no CUDA here); run benchmarks/run_all.py on a GPU machine"
    return [
        Row("log-prob peak GPU memory: Triton kernel vs TRL selective_log_softmax", None, "MiB", note=note),  # type: ignore[arg-type]
        Row("GRPO step time on GPU vs TRL GRPOTrainer", None, "ms", note=note),
    ]  # type: ignore[arg-type]


def main() -> int:
    if len(sys.argv) == 6 and sys.argv[1] == "--mem-child":
        print(json.dumps(mem_child(sys.argv[2], *map(int, sys.argv[3:]))))
        return 0
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--venv", default=None, help="peers venv (default $AGENTRL_PEERS_VENV or .cache/peers-venv)"
    )
    p.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of: {', '.join(SECTIONS)} (default: all)",
    )
    args = p.parse_args()
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        p.error(f"--sections: unknown {', '.join(sorted(unknown))}; use some of {', '.join(SECTIONS)}")
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        peers = Peers(venv_dir(args.venv), Path(tmp))
        try:
            rows = measure_all(peers, args.quick, args.sections.split(","))
        finally:
            peers.close()
    print_rows(rows)
    write_json(args.json_path, "peers", rows, args.quick)
    return 0


def measure_all(peers: Peers, quick: bool, sections: list[str] | None = None) -> list[Row]:
    """Every (or each named) section's rows; a peer that is missing or fails gives rows saying so."""
    peers.ensure()
    found = ", ".join(f"{PEERS.get(d, d)} {v}" for d, v in peers.versions.items() if v and "_error" not in d)
    note = peers.problem or f"{peers.path}: {found} (includes starting the worker and importing the peers)"
    rows = [Row("peers venv ready (create+install, or reuse)", peers.setup_s, "s", note=note)]
    for name in sections or SECTIONS:
        rows += SECTIONS[name](peers, quick)
    return rows + (gpu_rows() if sections is None or len(sections) == len(SECTIONS) else [])


SECTIONS = {
    "search": search_rows,
    "python": python_rows,
    "batch": batch_rows,
    "grpo": grpo_rows,
    "mem": mem_rows,
}


def print_rows(rows: list[Row]) -> None:
    """Like ``common.print_table``, but a row may have no value (peer missing, needs GPU)."""
    print(f"| {'measurement':<70} | {'value':>10} | {'unit':<4} | {'baseline':<44} | {'ratio':>6} | note")
    print(f"|{'-' * 72}|{'-' * 12}|{'-' * 6}|{'-' * 46}|{'-' * 8}|------")
    for r in rows:
        value = "-" if r.value is None else f"{r.value:.4g}"
        base = (
            ""
            if r.baseline is None
            else f"{r.baseline} ({'-' if r.baseline_value is None else f'{r.baseline_value:.4g}'})"
        )
        ratio = "" if r.value is None or r.ratio is None else f"{r.ratio:.3f}"
        print(f"| {r.name:<70} | {value:>10} | {r.unit:<4} | {base:<44} | {ratio:>6} | {r.note}")


if __name__ == "__main__":
    sys.exit(main())
