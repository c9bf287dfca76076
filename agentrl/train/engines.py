"""Learner engines: plain torch (one device, or DDP when a process group is up) and DeepSpeed ZeRO.

Both expose the same small surface, so the trainer never asks which one it has::

    out = engine.forward(input_ids, attention_mask, loss_mask)   # PolicyOutput
    engine.backward(loss)            # accumulate; the caller weights micro-batch losses itself
    stats = engine.step()            # clip, optimizer + scheduler step, zero grads -> {"grad_norm", "lr"}
    engine.save(dir) / engine.load(dir)
    engine.all_reduce_sum(x)         # across data-parallel ranks (identity on one process)

Gradient accumulation is owned by the caller (it tells ``backward`` which micro-batch is the
minibatch's last, where DeepSpeed reduces and steps): it weights each micro-batch's loss by its share of the
minibatch's normaliser, times the world size because data-parallel reduction averages ranks.
Then k micro-batches give exactly the gradient of one big batch.

Launch: ``torchrun --nproc_per_node N -m agentrl.cli train CFG`` or
``deepspeed --num_gpus N -m agentrl.cli train CFG``; both set the env vars ``init_process_group``
reads. DeepSpeed gets a torch optimizer, so it never JIT-builds its own Adam.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from agentrl.train.learner import Policy, PolicyOutput


def init_distributed(backend: str | None = None) -> None:
    """Join the process group that ``torchrun`` / ``deepspeed`` describe in the environment."""
    if dist.is_available() and not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))


def world() -> tuple[int, int]:
    """``(rank, world_size)``: the process group's, else what ``torchrun`` / ``deepspeed`` put in the
    environment for the group this process will join (``RANK``, ``WORLD_SIZE``), else ``(0, 1)``. The
    environment counts before the group exists: a run decides which rank writes its log and records
    before its engine joins the group (every rank wrote them when this said ``(0, 1)`` there)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _warmup(warmup_steps: int):
    return lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0


class _EngineBase:
    policy: Policy

    @property
    def rank(self) -> int:
        return world()[0]

    @property
    def world_size(self) -> int:
        return world()[1]

    @property
    def shards_parameters(self) -> bool:
        """Whether a rank holds only a shard of each parameter (ZeRO-3) rather than its full value."""
        return False

    def all_reduce_sum(self, value: Tensor) -> Tensor:
        if self.world_size > 1:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


