"""Time every advantage estimator and loss next to one model forward pass on the same batch (CPU).

The objectives run on ``[B, L]`` tensors (default 256 x 8192) exactly as the trainer calls them:
estimators through ``ADVANTAGES.get(name).from_batch`` (token advantages out, no grad), losses
through ``LOSSES.get(name).from_batch`` forward + backward to the log-probs.

The reference is a forward pass of the built-in model's architecture (SmolLM2-135M: Llama, 30
layers, hidden 576, 9 heads, 3 KV heads, vocab 49152, intermediate 1536, tied embeddings),
randomly initialised, fp32, logits included. Running it on B*L = 2M tokens would take hours on
this CPU, so it is measured on a short batch and extrapolated linearly per token. Attention grows
with sequence length, so the real 8192-token forward costs more than the extrapolation: the
"% of forward" column is an upper bound.

    python benchmarks/bench_objectives.py            # 256 x 8192, forward measured on 1 x 512
    python benchmarks/bench_objectives.py --quick    # small sizes (CI keeps the script alive)
    python benchmarks/bench_objectives.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import agentrl.algos  # noqa: F401  (registers the entries)
from agentrl.algos.losses import agg_loss
from agentrl.registry import ADVANTAGES, KL_ESTIMATORS, LOSSES

SMOLLM2_135M = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "intermediate_size": 1536,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
}


def make_batch(rows: int, length: int, turns: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A synthetic multi-turn batch: prompt, then ``turns`` x (assistant span, observation)."""
    gen = torch.Generator().manual_seed(seed)
    prompt = length // 32
    per_turn = (length - prompt) // turns
    obs = per_turn // 4
    pos = torch.arange(length)
    in_turns = (pos >= prompt) & (pos < prompt + per_turn * turns)
    turn_of = torch.div(pos - prompt, per_turn, rounding_mode="floor")
    assistant = in_turns & ((pos - prompt) % per_turn < per_turn - obs)
    turn_id = torch.where(assistant, turn_of, -1).expand(rows, length).contiguous()  # [B, L]
    loss_mask = turn_id >= 0
    old = -torch.rand(rows, length, generator=gen) * 3  # [B, L]
    n_rollouts = rows // 2  # every rollout is 2 rows (main + branch) for the folding estimators
    group = torch.arange(rows) // 8
    last_tok = (prompt + per_turn * turns - obs - 1) * torch.ones(rows, dtype=torch.long)
    rewards = torch.zeros(rows, length)
    rewards[torch.arange(rows), last_tok] = (torch.rand(rows, generator=gen) < 0.5).float()
    return {
        "loss_mask": loss_mask,
        "turn_id": turn_id,
        "logp": (old + 0.05 * torch.randn(rows, length, generator=gen)).requires_grad_(True),
        "old_logp": old,
        "ref_logp": old + 0.02 * torch.randn(rows, length, generator=gen),
        "entropy": torch.rand(rows, length, generator=gen) * 4,
        "values": torch.randn(rows, length, generator=gen).requires_grad_(True),
        "old_values": torch.randn(rows, length, generator=gen),
        "token_rewards": rewards,
        "process_reward": -0.2 * (torch.rand(rows, length, generator=gen) < 0.1).float(),
        "token_kind": torch.randint(0, 6, (rows, length), generator=gen),
        "full_ctx_logp": old + 0.1 * torch.randn(rows, length, generator=gen),
        "outcome": (torch.rand(rows, generator=gen) < 0.5).float(),
        "group_id": group,
        "task_group": group // 2,  # [R] every tree of a task (tree_grpo/tree_inter): 2 trees of 8 per task
        "row_rollout": torch.arange(rows),
        "finished": torch.rand(rows, generator=gen) < 0.9,
        "gt_logprob": -torch.rand(rows, turns + 1, generator=gen) * 5,
        "step_reward": torch.rand(rows, turns, generator=gen),
        "anchor_id": torch.randint(0, 4, (rows, turns), generator=gen),
        "_fold_outcome": (torch.rand(n_rollouts, generator=gen) < 0.5).float(),
        "_fold_group": torch.arange(n_rollouts) // 8,
        "_fold_row_rollout": torch.arange(rows) // 2,
    }


