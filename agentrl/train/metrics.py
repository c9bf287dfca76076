"""Training metrics: console (rich), JSONL, TensorBoard, Weights & Biases, and a PNG curve at the end.

Keys are namespaced (``env/``, ``rollout/``, ``loss/``, ``perf/``, ``eval/``). Only rank 0 writes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def context_metrics(episodes: list[Any], folding: str = "none") -> dict[str, float]:
    """Working-context size and folding activity per finished episode (means).

    ``ctx/main_tokens``: tokens of the main thread (segment ``fold_id`` 0: prompt, outputs,
    observations) at the episode's end; ``ctx/peak_tokens``: the largest single context (segment)
    the policy saw; with folding ``fold/branches`` (branch segments), ``fold/summaries``, and the
    FoldGRPO process rewards ``fold/process_penalty`` (sum of Q), ``fold/penalised_tokens`` and
    ``fold/penalised_in_success`` (penalised tokens of episodes with a positive outcome: the only ones
    FoldGRPO's ``clip(R + Q, 0, 1)`` lets Q change, since a failed rollout's clips to 0 either way; 0
    means FoldGRPO's advantage equals GRPO's).
    With ``folding`` (``rollout.folding``) other than none the fold counts are logged even when no
    episode folded (0: the policy never branched), so a reader sees that, not a missing value.
    """
    done = [ep for ep in episodes if not ep.failed]
    if not done:
        return {}

    def mean(values: list[float]) -> float:
        return float(sum(values) / len(values))

    lengths = [[len(s.token_ids()) for s in ep.segments] for ep in done]
    out = {
        "ctx/main_tokens": mean(
            [sum(len(s.token_ids()) for s in ep.segments if s.fold_id == 0) for ep in done]
        ),
        "ctx/peak_tokens": mean([max(n, default=0) for n in lengths]),
    }
    if folding != "none" or any(len(ep.segments) > 1 for ep in done):
        out["fold/branches"] = mean([sum(s.kind == "branch" for s in ep.segments) for ep in done])
        out["fold/summaries"] = mean([sum(s.kind == "summary" for s in ep.segments) for ep in done])
    qs = [[q for t in ep.turns for q in (t.process_reward or ())] for ep in done]
    if any(t.process_reward is not None for ep in done for t in ep.turns):
        out["fold/process_penalty"] = mean([sum(q) for q in qs])
        hits = [sum(x < 0 for x in q) for q in qs]  # penalised tokens per episode
        out["fold/penalised_tokens"] = mean(hits)
        out["fold/penalised_in_success"] = mean(
            [n if ep.outcome > 0 else 0 for ep, n in zip(done, hits, strict=True)]
        )
    return out


class MetricsLogger:
    """Fan one ``log(step, metrics)`` call out to every configured sink.

    Args:
        out_dir: run folder; ``metrics.jsonl``, ``tb/`` and ``curve.png`` go there.
        enabled: False on non-zero ranks (everything becomes a no-op).
        tensorboard: write TensorBoard events when ``tensorboard`` is installed.
        wandb: also log to Weights & Biases (must be installed; raises otherwise).
        run_config: stored with the W&B run.
        console: where the one-line summaries go.
    """

    def __init__(self, out_dir: str | Path, *, enabled: bool = True, tensorboard: bool = True,
                 wandb: bool = False, run_config: dict[str, Any] | None = None,
                 console: Console | None = None, resume: bool = False):  # fmt: skip
        self.out_dir = Path(out_dir)
        self.enabled = enabled
        self.console = console or Console()
        self.history: list[dict[str, Any]] = []
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.out_dir / "metrics.jsonl"
        if resume and self.jsonl.exists():
            lines = [line for line in self.jsonl.read_text().splitlines() if line.strip()]
            if lines and not lines[-1].endswith("}"):
                lines.pop()  # a record torn by a kill mid-write; the resumed run writes it again
            self.history = [json.loads(line) for line in lines]
        elif self.jsonl.exists():
            self.jsonl.unlink()
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional
                SummaryWriter = None  # noqa: N806
            if SummaryWriter is not None:
                self._tb = SummaryWriter(str(self.out_dir / "tb"))
        if wandb:
            try:
                import wandb as wandb_lib
            except ImportError as exc:
                raise RuntimeError("train.wandb=true but wandb is not installed: pip install wandb") from exc
            self._wandb = wandb_lib.init(project="agentrl", dir=str(self.out_dir), config=run_config or {})

    def truncate(self, step: int) -> None:
        """Forget records after ``step`` (a resumed run replays them)."""
        if not self.enabled:
            return
        self.history = [r for r in self.history if r.get("step", 0) <= step]
        self.jsonl.write_text("".join(json.dumps(r) + "\n" for r in self.history))

    def log(self, step: int, metrics: dict[str, float], *, echo: tuple[str, ...] = ()) -> None:
        """Record ``metrics`` at ``step``; print the ``echo`` keys on one console line."""
        if not self.enabled:
            return
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.history.append(record)
        with open(self.jsonl, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in metrics.items():
                if math.isfinite(float(value)):
                    self._tb.add_scalar(key, float(value), step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        if echo:
            shown = "  ".join(f"{k.split('/')[-1]}={metrics[k]:.3g}" for k in echo if k in metrics)
            self.console.print(f"[bold]step {step}[/bold]  {shown}")

    def table(self, title: str, rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
        if not self.enabled:
            return
        table = Table(title=title)
        for name in header:
            table.add_column(name)
        for row in rows:
            table.add_row(*row)
        self.console.print(table)

    def plot(self, keys: tuple[str | tuple[str, ...], ...] = ("env/reward", "eval/success", "loss/policy")) -> Path | None:
        """Training curves of ``keys`` against step, saved as ``curve.png`` (a tuple of keys: one panel)."""
        if not self.enabled or not self.history:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        # a tuple of keys shares one panel (a mixture's per-env curves), with a legend
        panels = [tuple(k for k in (key if isinstance(key, tuple) else (key,)) if any(k in r for r in self.history))
                  for key in keys]  # fmt: skip
        present = [p for p in panels if p]
        if not present:
            return None
        fig, axes = plt.subplots(1, len(present), figsize=(4.5 * len(present), 3.4), squeeze=False)
        for ax, panel in zip(axes[0], present, strict=True):
            for key in panel:
                points = [(r["step"], r[key]) for r in self.history if key in r]
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=key)
            ax.set_title(panel[0] if len(panel) == 1 else f"{panel[0].split('/')[0]}/<env>/{panel[0].rsplit('/', 1)[-1]}")
            if len(panel) > 1:
                ax.legend(fontsize=7)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        path = self.out_dir / "curve.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


__all__ = ["MetricsLogger", "context_metrics"]
