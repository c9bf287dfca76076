"""The built-in model's forward alone: prefill and decode throughput of one lock-step batch.

What the in-process generator cannot beat: a batch of ``--batch`` prompts of ``--context`` random
tokens is prefilled in one forward into the generator's own cache (``roomy_cache``), then decoded
``--steps`` single-token steps, in float32 and (``--bf16``) under bfloat16 autocast. Compare its
tokens/s with a rollout's to see how much of a rollout step is the model and how much the loop.
``--head`` adds the decode step with the LM head prepacked for oneDNN (what the generator uses on
CPU, :mod:`agentrl.rollout.generators.head`) and the head's product alone, ``F.linear`` vs prepacked.
``--shared`` runs the generator itself on a tree-like batch (``--batch`` rows repeating ``--prompts``
distinct prompts of ``--context`` tokens, each cached by an earlier turn): each prompt's K/V copied
per row vs held once (:mod:`agentrl.rollout.generators.batch_rows`), decode step and peak RSS growth.

    python benchmarks/bench_decode.py                  # batch 32 x 640 tokens, 20 steps (the quickstart's tree answer turn)
    python benchmarks/bench_decode.py --batch 16 --bf16
    python benchmarks/bench_decode.py --batch 16 --head
    python benchmarks/bench_decode.py --batch 16 --shared --prompts 2
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
from agentrl.rollout.generators.kv_cache import cache_arg, roomy_cache  # noqa: E402
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
        model(input_ids=ids, attention_mask=attention, **{cache_arg(model): cache}, use_cache=True, logits_to_keep=1)
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


def shared_rows(model, tokenizer, args) -> list[Row]:
    """The generator's decode step on ``args.batch`` rows repeating ``args.prompts`` cached prompts,
    with each prompt's K/V copied per row and held once; a fresh process per layout, so each peak
    RSS growth is its own."""
    import json
    import subprocess

    rows: list[Row] = []
    base = None
    for share in (False, True):
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import bench_decode as b; "
                f"b.shared_case({args.batch}, {args.prompts}, {args.context}, {args.steps}, {share})")  # fmt: skip
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        name = "held once" if share else "copied per row"
        shape = f"{args.batch} rows, {args.prompts} prompts x {args.context}"
        rows.append(Row(f"generator decode step, {shape}, K/V {name}", result["step_ms"], "ms",
                        baseline="copied per row" if share else None, baseline_value=base if share else None,
                        note=f"peak RSS +{result['peak_gib']:.2f} GiB"))  # fmt: skip
        base = base or result["step_ms"]
    return rows


def shared_case(batch: int, prompts: int, context: int, steps: int, share: bool) -> None:
    """Runs in a subprocess: prints ``{"step_ms", "peak_gib"}`` of one timed generate call."""
    import json

    from agentrl.rollout.generators.base import SamplingParams
    from agentrl.rollout.generators.hf import HFGenerator
    from agentrl.train.memory import peak_rss_gib, release_heap, reset_peak

    model, tokenizer = load_model("smollm2-135m")
    gen = HFGenerator(model, tokenizer, max_batch_size=batch, prefix_cache_tokens=1 << 16, share_prompts=share)
    rng = torch.Generator().manual_seed(0)
    distinct = [torch.randint(100, 20000, (context,), generator=rng).tolist() for _ in range(prompts)]
    sampling = SamplingParams(max_new_tokens=steps, temperature=0.0, stop_ids=())
    gen.generate(distinct, SamplingParams(max_new_tokens=2, temperature=0.0))  # an earlier turn caches them
    wave = [distinct[i * prompts // batch] for i in range(batch)]
    release_heap()
    reset_peak()
    before = peak_rss_gib() or 0.0
    out = gen.generate(wave, sampling)[0]
    fed = max(len(out.ids) - 1, 1)
    step_ms = (out.timings["generate_s"] - out.timings["prefill_s"]) / fed * 1000
    print(json.dumps({"step_ms": step_ms, "peak_gib": (peak_rss_gib() or 0.0) - before}))


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
    p.add_argument("--shared", action="store_true", help="also the generator on rows repeating cached prompts")
    p.add_argument("--prompts", type=int, default=2, help="distinct prompts among the rows (--shared)")
    args = p.parse_args()
    if args.quick:
        args.batch, args.context, args.steps, args.prompts = 2, 32, 2, 1
    model, tokenizer = load_model("smollm2-135m")
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
    if args.shared or args.quick:
        rows += shared_rows(model, tokenizer, args)
    print_table(rows, f"decode, {torch.get_num_threads()} threads")
    write_json(args.json_path, "decode", rows, args.quick)


if __name__ == "__main__":
    main()
