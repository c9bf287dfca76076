"""The peer side of ``bench_peers.py``: runs INSIDE the peers' virtual environment.

It imports GEM (``gem``), SkyRL-Gym (``skyrl_gym``) and TRL (``trl``), never ``agentrl``, and
measures them on inputs that ``bench_peers.py`` prepared (same queries, same snippets, same
tensors). One command per process, or many through ``serve`` (imports paid once)::

    PEERS_VENV/bin/python benchmarks/peers_worker.py COMMAND SPEC.json OUT.json
    PEERS_VENV/bin/python benchmarks/peers_worker.py serve    # JSON request lines on stdin

Commands: ``versions``, ``search``, ``python``, ``grpo``, ``batch``, ``logprob_mem``. The spec and
the result are JSON; tensors travel as a ``torch.save`` file named in the spec (same torch
version on both sides).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections import defaultdict
from types import SimpleNamespace
from typing import Any


def rss_mb() -> float:
    """Resident set size now, in MiB (from /proc)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def versions(_spec: dict) -> dict:
    """Installed versions of the peers (a missing one is reported, not raised)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist, module in (("gem-llm", "gem"), ("skyrl-gym", "skyrl_gym"), ("trl", "trl"), ("torch", "torch")):
        try:
            __import__(module)
            out[dist] = version(dist)
        except (ImportError, PackageNotFoundError) as exc:
            out[dist] = None
            out[f"{dist}_error"] = f"{type(exc).__name__}: {exc}"
    return out


# ---------------------------------------------------------------- search env per-step overhead


def _gem_search(spec: dict) -> dict:
    """GEM: ``ToolEnvWrapper(QaEnv, [SearchTool])``, ``<search>q</search>`` actions."""
    from datasets import Dataset
    from gem.envs.qa_env import QaEnv
    from gem.tools.search_tool import SearchTool
    from gem.tools.tool_env_wrapper import ToolEnvWrapper

    episodes = spec["episodes"]
    data = Dataset.from_list([{"question": e["question"], "answer": e["answers"][0]} for e in episodes])
    base = QaEnv(dataset=data, seed=0)
    env = ToolEnvWrapper(
        base, tools=[SearchTool(search_url=spec["url"], topk=spec["topk"])], max_tool_uses=64
    )
    step_times, failures = [], 0
    for _ in range(spec["repeat"]):
        for episode in episodes:
            env.reset()
            for query in episode["queries"]:
                start = time.perf_counter()
                obs, _reward, _term, _trunc, _info = env.step(f"<search>{query}</search>")
                step_times.append(time.perf_counter() - start)
                failures += int("SearchTool Error" in obs or "Doc 1" not in obs)
            start = time.perf_counter()
            env.step(f"<answer>{episode['answers'][0]}</answer>")
            step_times.append(time.perf_counter() - start)
    return {"step_s": step_times, "failed_searches": failures}


def _skyrl_search(spec: dict) -> dict:
    """SkyRL-Gym: one ``SearchEnv`` per trajectory (as SkyRL does), ``<search>q</search>`` actions."""
    from skyrl_gym.envs.search.env import SearchEnv, SearchEnvConfig

    config = SearchEnvConfig(search_url=spec["url"], topk=spec["topk"], timeout=30, log_requests=False)
    step_times, failures = [], 0
    for _ in range(spec["repeat"]):
        for episode in spec["episodes"]:
            extras = {
                "reward_spec": {"ground_truth": {"target": episode["answers"]}},
                "max_turns": len(episode["queries"]) + 1,
            }
            env = SearchEnv(config, extras=extras)
            env.init([{"role": "user", "content": episode["question"]}])
            for query in episode["queries"]:
                start = time.perf_counter()
                out = env.step(f"<search>{query}</search>")
                step_times.append(time.perf_counter() - start)
                text = out["observations"][0]["content"] if out["observations"] else ""
                failures += int("Doc 1" not in text)
            start = time.perf_counter()
            env.step(f"<answer>{episode['answers'][0]}</answer>")
            step_times.append(time.perf_counter() - start)
            env.close()
    return {"step_s": step_times, "failed_searches": failures}


def search(spec: dict) -> dict:
    """Per-step wall time of each peer's search env against the same retrieval server."""
    import logging

    logging.disable(logging.WARNING)  # SkyRL logs every request at INFO/WARNING; not part of the step cost
    out = {}
    for name, fn in (("gem", _gem_search), ("skyrl", _skyrl_search)):
        try:
            out[name] = fn(spec)
        except ImportError as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