def timed(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time in ms over ``repeats`` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def objective_cases(batch: dict[str, torch.Tensor]) -> list[tuple[str, Callable[[], Any]]]:
    fold_batch = dict(batch)
    fold_batch.update(
        outcome=batch["_fold_outcome"],
        group_id=batch["_fold_group"],
        row_rollout=batch["_fold_row_rollout"],
        finished=batch["finished"][: batch["_fold_outcome"].shape[0]],
    )
    cases: list[tuple[str, Callable[[], Any]]] = []
    for name in ADVANTAGES.names():
        source = fold_batch if name in ("foldgrpo", "supo") else batch
        cases.append((f"adv/{name}", lambda n=name, b=source: ADVANTAGES.get(n).from_batch(b)))

    adv, returns = ADVANTAGES.get("gae").from_batch(batch)
    logp, values = batch["logp"], batch["values"]

    def backward(out: tuple[torch.Tensor, dict[str, float]], leaf: torch.Tensor) -> None:
        torch.autograd.grad(out[0], leaf)

    loss_options: dict[str, dict[str, Any]] = {"turn_ppo": {}, "ppo_clip": {"dual_clip": 3.0}}
    for name in LOSSES.names():
        if name == "value":
            cases.append(
                ("loss/value", lambda: backward(LOSSES.get("value").from_batch(batch, returns), values))
            )
            continue
        opts = loss_options.get(name, {})
        cases.append(
            (f"loss/{name}", lambda n=name, o=opts: backward(LOSSES.get(n).from_batch(batch, adv, **o), logp))
        )
    k3 = KL_ESTIMATORS.get("k3")
    cases.append(
        (
            "kl/k3 (+agg)",
            lambda: torch.autograd.grad(
                agg_loss(k3(logp, batch["ref_logp"], mask=batch["loss_mask"]), batch["loss_mask"]), logp
            ),
        )
    )
    return cases


def forward_ms_per_token(tokens: int, repeats: int) -> tuple[float, float]:
    """Forward time of the SmolLM2-135M architecture (random init) on ``1 x tokens``: (ms, ms/token)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).eval()
    ids = torch.randint(0, SMOLLM2_135M["vocab_size"], (1, tokens))
    with torch.inference_mode():
        ms = timed(lambda: model(input_ids=ids).logits, repeats)
    return ms, ms / tokens


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (8 x 512, forward on 64 tokens)")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--length", type=int, default=None)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--forward-tokens", type=int, default=None, help="tokens in the measured forward")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per objective (median)")
    parser.add_argument("--json", default=None, help="also write the results to this path")
    args = parser.parse_args()
    rows = args.rows or (8 if args.quick else 256)
    length = args.length or (512 if args.quick else 8192)
    turns = 4 if args.quick and args.turns == 16 else args.turns
    fwd_tokens = args.forward_tokens or (64 if args.quick else 512)
    repeats = args.repeats or 5  # objectives are cheap; the median of 5 rides out scheduler noise
    fwd_repeats = 1 if args.quick else 2

    batch = make_batch(rows, length, turns)
    results = [(name, timed(fn, repeats)) for name, fn in objective_cases(batch)]
    fwd_ms, per_token = forward_ms_per_token(fwd_tokens, fwd_repeats)
    total_tokens = rows * length
    fwd_full = per_token * total_tokens

    print(f"objectives on [{rows}, {length}] fp32 tensors ({turns} turns/row), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")  # fmt: skip
    print(
        f"forward reference: SmolLM2-135M architecture (random init, fp32, logits) measured on 1 x {fwd_tokens} "
        f"tokens = {fwd_ms:.1f} ms ({per_token:.3f} ms/token), extrapolated linearly to {total_tokens} tokens "
        f"= {fwd_full / 1000:.1f} s (attention is superlinear in length: a lower bound on the real forward)"
    )
    print(f"{'name':<22} {'ms':>10} {'% of forward':>13}")
    print("-" * 47)
    for name, ms in results:
        print(f"{name:<22} {ms:>10.1f} {100 * ms / fwd_full:>12.3f}%")
    total = sum(ms for _, ms in results)
    print("-" * 47)
    print(f"{'sum of all rows':<22} {total:>10.1f} {100 * total / fwd_full:>12.3f}%")
    if args.json:
        baseline = f"SmolLM2-135M-arch forward on {rows}x{length} tokens (extrapolated from 1x{fwd_tokens})"
        note = f"[{rows}, {length}] fp32, {turns} turns/row, losses fwd+bwd"
        payload = {
            "bench": "objectives",
            "machine": f"{platform.machine()}/{os.cpu_count()} cpus/{torch.get_num_threads()} threads",
            "quick": bool(args.quick),
            "rows": [
                {
                    "name": name,
                    "value": round(ms, 3),
                    "unit": "ms",
                    "baseline": baseline,
                    "baseline_value": round(fwd_full, 1),
                    "ratio": ms / fwd_full,
                    "note": note,
                }
                for name, ms in results
            ],
        }
        payload["rows"].insert(
            0,
            {
                "name": "forward (SmolLM2-135M arch, random init)",
                "value": round(fwd_full, 1),
                "unit": "ms",
                "note": f"measured {fwd_ms:.1f} ms on 1x{fwd_tokens} tokens, extrapolated linearly (lower bound)",
            },
        )
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=2)


if __name__ == "__main__":
    main()
