"""The learner from the sampler's kept states (``train.reuse_sampler_hidden``) against the full forward.

One quickstart tree through the learner: SmolLM2-135M, the top 10 of 30 blocks trained
(``train.trainable_layers: 10``), 16 rows sharing a 600-token prefix (the trunk), each with its own
45-token tail (a branch's answer), forward + backward of the tails' log-probs, in the machine's
float32 (run it under ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` for an AVX2-only CPU).
Rows: seconds per tree (median of the repeats) and the process's peak RSS growth, for the full
forward (blocks 1-30) and for the learner started at block 21 from the states block 21 received,
which is what the generator keeps during the rollout; and the largest log-prob difference between
the two.

    python benchmarks/bench_frozen_start.py            # 16 x (600 + 45), 3 repeats
    python benchmarks/bench_frozen_start.py --quick    # 4 x (200 + 20), 1 repeat
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import Row, median, parser, print_table, timeit, write_json  # noqa: E402


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    import torch

    from agentrl.rollout.model import load_model
    from agentrl.train.learner import Policy, freeze_below

    rows, prefix, tail, repeat = (4, 200, 20, 1) if args.quick else (16, 600, 45, 3)
    model, _ = load_model("smollm2-135m", dtype="float32", device="cpu")
    blocks = len(model.get_decoder().layers)
    first = blocks - 10
    freeze_below(model, 10)
    policy = Policy(model, temperature=0.6)
    policy.start_layer = first
    policy.train()
    g = torch.Generator().manual_seed(0)
    trunk = torch.randint(100, 40_000, (prefix,), generator=g)
    ids = torch.stack([torch.cat([trunk, torch.randint(100, 40_000, (tail,), generator=g)]) for _ in range(rows)])
    attention = torch.ones_like(ids)
    loss_mask = torch.zeros(ids.shape)
    loss_mask[:, prefix:] = 1
    seen: dict[str, torch.Tensor] = {}

    def keep(module, args, kwargs):  # what the generator's tap keeps: block `first`'s input
        seen["h"] = (args[0] if args else kwargs["hidden_states"]).detach()

    handle = model.get_decoder().layers[first].register_forward_pre_hook(keep, with_kwargs=True)
    with torch.no_grad():
        model.get_decoder()(input_ids=ids, attention_mask=attention)
    handle.remove()
    start = seen["h"]
    results: dict[str, tuple[float, float, torch.Tensor]] = {}
    for name, given in (("full", None), ("from_sampler", start)):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        logp = []

        def step(given: torch.Tensor | None = given, logp: list = logp) -> None:
            model.zero_grad(set_to_none=True)
            out = policy(ids, attention, loss_mask, start=given)
            (out.logp * loss_mask).sum().backward()
            logp[:] = [out.logp.detach()]

        seconds = median(timeit(step, repeat=repeat, warmup=1))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20 - before
        results[name] = (seconds, peak, logp[0])
    full, mine = results["full"], results["from_sampler"]
    shape = f"{rows} x ({prefix} + {tail}) tokens, top 10 of {blocks} blocks trained"
    table = [
        Row("learner, every block: s per tree", full[0], "s", note=shape),
        Row(f"learner from block {first + 1}: s per tree", mine[0], "s", "every block", full[0]),
        Row("peak RSS growth, every block", full[1], "GiB", note="ru_maxrss: the first case sets the peak"),
        Row(f"peak RSS growth, from block {first + 1}", mine[1], "GiB", note="0: below the first case's peak"),
        Row("largest log-prob difference", float((full[2] - mine[2]).abs().max()), "nats"),
    ]
    print_table(table, "learner from the sampler's states")
    write_json(args.json_path, "frozen_start", table, args.quick)


if __name__ == "__main__":
    main()