# ---------------------------------------------------------------- Python execution tools


def python(spec: dict) -> dict:
    """Wall time of GEM's ``PythonCodeTool`` (sandbox none / bwrap) and SkyRL's python tool per call."""
    results: dict[str, Any] = {}
    tools: dict[str, Any] = {}
    try:
        from gem.tools.python_code_tool import PythonCodeTool

        tools["gem_none"] = lambda code, t=PythonCodeTool(timeout=10, sandbox_type="none"): t.execute_action(
            f"<python>{code}</python>"
        )[2].removeprefix("Code execution result: ")
        tools["gem_bwrap"] = lambda code, t=PythonCodeTool(timeout=10, sandbox_type="bwrap"): (
            t.execute_action(f"<python>{code}</python>")[2].removeprefix("Code execution result: ")
        )
    except ImportError as exc:
        results["gem_none"] = results["gem_bwrap"] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        from skyrl_gym.tools.python import PythonCodeExecutorToolGroup

        group = PythonCodeExecutorToolGroup(timeout=10.0)
        tools["skyrl"] = lambda code: group.execute_tool("python", code)
    except ImportError as exc:
        results["skyrl"] = {"error": f"{type(exc).__name__}: {exc}"}
    for name, fn in tools.items():
        times, outputs = [], []
        for code in spec["snippets"]:
            fn(code)  # warm-up (page cache, imports)
            for _ in range(spec["repeat"]):
                start = time.perf_counter()
                text = fn(code)
                times.append(time.perf_counter() - start)
            outputs.append(text.strip())
        results[name] = {"call_s": times, "outputs": outputs}
    return results


# ---------------------------------------------------------------- GRPO loss (TRL's own code)


class _Accelerator:
    """The few ``Accelerator`` methods ``_compute_loss`` calls, for one process."""

    num_processes = 1
    sync_gradients = True

    def reduce(self, tensor, reduction="sum"):
        return tensor

    def gather(self, tensor):
        return tensor

    def gather_for_metrics(self, tensor):
        return tensor


def _trl_trainer(loss_type: str, logp, entropy):
    """A ``GRPOTrainer`` shell carrying only what ``_compute_loss`` reads; the method itself is TRL's.

    The model forward (``_get_per_token_logps_and_entropies``) is replaced by the given tensors so
    both sides compute the loss from the same per-token log-probs.
    """
    from trl import GRPOTrainer

    trainer = GRPOTrainer.__new__(GRPOTrainer)
    attrs = {
        "top_entropy_quantile": 1.0,
        "off_policy_mask_threshold": None,
        "importance_sampling_level": "token",
        "beta": 0.0,
        "loss_type": loss_type,
        "epsilon_low": 0.2,
        "epsilon_high": 0.2,
        "args": SimpleNamespace(delta=None, use_bias_correction_kl=False),
        "use_vllm": False,
        "model": SimpleNamespace(training=True),
        "current_gradient_accumulation_steps": 1,
        "aux_loss_enabled": False,
        "_entropy_bonus_enabled": False,
        "accelerator": _Accelerator(),
        "_metrics": {"train": defaultdict(list), "eval": defaultdict(list)},
        "_get_per_token_logps_and_entropies": lambda *a, **k: (logp, entropy, None),
    }
    for key, value in attrs.items():
        object.__setattr__(trainer, key, value)
    return trainer


def grpo(spec: dict) -> dict:
    """Time TRL's ``GRPOTrainer._compute_loss`` (forward + backward) and return its loss and grad."""
    import torch

    torch.set_num_threads(spec["threads"])
    t = torch.load(spec["tensors"])
    out: dict[str, Any] = {}
    for loss_type in spec["loss_types"]:
        logp = t["logp"].clone().requires_grad_(True)  # [B, L]
        trainer = _trl_trainer(loss_type, logp, torch.zeros_like(t["logp"]))
        inputs = {
            "prompt_ids": torch.zeros(t["logp"].shape[0], 1, dtype=torch.long),
            "prompt_mask": torch.ones(t["logp"].shape[0], 1, dtype=torch.long),
            "completion_ids": torch.zeros_like(t["mask"], dtype=torch.long),
            "completion_mask": t["mask"],
            "advantages": t["adv"],  # [B], one per completion as GRPO computes it
            "old_per_token_logps": t["old_logp"],
        }

        def step(trainer=trainer, logp=logp, inputs=inputs):
            logp.grad = None
            loss = trainer._compute_loss(None, inputs)
            loss.backward()
            return loss

        loss = step()
        times = []
        for _ in range(spec["repeat"]):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        out[loss_type] = {
            "time_s": times,
            "loss": float(loss.detach()),
            "grad_path": f"{spec['out_prefix']}{loss_type}.pt",
        }
        torch.save(logp.grad.detach().clone(), out[loss_type]["grad_path"])
    return out


