"""python benchmarks/results/decode_attention_1130/bench_attn.py

Decode step (q_len 1) of SmolLM2 in float32 at R rows with left padding: transformers' sdpa against a
grouped-query attention without SDPA (scores per KV head, one matmul each way). Medians of interleaved steps."""
import statistics, sys, time
from pathlib import Path
import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.integrations.sdpa_attention import sdpa_attention_forward
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository
from agentrl.rollout.model import load_model
from agentrl.rollout.generators.kv_cache import roomy_cache

def grouped(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
    if query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kw)
    b, hq, _, d = query.shape
    hkv = key.shape[1]
    q = query.reshape(b, hkv, hq // hkv, d)                        # [B, Hkv, g, d]
    scores = torch.matmul(q, key.transpose(2, 3)) * scaling         # [B, Hkv, g, K]
    if attention_mask is not None:
        m = attention_mask[:, :, -1:, :]                           # [B, 1, 1, K]
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(probs, value)                               # [B, Hkv, g, d]
    return out.reshape(b, hq, 1, d).transpose(1, 2), None          # [B, 1, Hq, d]

AttentionInterface.register("grouped_decode", grouped)
ALL_MASK_ATTENTION_FUNCTIONS.register("grouped_decode", sdpa_mask)

torch.set_num_threads(2)
model, _ = load_model("smollm2-135m", dtype="float32")
model.eval()
dec = model.get_decoder()

@torch.no_grad()
def setup(rows, ctx):
    g = torch.Generator().manual_seed(0)
    lengths = [ctx - 37 * (r % 4) for r in range(rows)]  # unequal: left padding
    L = max(lengths)
    ids = torch.randint(100, 20000, (rows, L), generator=g)
    att = torch.zeros(rows, L, dtype=torch.long)
    for r, n in enumerate(lengths): att[r, L - n:] = 1
    cache = roomy_cache(64)
    model.config._attn_implementation = "sdpa"
    dec(input_ids=ids, attention_mask=att, position_ids=(att.cumsum(-1) - 1).clamp(min=0), past_key_values=cache, use_cache=True)
    return cache, att

@torch.no_grad()
def step(cache, att, impl, rows):
    model.config._attn_implementation = impl
    att = torch.cat([att, torch.ones(rows, 1, dtype=torch.long)], -1)
    pos = att.sum(-1, keepdim=True) - 1
    t = time.perf_counter()
    h = dec(input_ids=torch.full((rows, 1), 42), attention_mask=att, position_ids=pos, past_key_values=cache, use_cache=True).last_hidden_state
    return time.perf_counter() - t, att, h

for rows, ctx in [(1, 300), (8, 300), (8, 700), (16, 500)]:
    res = {}
    caches = {impl: setup(rows, ctx) for impl in ("sdpa", "grouped_decode")}
    times = {impl: [] for impl in caches}
    outs = {}
    for i in range(24):
        for impl in caches:
            c, a = caches[impl]
            dt, a, h = step(c, a, impl, rows)
            caches[impl] = (c, a)
            if i >= 4: times[impl].append(dt)
            outs[impl] = h
    diff = (outs["sdpa"] - outs["grouped_decode"]).abs().max().item()
    print(f"rows {rows:2d} ctx {ctx}: sdpa {statistics.median(times['sdpa'])*1e3:6.1f} ms  grouped {statistics.median(times['grouped_decode'])*1e3:6.1f} ms  max |diff| {diff:.2e}", flush=True)
