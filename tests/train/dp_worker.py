"""Worker for the two-process data-parallel test (run by torchrun; not a test module itself).

Usage: torchrun --nproc_per_node 2 dp_worker.py ENGINE OUT_DIR [stppo]   (ENGINE: ddp | zero1 | zero2 | zero3)
Rank r trains on group r of the fixed episode set (half the combined batch) and writes its final
parameters to OUT_DIR/rank{r}.pt; single-process mode (no torchrun) trains on both groups.
``stppo``: turn-level ratios with the clipping-bias correction, and group 0's rollouts all score
the same (advantage 0: rank 0 has no token in the clipped set and skips the correction's backward).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from train_helpers import config, episodes, step_data, tiny_lm  # noqa: E402

from agentrl.train.engines import DeepSpeedEngine, TorchEngine, init_distributed, world  # noqa: E402
from agentrl.train.learner import Policy  # noqa: E402
from agentrl.train.update import compute_advantages, ppo_update  # noqa: E402

LR = 1e-3


def main(engine_name: str, out_dir: str, objective: str = "ppo") -> None:
    torch.set_num_threads(1)
    if engine_name == "ddp":
        init_distributed("gloo")
    elif engine_name.startswith("zero"):
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    rank, world_size = world() if engine_name != "single" else (0, 1)
    all_eps = episodes(n_groups=2, group_size=4, seed=7)
    extra = []
    if objective == "stppo":
        extra = ["algo.loss=turn_ppo", "algo.clip_bias_correction=true", "algo.clip_low=0.02", "algo.clip_high=0.02"]
        for ep in all_eps[:4]:
            ep.outcome = 1.0
    mine = all_eps if engine_name == "single" else [e for e in all_eps if e.group_id == f"g{rank}"]
    cfg = config(f"train.minibatch_size={len(mine)}", "train.micro_batch_size=2", *extra)
    policy = Policy(tiny_lm(seed=11))
    if engine_name.startswith("zero"):
        engine = DeepSpeedEngine(
            policy, lr=LR, max_grad_norm=0.0, zero_stage=int(engine_name[-1]), micro_batch_size=2
        )
    else:
        engine = TorchEngine(policy, lr=LR, max_grad_norm=0.0)
    step = step_data(engine, mine, cfg)
    adv, returns, batch = compute_advantages(step)
    for i in range(2):
        ppo_update(engine, step, batch, adv, returns, None, rng=torch.Generator().manual_seed(i))
    if engine_name == "zero3":
        with engine.gathered_parameters():
            flat = torch.cat([p.detach().flatten().clone() for p in policy.parameters()])
    else:
        flat = torch.cat([p.detach().flatten() for p in policy.parameters()])
    torch.save({"params": flat, "world": world_size}, Path(out_dir) / f"rank{rank}.pt")
    if world_size > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo teardown can abort after success (MACHINE-NOTES §2); results are on disk


if __name__ == "__main__":
    main(*sys.argv[1:4])