# ---------------------------------------------------------------- batch building (TRL pad)


def batch(spec: dict) -> dict:
    """TRL's ``pad`` of per-completion tensors (ids, mask, old log-probs), as ``GRPOTrainer`` pads."""
    import torch
    from trl.trainer.utils import pad

    rows = spec["rows"]

    def build():
        ids = pad([torch.tensor(r["ids"]) for r in rows], padding_value=spec["pad_id"], padding_side="right")
        attention = pad([torch.ones(len(r["ids"]), dtype=torch.long) for r in rows], padding_value=0)
        mask = pad([torch.tensor(r["mask"], dtype=torch.float32) for r in rows], padding_value=0)
        logps = pad([torch.tensor(r["logp"], dtype=torch.float32) for r in rows], padding_value=0)
        return ids, attention, mask, logps

    ids, *_ = build()
    times = []
    for _ in range(spec["repeat"]):
        start = time.perf_counter()
        build()
        times.append(time.perf_counter() - start)
    return {"time_s": times, "shape": list(ids.shape)}


# ---------------------------------------------------------------- peak memory of log-probs


def logprob_mem(spec: dict) -> dict:
    """Peak RSS of TRL's ``selective_log_softmax`` on full ``[T, V]`` logits, forward + backward."""
    import torch
    from trl.trainer.utils import selective_log_softmax

    torch.set_num_threads(spec["threads"])
    gen = torch.Generator().manual_seed(0)
    n, v, h = spec["T"], spec["V"], spec["H"]
    hidden = torch.randn(n, h, generator=gen).requires_grad_(True)  # [T, H]
    weight = (torch.randn(v, h, generator=gen) * 0.02).requires_grad_(True)  # [V, H]
    targets = torch.randint(0, v, (n,), generator=gen)  # [T]
    before = rss_mb()
    start = time.perf_counter()
    logits = hidden @ weight.t()  # [T, V] as the LM head produces them
    logp = selective_log_softmax(logits[None], targets[None])[0]  # [T]
    logp.sum().backward()
    seconds = time.perf_counter() - start
    return {"before_mb": before, "peak_mb": peak_rss_mb(), "seconds": seconds, "logp_sum": float(logp.sum())}


COMMANDS = {
    "versions": versions,
    "search": search,
    "python": python,
    "grpo": grpo,
    "batch": batch,
    "logprob_mem": logprob_mem,
}


RESULT_MARK = "@@peers-worker-result@@ "


def serve() -> int:
    """Answer ``{"command", "spec"}`` lines from stdin, one result line each, until stdin closes.

    One process for every command (except the memory one, which needs a fresh process) so the
    peers' imports (transformers via trl: seconds) are paid once. Results are prefixed with
    ``RESULT_MARK`` because the peers may print to stdout themselves.
    """
    for line in sys.stdin:
        request = json.loads(line)
        try:
            result = COMMANDS[request["command"]](request["spec"])
        # A peer's own failure must become that row's note, not end the other measurements.
        except Exception as exc:  # noqa: BLE001
            result = {"__error__": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(RESULT_MARK + json.dumps(result) + "\n")
        sys.stdout.flush()
    return 0


def main(argv: list[str]) -> int:
    if argv == ["serve"]:
        return serve()
    if len(argv) != 3 or argv[0] not in COMMANDS:
        print(f"usage: peers_worker.py serve | {{{'|'.join(COMMANDS)}}} SPEC.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[1]) as fh:
        spec = json.load(fh)
    result = COMMANDS[argv[0]](spec)
    with open(argv[2], "w") as fh:
        json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
