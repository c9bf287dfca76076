"""The built-in model's forward alone: prefill and decode throughput of one lock-step batch.

What the in-process generator cannot beat: a batch of ``--batch`` prompts of ``--context`` random
tokens is prefilled in one forward into the generator's own cache (``roomy_cache``), then decoded
``--steps`` single-token steps, in float32 and (``--bf16``) under bfloat16 autocast. Compare its
tokens/s with a rollout's to see how much of a rollout step is the model and how much the loop.
``--head`` adds the decode step with the LM head prepacked for oneDNN (what the generator uses on
CPU, :mod:`agentrl.rollout.generators.head`) and the head's product alone, ``F.linear`` vs prepacked.

    python benchmarks/bench_decode.py                  # batch 32 x 640 tokens, 20 steps (the quickstart's tree answer turn)
    python benchmarks/bench_decode.py --batch 16 --bf16
    python benchmarks/bench_decode.py --batch 16 --head
    python benchmarks/bench_decode.py --quick          # batch 2 x 32 tokens, 2 steps
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from common import Row, parser, print_table, write_json  # noqa: E402

from agentrl.rollout.generators.head import last_logits, packed_head_for  # noqa: E402
from agentrl.rollout.generators.kv_cache import roomy_cache  # noqa: E402
from agentrl.rollout.model import load_model  # noqa: E402


@torch.no_grad()
def measure(model, batch: int, context: int, steps: int, bf16: bool, head=None) -> tuple[float, float]:
    """(prefill seconds, mean decode-step seconds) of one batch; ``head``: decode through it."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 20000, (batch, context), generator=gen)
    attention = torch.ones(batch, context, dtype=torch.long)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        cache = roomy_cache(steps + 1)
        start = time.perf_counter()
        model(input_ids=ids, attention_mask=attention, past_key_values=cache, use_cache=True, logits_to_keep=1)
        prefill = time.perf_counter() - start
        position = torch.full((batch, 1), context - 1)
        start = time.perf_counter()
        for _ in range(steps):
            attention = torch.cat([attention, torch.ones(batch, 1, dtype=torch.long)], -1)
            position = position + 1
            last_logits(model, head, input_ids=ids[:, :1], attention_mask=attention, position_ids=position,
                        past_key_values=cache)  # fmt: skip
        return prefill, (time.perf_counter() - start) / steps


@torch.no_grad()
def head_rows(model, args, base_decode: float) -> list[Row]:
    """The decode step through the prepacked head, and the head's product alone both ways."""
    head = packed_head_for(model)
    if head is None:
        return [Row("prepacked LM head", 0.0, "ms", note="not available here (see agentrl/rollout/generators/head.py)")]
    _, step = measure(model, args.batch, args.context, args.steps, False, head)
    shape = f"batch {args.batch} x {args.context}"
    rows = [Row(f"decode step {shape}, float32, prepacked head", step * 1000, "ms", baseline="float32",
                baseline_value=base_decode, note=f"{args.batch / step:.0f} tok/s")]  # fmt: skip
    hidden = torch.randn(args.batch, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    weight = model.get_output_embeddings().weight
    plain = timed(lambda: torch.nn.functional.linear(hidden, weight), args.steps)
    rows.append(Row(f"LM head [{args.batch}, {weight.shape[1]}] x [{weight.shape[1]}, {weight.shape[0]}], F.linear",
                    plain * 1000, "ms"))  # fmt: skip
    rows.append(Row("LM head, prepacked", timed(lambda: head(hidden), args.steps) * 1000, "ms",
                    baseline="F.linear", baseline_value=plain * 1000))  # fmt: skip
    return rows


def timed(fn, repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=640)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--bf16", action="store_true", help="also under bfloat16 autocast")
    p.add_argument("--head", action="store_true", help="also with the prepacked LM head, and the head alone")
    args = p.parse_args()
    if args.quick:
        args.batch, args.context, args.steps = 2, 32, 2
    model, _ = load_model("smollm2-135m")
    rows: list[Row] = []
    base_decode = None
    for bf16 in (False, True) if args.bf16 else (False,):
        name = "bf16 autocast" if bf16 else "float32"
        prefill, step = measure(model, args.batch, args.context, args.steps, bf16)
        shape = f"batch {args.batch} x {args.context}"
        rows.append(Row(f"prefill {shape}, {name}", args.batch * args.context / prefill, "tok/s"))
        rows.append(Row(f"decode step {shape}, {name}", step * 1000, "ms",
                        baseline="float32" if bf16 else None, baseline_value=base_decode if bf16 else None,
                        note=f"{args.batch / step:.0f} tok/s"))  # fmt: skip
        base_decode = base_decode or step * 1000
    if args.head or args.quick:  # quick: so CI runs the head rows too
        rows += head_rows(model, args, base_decode)
    print_table(rows, f"decode, {torch.get_num_threads()} threads")
    write_json(args.json_path, "decode", rows, args.quick)


if __name__ == "__main__":
    main()