class TorchEngine(_EngineBase):
    """AdamW + linear warm-up on the policy's trainable parameters; DDP when a process group is up."""

    def __init__(self, policy: Policy, *, lr: float, weight_decay: float = 0.0, warmup_steps: int = 0,
                 max_grad_norm: float = 1.0):  # fmt: skip
        self.policy = policy
        self.max_grad_norm = max_grad_norm
        self.params = policy.trainable_parameters()
        if self.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.module: torch.nn.Module = DistributedDataParallel(policy)
        else:
            self.module = policy
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _warmup(warmup_steps))

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor, reference: bool = False,
        start: Tensor | None = None,
    ) -> PolicyOutput:
        if reference:  # no gradient, so no DDP bookkeeping
            return self.policy(input_ids, attention_mask, loss_mask, reference=True)
        if start is not None:  # the sampler's kept states (train.reuse_sampler_hidden)
            return self.module(input_ids, attention_mask, loss_mask, start=start)
        return self.module(input_ids, attention_mask, loss_mask)

    def backward(self, loss: Tensor, last: bool = True) -> None:
        loss.backward()

    def step(self) -> dict[str, float]:
        norm = torch.nn.utils.clip_grad_norm_(
            self.params, self.max_grad_norm if self.max_grad_norm > 0 else 1e12
        )
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": float(norm), "lr": float(lr)}

    def zero_missing_grads(self) -> None:
        """Give every trainable parameter without a gradient a zero one, as a backward through a
        zero loss would (AdamW skips a parameter whose gradient is None; a zero one still moves its
        momentum): a minibatch whose rows all skipped their pass steps exactly as before."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": {k: v for k, v in self.policy.state_dict().items() if _trainable_key(self.policy, k)},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def save(self, directory: str | Path) -> None:
        if self.rank == 0:
            torch.save(self.state_dict(), Path(directory) / "engine.pt")

    def load(self, directory: str | Path) -> None:
        state = torch.load(Path(directory) / "engine.pt", map_location="cpu", weights_only=False)
        missing = self.policy.load_state_dict(state["policy"], strict=False)
        if missing.unexpected_keys:
            raise RuntimeError(f"checkpoint has keys this policy lacks: {missing.unexpected_keys[:5]}")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


def _trainable_key(policy: Policy, key: str) -> bool:
    """Save trainable tensors only (LoRA: the adapters and value head, not the frozen base)."""
    if not policy.uses_lora:
        return True
    return "lora_" in key or key.startswith("value_head.")


def deepspeed_config(*, zero_stage: int, micro_batch_size: int, bf16: bool, offload: bool,
                     max_grad_norm: float, world_size: int) -> dict[str, Any]:  # fmt: skip
    """The DeepSpeed config the trainer uses (also written as ``configs/deepspeed/*.json``)."""
    zero: dict[str, Any] = {"stage": zero_stage, "overlap_comm": False, "contiguous_gradients": True}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if offload and zero_stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "train_batch_size": micro_batch_size * world_size,
        "gradient_accumulation_steps": 1,  # the trainer marks each minibatch's last micro-batch
        "gradient_clipping": max_grad_norm if max_grad_norm > 0 else 0.0,
        "bf16": {"enabled": bf16},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,  # offload with a torch optimizer, no cpu_adam JIT build
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


class DeepSpeedEngine(_EngineBase):
    """DeepSpeed ZeRO 1/2/3 around the policy with a torch AdamW (no JIT-built optimizer)."""

    def __init__(self, policy: Policy, *, lr: float, weight_decay: float = 0.0, warmup_steps: int = 0,
                 max_grad_norm: float = 1.0, zero_stage: int = 2, micro_batch_size: int = 1,
                 bf16: bool = False, offload: bool = False):  # fmt: skip
        import deepspeed

        if not dist.is_initialized():
            deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
        self.policy = policy
        self.zero_stage = zero_stage
        params = policy.trainable_parameters()
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup(warmup_steps))
        self.config = deepspeed_config(
            zero_stage=zero_stage, micro_batch_size=micro_batch_size, bf16=bf16, offload=offload,
            max_grad_norm=max_grad_norm, world_size=self.world_size,
        )  # fmt: skip
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=policy,
            model_parameters=params,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=self.config,
        )
        self.module = self.engine

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor, reference: bool = False,
        start: Tensor | None = None,
    ) -> PolicyOutput:
        if start is not None:
            raise ValueError("train.reuse_sampler_hidden runs with engine=torch only")
        return self.engine(input_ids, attention_mask, loss_mask, reference)

    def backward(self, loss: Tensor, last: bool = True) -> None:
        # DeepSpeed reduces and steps on the micro-batch the caller marks as the boundary
        self.engine.set_gradient_accumulation_boundary(last)
        self._lr = self.optimizer.param_groups[0]["lr"]
        self.engine.backward(loss, scale_wrt_gas=False)
        self.engine.step()

    def step(self) -> dict[str, float]:
        lr = self._lr
        norm = self.engine.get_global_grad_norm()
        return {"grad_norm": float(norm) if norm is not None else float("nan"), "lr": float(lr)}

    @property
    def shards_parameters(self) -> bool:
        return self.zero_stage == 3

    def gathered_parameters(self):
        """Context in which every parameter holds its full value (ZeRO-3 gathers; others no-op)."""
        import contextlib

        if not self.shards_parameters:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.policy.parameters()), modifier_rank=None)

    def generation_context(self):
        """Around a rollout or eval phase in which a generator samples from the live model (every rank
        enters it together): under ZeRO-3 each weight is gathered once and the per-layer gather hooks
        are off while it generates (DeepSpeed's ``unwrap_model_for_generation``). Without it every
        decode step gathered each layer again, a collective that hangs once ranks decode a different
        number of steps; ZeRO-1/2 hold full weights: nothing to do."""
        import contextlib

        if not self.shards_parameters:
            return contextlib.nullcontext()
        from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation

        return unwrap_model_for_generation(self.engine)

    def save(self, directory: str | Path) -> None:
        self.engine.save_checkpoint(str(directory), tag="engine")

    def load(self, directory: str | Path) -> None:
        path, _ = self.engine.load_checkpoint(str(directory), tag="engine")
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory}/engine")


def make_engine(policy: Policy, config: Any) -> TorchEngine | DeepSpeedEngine:
    """The engine ``config.train.engine`` names, built from the run config."""
    train = config.train
    common = dict(
        lr=train.lr, weight_decay=train.weight_decay, warmup_steps=train.warmup_steps,
        max_grad_norm=train.max_grad_norm,
    )  # fmt: skip
    if train.engine == "deepspeed":
        return DeepSpeedEngine(
            policy, **common, zero_stage=train.zero_stage, micro_batch_size=train.micro_batch_size,
            bf16=config.model.dtype == "bfloat16", offload=train.offload,
        )  # fmt: skip
    init_distributed()
    return TorchEngine(policy, **common)


__all__ = ["DeepSpeedEngine", "TorchEngine", "deepspeed_config", "init_distributed", "make_engine", "world"]
