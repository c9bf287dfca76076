"""Generators: HF sampling log-probs/entropy, batching invariance, scoring, HTTP path end to end."""

from __future__ import annotations

import asyncio
import math
import random
import socket
import threading

import httpx
import pytest
import torch

from agentrl.errors import GeneratorError
from agentrl.registry import GENERATORS
from agentrl.rollout.batcher import Batcher
from agentrl.rollout.generators.base import SamplingParams, make_generator
from agentrl.rollout.generators.hf import SHORT_SUFFIX, HFGenerator
from agentrl.rollout.generators.openai import OpenAIGenerator
from agentrl.serve.server import BackgroundServer, build_app


@pytest.fixture(scope="module")
def gen(tiny, tokenizer):
    return HFGenerator(tiny, tokenizer, max_batch_size=4)


def _reference_logp(model, prompt, ids, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(ids)])).logits[0].float()  # [L, V]
    logp = torch.log_softmax(logits / temperature, -1)
    rows = logp[len(prompt) - 1 : len(prompt) - 1 + len(ids)]  # [n, V]
    taken = rows.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
    entropy = -(rows.exp() * rows).sum(-1)
    return taken, entropy


def test_sampler_logprobs_and_entropy_match_a_forward_pass(gen, tiny, tokenizer):
    prompt = tokenizer.encode("The tool said: 42. So the answer is", add_special_tokens=False)
    out = gen.generate([prompt], SamplingParams(max_new_tokens=12, temperature=0.7, seed=5))[0]
    assert len(out.ids) == len(out.logprobs) == len(out.entropy) > 0
    taken, entropy = _reference_logp(tiny, prompt, out.ids, 0.7)
    assert torch.allclose(torch.tensor(out.logprobs), taken, atol=1e-4)
    assert torch.allclose(torch.tensor(out.entropy), entropy, atol=1e-3)


def test_greedy_batching_is_invariant_to_padding(gen, tokenizer):
    prompts = [
        tokenizer.encode(t, add_special_tokens=False) for t in ("hi", "a much longer prompt here", "x y")
    ]
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0)
    batched = gen.generate(prompts, sampling)
    for prompt, out in zip(prompts, batched, strict=True):
        alone = gen.generate([prompt], sampling)[0]
        assert out.ids == alone.ids
        assert max(abs(a - b) for a, b in zip(out.logprobs, alone.logprobs, strict=True)) < 1e-4


def test_seeded_sampling_repeats_and_stops_on_eos(gen, tokenizer):
    prompt = tokenizer.encode("hello", add_special_tokens=False)
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, seed=11)
    assert gen.generate([prompt], sampling)[0].ids == gen.generate([prompt], sampling)[0].ids
    eos = tokenizer.eos_token_id
    forced = gen.generate([prompt], SamplingParams(max_new_tokens=8, temperature=1.0, stop_ids=(), seed=1))[0]
    assert forced.finish_reason in ("stop", "length")
    if forced.finish_reason == "stop":
        assert forced.ids[-1] == eos
    else:
        assert len(forced.ids) == 8 and eos not in forced.ids


def test_stop_ids_end_the_turn_and_are_kept(gen, tokenizer):
    prompt = tokenizer.encode("hello", add_special_tokens=False)
    first = gen.generate([prompt], SamplingParams(max_new_tokens=4, temperature=0.0))[0]
    stopped = gen.generate(
        [prompt], SamplingParams(max_new_tokens=4, temperature=0.0, stop_ids=(first.ids[1],))
    )[0]
    cut = first.ids.index(first.ids[1])  # the stop id may also be the first token
    assert stopped.ids == first.ids[: cut + 1]
    assert stopped.finish_reason == "stop"


def test_top_p_tiny_equals_greedy(gen, tokenizer):
    prompt = tokenizer.encode("one two three", add_special_tokens=False)
    greedy = gen.generate([prompt], SamplingParams(max_new_tokens=5, temperature=0.0))[0]
    nucleus = gen.generate([prompt], SamplingParams(max_new_tokens=5, temperature=1.0, top_p=1e-6, seed=3))[0]
    assert nucleus.ids == greedy.ids


def test_score_matches_teacher_forcing(gen, tiny, tokenizer):
    context = tokenizer.encode("Question: capital of France? Answer:", add_special_tokens=False)
    target = tokenizer.encode(" Paris", add_special_tokens=False)
    other = tokenizer.encode(" the city of Lyon", add_special_tokens=False)
    scores = gen.score([context, context[:3]], [target, other])
    ref0, _ = _reference_logp(tiny, context, target, 1.0)
    ref1, _ = _reference_logp(tiny, context[:3], other, 1.0)
    assert torch.allclose(torch.tensor(scores[0]), ref0, atol=1e-4)
    assert torch.allclose(torch.tensor(scores[1]), ref1, atol=1e-4)
    mean = gen.score_mean([context], [target])[0]
    assert math.isclose(mean, float(ref0.mean()), abs_tol=1e-4)


def test_bad_prompts_fail_clearly(gen):
    with pytest.raises(GeneratorError, match="empty"):
        gen.generate([[]], SamplingParams())
    with pytest.raises(GeneratorError, match="outside the vocabulary"):
        gen.generate([[10**7]], SamplingParams())


def test_update_weights_changes_outputs(tokenizer):
    from agentrl.rollout.model import tiny_model

    a, b = tiny_model(tokenizer, seed=1), tiny_model(tokenizer, seed=2)
    gen_a = HFGenerator(a, tokenizer)
    prompt = tokenizer.encode("weights", add_special_tokens=False)
    sampling = SamplingParams(max_new_tokens=3, temperature=0.0)
    expected = HFGenerator(b, tokenizer).generate([prompt], sampling)[0]
    gen_a.update_weights(b.named_parameters())
    got = gen_a.generate([prompt], sampling)[0]
    assert got.ids == expected.ids and got.logprobs == pytest.approx(expected.logprobs, abs=1e-6)
    with pytest.raises(GeneratorError, match="no parameter"):
        gen_a.update_weights([("nope", torch.zeros(1))])


def test_registry_and_factory(tiny, tokenizer):
    assert {"hf", "vllm", "openai"} <= set(GENERATORS.names())
    assert isinstance(make_generator("hf", model=tiny, tokenizer=tokenizer), HFGenerator)
    with pytest.raises(GeneratorError, match="vLLM"):
        make_generator("vllm", model_name="smollm2-135m")


def test_batcher_merges_concurrent_requests(gen, tokenizer):
    prompts = [tokenizer.encode(f"prompt number {i}", add_special_tokens=False) for i in range(6)]
    sampling = SamplingParams(max_new_tokens=4, temperature=0.0)
    direct = gen.generate(prompts, sampling)

    async def main():
        batcher = Batcher(gen, max_batch_size=8)
        outs = await asyncio.gather(*(batcher.submit(p, sampling) for p in prompts))
        await batcher.stop()
        return outs, batcher.calls

    outs, calls = asyncio.run(main())
    assert [o.ids for o in outs] == [o.ids for o in direct]
    assert calls == 1


# ---------------------------------------------------------------------- HTTP
def test_serve_and_openai_backend_end_to_end(gen, tokenizer):
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in ("<tool_call>", "answer: 7", "hi")]
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0)
    local = gen.generate(prompts, sampling)
    with BackgroundServer(build_app(gen, tokenizer, "tiny")) as server:
        client = OpenAIGenerator(server.url, model="tiny")
        remote = client.generate(prompts, sampling)
        for a, b in zip(local, remote, strict=True):
            assert a.ids == b.ids
            assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)
            assert b.entropy == pytest.approx(a.entropy, abs=1e-4)
            assert a.finish_reason == b.finish_reason
        assert httpx.get(server.url + "/models").json()["data"][0]["id"] == "tiny"
        chat = httpx.post(
            server.url + "/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0},
        ).json()
        assert chat["usage"]["completion_tokens"] <= 3
        bad = httpx.post(server.url + "/completions", json={"prompt": [], "max_tokens": 2})
        assert bad.status_code == 400
        with pytest.raises(GeneratorError, match="HTTP 400"):
            client.generate([[10**7]], sampling)


class DroppingProxy:
    """TCP proxy that closes the first ``drops`` connections without a byte, then forwards."""

    def __init__(self, target_port: int, drops: int):
        self.target_port = target_port
        self.drops = drops
        self.seen = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.seen += 1
            if self.seen <= self.drops:
                conn.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


def test_openai_backend_retries_dropped_connections(gen, tokenizer):
    prompt = tokenizer.encode("retry me", add_special_tokens=False)
    sampling = SamplingParams(max_new_tokens=3, temperature=0.0)
    expected = gen.generate([prompt], sampling)[0]
    with BackgroundServer(build_app(gen, tokenizer, "tiny")) as server:
        proxy = DroppingProxy(server.port, drops=2)
        client = OpenAIGenerator(f"http://127.0.0.1:{proxy.port}/v1", backoff_s=0.05, max_retries=4)
        got = client.generate([prompt], sampling)[0]
        assert got.ids == expected.ids
        assert client.retries == 2
        proxy.close()
        dead = DroppingProxy(server.port, drops=100)
        client = OpenAIGenerator(f"http://127.0.0.1:{dead.port}/v1", backoff_s=0.01, max_retries=2)
        with pytest.raises(GeneratorError, match="after 3 attempts"):
            client.generate([prompt], sampling)
        dead.close()


def test_prefix_cache_reuse_matches_fresh_prefill(tiny, tokenizer):
    cached = HFGenerator(tiny, tokenizer, prefix_cache_tokens=10_000)
    fresh = HFGenerator(tiny, tokenizer, prefix_cache_tokens=0)
    sampling = SamplingParams(max_new_tokens=5, temperature=0.0)
    shared = tokenizer.encode("A long shared system prompt with tools. " * 4, add_special_tokens=False)
    prompts = [
        shared + tokenizer.encode(t, add_special_tokens=False) for t in ("first episode says", "second one")
    ]
    for _turn in range(3):  # multi-turn: each prompt extends the previous prompt + output + bridge
        a = cached.generate(prompts, sampling)
        b = fresh.generate(prompts, sampling)
        for x, y in zip(a, b, strict=True):
            assert x.ids == y.ids
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4
        bridge = tokenizer.encode(" then the tool said ok.", add_special_tokens=False)
        prompts = [p + o.ids + bridge for p, o in zip(prompts, a, strict=True)]
    # turn 0: the second prompt reuses the first one's shared prefix; later turns reuse their own
    assert cached.prefix_cache.hits == 5 and cached.prefix_cache.reused_tokens > 2 * len(shared)
    cached.reset_cache()
    assert cached.prefix_cache.tokens == 0


def test_rows_that_stop_leave_the_batch_without_changing_the_others(tiny, tokenizer):
    """Stopped rows are dropped from the decode batch (and their K/V cached); the rows left and the
    next turn's reuse of the dropped rows' cache give what each prompt gives alone."""
    rng = random.Random(0)  # distinct prompts of 16+ tokens (the prefix cache's minimum reuse)
    prompts = [[rng.randrange(100, 20_000) for _ in range(16 + 3 * i)] for i in range(8)]
    plain = HFGenerator(tiny, tokenizer, prefix_cache_tokens=0)
    free = SamplingParams(max_new_tokens=10, temperature=0.0, stop_ids=())
    firsts = [plain.generate([p], free)[0].ids for p in prompts]
    stops = tuple({ids[0] for ids in firsts[:3]})  # three rows end at once, the others go on
    sampling = SamplingParams(max_new_tokens=10, temperature=0.0, stop_ids=stops)
    cached = HFGenerator(tiny, tokenizer, prefix_cache_tokens=10_000)
    for gen in (plain, cached):
        batched = gen.generate(prompts, sampling)
        lengths = sorted(len(o.ids) for o in batched)
        assert lengths[2] == 1 and lengths[-1] == 10
        for prompt, out in zip(prompts, batched, strict=True):
            alone = plain.generate([prompt], sampling)[0]
            assert out.ids == alone.ids and out.finish_reason == alone.finish_reason
            assert max(abs(a - b) for a, b in zip(out.logprobs, alone.logprobs, strict=True)) < 1e-4
    bridge = tokenizer.encode(" and then", add_special_tokens=False)
    nxt = [p + o.ids + bridge for p, o in zip(prompts, batched, strict=True)]
    hits, reused = cached.prefix_cache.hits, cached.prefix_cache.reused_tokens
    for out, ref in zip(cached.generate(nxt, sampling), plain.generate(nxt, sampling), strict=True):
        assert out.ids == ref.ids
        assert max(abs(a - b) for a, b in zip(out.logprobs, ref.logprobs, strict=True)) < 1e-4
    # every row reused its whole first turn: prompt + sampled ids but the last
    assert cached.prefix_cache.hits - hits == len(nxt)
    assert cached.prefix_cache.reused_tokens - reused == sum(
        len(p) + len(o.ids) - 1 for p, o in zip(prompts, batched, strict=True)
    )


def test_a_lock_step_wave_past_the_prefix_budget_keeps_the_rows_it_holds(tiny, tokenizer):
    """Every row of a wave is read once per turn. With a budget for about half the wave, the rows
    the cache holds when a turn starts are the rows that hit (reading first, storing after: storing
    each prompt before the next row is read evicted the rows about to be read, down to no hit), no
    prompt-only entry outlives its call, and the outputs equal a generator without a cache."""
    rng = random.Random(1)
    prompts = [[rng.randrange(100, 20_000) for _ in range(40 + i)] for i in range(8)]
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0, stop_ids=())
    cached = HFGenerator(tiny, tokenizer, prefix_cache_tokens=300)
    plain = HFGenerator(tiny, tokenizer, prefix_cache_tokens=0)
    held_per_turn = []
    for _turn in range(4):
        cache = cached.prefix_cache
        held = sum(
            any(len(ids) >= 16 and tuple(p[: len(ids)]) == ids for ids, *_ in cache.entries.values())
            for p in prompts
        )
        hits = cache.hits
        outs = cached.generate(prompts, sampling)
        assert cache.hits - hits == held
        held_per_turn.append(held)
        for out, ref in zip(outs, plain.generate(prompts, sampling), strict=True):
            assert out.ids == ref.ids
        fed = {tuple(p + o.ids[:-1]) for p, o in zip(prompts, outs, strict=True)}
        assert set(ids for ids, *_ in cache.entries.values()) <= fed  # no prompt-only entry
        assert cache.tokens == sum(len(ids) for ids, *_ in cache.entries.values()) <= 300
        prompts = [
            p + o.ids + [rng.randrange(100, 20_000) for _ in range(10)]
            for p, o in zip(prompts, outs, strict=True)
        ]
    # turn 0 has nothing cached; later turns hold what fits in 300 tokens of sequences of 50-100
    assert held_per_turn[0] == 0 and all(2 <= h < 8 for h in held_per_turn[1:]), held_per_turn


def test_short_suffixes_after_a_cached_prefix_prefill_together(tiny, tokenizer):
    """One wave mixing rows that extend a cached sequence by a few tokens (prefilled together, in one
    forward: a tree branch's last observation), rows with a long new suffix and rows with nothing
    cached (prefilled alone): every row gives what it gives with no cache at all."""
    rng = random.Random(2)
    roots = [[rng.randrange(100, 20_000) for _ in range(30 + 7 * i)] for i in range(3)]
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0, stop_ids=())
    cached = HFGenerator(tiny, tokenizer, prefix_cache_tokens=10_000)
    plain = HFGenerator(tiny, tokenizer, prefix_cache_tokens=0)
    first = cached.generate(roots, sampling)
    grown = [r + o.ids for r, o in zip(roots, first, strict=True)]
    wave = [
        grown[0] + [rng.randrange(100, 20_000) for _ in range(3)],  # short suffixes of different lengths
        grown[1] + [rng.randrange(100, 20_000)],
        grown[0] + [rng.randrange(100, 20_000) for _ in range(11)],  # two rows extend one cached sequence
        grown[2] + [rng.randrange(100, 20_000) for _ in range(SHORT_SUFFIX + 5)],  # long: alone
        [rng.randrange(100, 20_000) for _ in range(20)],  # nothing cached: alone
    ]
    hits = cached.prefix_cache.hits
    for out, ref in zip(cached.generate(wave, sampling), plain.generate(wave, sampling), strict=True):
        assert out.ids == ref.ids
        assert max(abs(a - b) for a, b in zip(out.logprobs, ref.logprobs, strict=True)) < 1e-4
    assert cached.prefix_cache.hits - hits == 4  # every row but the uncached one reused its prefix


def test_rows_repeating_a_prompt_share_its_kv_and_sample_as_alone(tiny, tokenizer):
    """A tree's branches: rows that repeat a prompt (one prompt cached by an earlier turn, one new)
    decode over each prompt's K/V held once. Seeded rows sample what they sample in a batch that
    copies the K/V per row and with no cache at all, rows that stop leave the batch, and each row's
    K/V (prompt + its own tokens) is cached for its next turn."""
    rng = random.Random(3)
    root = [rng.randrange(100, 20_000) for _ in range(40)]
    fresh = [rng.randrange(100, 20_000) for _ in range(25)]
    shared = HFGenerator(tiny, tokenizer, prefix_cache_tokens=10_000)
    copied = HFGenerator(tiny, tokenizer, prefix_cache_tokens=10_000, share_prompts=False)
    plain = HFGenerator(tiny, tokenizer, prefix_cache_tokens=0)
    free = SamplingParams(max_new_tokens=8, temperature=1.0, stop_ids=())
    first = shared.generate([root], free, seeds=[7])[0]
    copied.generate([root], free, seeds=[7])
    grown = root + first.ids + [rng.randrange(100, 20_000) for _ in range(4)]  # a branch point
    prompts = [grown] * 5 + [fresh] * 3  # two trees' branches in one wave
    seeds = list(range(100, 108))
    outs = {name: gen.generate(prompts, free, seeds=seeds) for name, gen in
            (("shared", shared), ("copied", copied), ("plain", plain))}  # fmt: skip
    assert {o.timings["shared_prompts"] for o in outs["shared"]} == {1.0}
    assert {o.timings["shared_prompts"] for o in outs["copied"] + outs["plain"]} == {0.0}
    assert len({tuple(o.ids) for o in outs["shared"][:5]}) > 1  # the branches differ
    for ref in ("copied", "plain"):
        for out, other in zip(outs["shared"], outs[ref], strict=True):
            assert out.ids == other.ids
            assert max(abs(a - b) for a, b in zip(out.logprobs, other.logprobs, strict=True)) < 1e-4
    # two prompts of one length, interleaved: groups that are not consecutive rows
    twin = [rng.randrange(100, 20_000) for _ in range(len(fresh))]
    mixed = [fresh, twin, fresh, twin]
    for out, ref in zip(shared.generate(mixed, free, seeds=seeds[:4]), plain.generate(mixed, free, seeds=seeds[:4]), strict=True):  # fmt: skip
        assert out.timings["shared_prompts"] == 1.0 and out.ids == ref.ids
        assert max(abs(a - b) for a, b in zip(out.logprobs, ref.logprobs, strict=True)) < 1e-4
    # rows that stop early leave the shared batch; the others sample as before
    stops = tuple({o.ids[1] for o in outs["plain"][:2]})
    stopping = SamplingParams(max_new_tokens=8, temperature=1.0, stop_ids=stops)
    a, b = shared.generate(prompts, stopping, seeds=seeds), plain.generate(prompts, stopping, seeds=seeds)
    assert min(len(o.ids) for o in a) <= 2 and max(len(o.ids) for o in a) == 8
    for out, ref in zip(a, b, strict=True):
        assert out.ids == ref.ids and out.finish_reason == ref.finish_reason
        assert max(abs(x - y) for x, y in zip(out.logprobs, ref.logprobs, strict=True)) < 1e-4
    # each row's next turn reuses its own prompt + tokens from the cache
    bridge = tokenizer.encode(" and then", add_special_tokens=False)
    nxt = [p + o.ids + bridge for p, o in zip(prompts, a, strict=True)]
    hits, reused = shared.prefix_cache.hits, shared.prefix_cache.reused_tokens
    later = shared.generate(nxt, SamplingParams(max_new_tokens=4, temperature=0.0, stop_ids=()))
    for out, ref in zip(later, plain.generate(nxt, SamplingParams(max_new_tokens=4, temperature=0.0, stop_ids=())), strict=True):  # fmt: skip
        assert out.ids == ref.ids
    assert shared.prefix_cache.hits - hits == len(nxt)
    # at least its own prompt + tokens but the last (a row repeating an earlier row's ids reuses more)
    own = sum(len(p) + len(o.ids) - 1 for p, o in zip(prompts, a, strict=True))
    assert own <= shared.prefix_cache.reused_tokens - reused <= own + len(nxt) * len(bridge)


def test_a_run_reports_the_share_of_prompt_tokens_read_from_the_prefix_cache(tiny, tokenizer):
    """perf/prefix_reused_share: each turn after the first finds the previous turn's prompt and
    sampled ids but the last (never fed) in the cache; the first finds nothing."""
    from agentrl.rollout.runner import RunStats, run_episodes
    from agentrl.rollout.settings import RolloutConfig

    from .toy import make_lookup_env

    settings = RolloutConfig(max_new_tokens=12, concurrency=1, group_size=1)
    stats = RunStats()
    (episode,) = run_episodes(lambda: make_lookup_env(max_turns=3), ["k3"], HFGenerator(tiny, tokenizer),
                              tokenizer, settings, stats=stats, progress=False)  # fmt: skip
    segment = episode.segments[0]
    assert len(segment.turns) == 3  # a random tiny model never answers
    prompts, reused, ids = [], [], list(segment.prompt_ids)
    for turn in segment.turns:
        prompts.append(len(ids))
        reused.append(0 if not reused else prompts[-2] + len(previous.output_ids) - 1)
        ids += turn.output_ids + turn.obs_ids
        previous = turn
    assert (stats.prompt_tokens, stats.reused_prompt_tokens) == (sum(prompts), sum(reused))
    assert stats.as_metrics()["perf/prefix_reused_share"] == sum(reused) / sum(prompts)
    off = RunStats()
    run_episodes(lambda: make_lookup_env(max_turns=3), ["k3"], HFGenerator(tiny, tokenizer, prefix_cache_tokens=0),
                 tokenizer, settings, stats=off, progress=False)  # fmt: skip
    assert off.prompt_tokens == 0 and "perf/prefix_reused_share" not in off.as_metrics()


def test_a_bfloat16_sampler_samples_from_its_own_copy_and_takes_new_weights(tiny, tokenizer):
    """rollout.sampler_dtype=bfloat16: the generator holds a bfloat16 copy (the learner's model is
    untouched), samples what a bfloat16 model samples, and update_weights refreshes the copy."""
    import copy

    learner = copy.deepcopy(tiny)
    gen = HFGenerator(learner, tokenizer, sample_dtype=torch.bfloat16)
    assert gen.model is not learner and {p.dtype for p in gen.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in learner.parameters()} == {torch.float32}
    assert not any(p.requires_grad for p in gen.model.parameters())
    prompt = tokenizer.encode("Find the capital of Fooland.")
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0)
    reference = copy.deepcopy(tiny).to(torch.bfloat16)
    assert gen.generate([prompt], sampling)[0].ids == HFGenerator(reference, tokenizer).generate([prompt], sampling)[0].ids
    with torch.no_grad():  # the learner takes a step: the copy sees it only through update_weights
        for p in learner.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    before = [p.clone() for p in gen.model.parameters()]
    gen.update_weights([(name, p.detach()) for name, p in learner.named_parameters()])
    after = dict(gen.model.named_parameters())
    assert all(torch.equal(after[name], p.to(torch.bfloat16)) for name, p in learner.named_parameters())
    assert any(not torch.equal(b, a) for b, a in zip(before, gen.model.parameters(), strict=True))
    assert HFGenerator(tiny, tokenizer, sample_dtype=torch.float32).model is tiny  # the model's own dtype: no copy


def test_an_eval_in_bfloat16_samples_from_a_fresh_copy_and_leaves_the_model_as_it_was(tiny, tokenizer):
    """train.eval_sampler_dtype=bfloat16: inside ``sampling_in`` the generator samples what a bfloat16
    copy of the current weights samples; after it, the float32 model itself again, and the prefix
    cache holds nothing from the copy."""
    import copy

    learner = copy.deepcopy(tiny)
    gen = HFGenerator(learner, tokenizer, prefix_cache_tokens=4096)
    prompt = tokenizer.encode("Find the capital of Fooland.")
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0)
    alone = gen.generate([prompt], sampling)[0].ids

    def bf16_ids():
        reference = copy.deepcopy(learner).to(torch.bfloat16)
        return HFGenerator(reference, tokenizer, prefix_cache_tokens=0).generate([prompt], sampling)[0].ids

    for _ in range(2):  # the second copy is made from the weights the learner has then
        with gen.sampling_in(torch.bfloat16):
            assert {p.dtype for p in gen.model.parameters()} == {torch.bfloat16} and gen.model is not learner
            assert gen.generate([prompt], sampling)[0].ids == bf16_ids()
            assert gen.prefix_cache.tokens > 0
        assert gen.model is learner and gen.prefix_cache.tokens == 0
        assert {p.dtype for p in learner.parameters()} == {torch.float32}
        with torch.no_grad():
            for p in learner.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    with torch.no_grad():
        for p in learner.parameters():  # undo both steps: the float32 model samples as before
            p.sub_(2 * 0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    assert gen.generate([prompt], sampling)[0].ids == alone
    with gen.sampling_in(torch.float32):  # the model's own dtype: no copy
        assert gen.model is learner


def test_entries_past_a_shared_prefix_count_it_once_and_read_back_whole():
    """Hand-computed budget: two entries on one 20-token SharedPrefix with 3 and 5 tokens of their
    own hold 20 + 3 + 5 = 28 tokens; dropping one keeps the prefix, dropping both frees it; a view
    past the prefix is the prefix's K/V then the entry's own."""
    from agentrl.rollout.generators.kv_cache import PrefixCache, SharedPrefix

    def kv(n, fill):
        return [(torch.full((1, 2, n, 4), fill), torch.full((1, 2, n, 4), -fill)) for _ in range(3)]

    cache = PrefixCache(max_tokens=60)
    base = SharedPrefix(kv(20, 1.0))
    prompt = list(range(100, 120))
    a = cache.store(prompt + [1, 2, 3], kv(3, 2.0), base)
    b = cache.store(prompt + [4, 5, 6, 7, 8], kv(5, 3.0), base)
    plain = cache.store(list(range(200, 220)), kv(20, 4.0))
    assert cache.tokens == 28 + 20
    keys, values = cache.view(b, 23)[1]
    assert keys.shape == (1, 2, 23, 4)
    assert keys[:, :, :20].eq(1.0).all() and keys[:, :, 20:].eq(3.0).all() and values[:, :, 20:].eq(-3.0).all()
    assert cache.view(a, 17)[0][0].shape == (1, 2, 17, 4)  # within the prefix: a view of it
    assert cache.find(prompt + [4, 5, 6, 9]) == (b, 23)
    cache.discard([a])
    assert cache.tokens == 25 + 20
    # past the budget the least recently stored goes first: b, and with it the prefix (45 + 30 - 25)
    cache.store(list(range(300, 330)), kv(30, 5.0))
    assert b not in cache.entries and plain in cache.entries and cache.tokens == 50
    assert cache._base_refs == {}


def test_a_wave_of_branches_does_not_evict_the_trunks_still_to_branch(tiny, tokenizer):
    """Two trees' trunks are cached; the first tree's 6 branches end and are cached as their prompt
    once plus their own tokens (not 6 copies of the prompt), so the second trunk stays within a budget
    that 6 copies would overflow, and its branches then read it; every output equals a generator
    without a cache."""
    rng = random.Random(4)
    roots = [[rng.randrange(100, 20_000) for _ in range(40)] for _ in range(2)]
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0, stop_ids=())
    free = SamplingParams(max_new_tokens=6, temperature=1.0, stop_ids=())
    cached = HFGenerator(tiny, tokenizer, prefix_cache_tokens=200)
    plain = HFGenerator(tiny, tokenizer, prefix_cache_tokens=0)
    trunks = [cached.generate([r], greedy)[0] for r in roots]  # each alone: two entries of 45 tokens
    points = [r + t.ids + [rng.randrange(100, 20_000) for _ in range(4)] for r, t in zip(roots, trunks, strict=True)]
    cache = cached.prefix_cache
    for tree, point in enumerate(points):
        hits, reused = cache.hits, cache.reused_tokens
        outs = cached.generate([point] * 6, free, seeds=list(range(6)))
        assert cache.hits - hits == 1 and cache.reused_tokens - reused == len(roots[tree]) + 5  # the trunk
        assert outs[0].timings["shared_prompts"] == 1.0
        for out, ref in zip(outs, plain.generate([point] * 6, free, seeds=list(range(6))), strict=True):
            assert out.ids == ref.ids
        if tree == 0:  # the branches hold their prompt once: 50 + 6 x 5 tokens, beside the other trunk's 45
            assert cache.tokens == len(point) + sum(len(o.ids) - 1 for o in outs) + len(roots[1]) + 5 <= 200
            assert 6 * len(point) > 200  # what 6 copies would have needed


def test_an_ended_episodes_cache_entry_goes_and_the_episodes_in_flight_keep_theirs(tiny, tokenizer):
    """An eval's shape: 6 chains of 3 turns, 2 in flight, a budget that holds every episode. Without
    release the cache ends holding every episode's last entry; with it, an ended episode's entry goes
    at the next generate call, so the cache holds the episodes in flight and the last wave's; every
    episode is the same either way (an episode reads only its own previous turn beyond the shared
    system prompt)."""
    from agentrl.rollout.generators.kv_cache import PrefixCache
    from agentrl.rollout.runner import run_episodes
    from agentrl.rollout.settings import RolloutConfig

    from .toy import make_lookup_env

    settings = RolloutConfig(max_new_tokens=8, concurrency=2, group_size=1, temperature=0.0)
    runs = {}
    for release in (True, False):
        gen = HFGenerator(tiny, tokenizer, prefix_cache_tokens=100_000)
        if not release:
            gen.release = lambda ids: None
        held: list[int] = []
        generate = gen._generate_batch

        def counting(*args, generate=generate, gen=gen, held=held, **kwargs):
            held.append(len(gen.prefix_cache.entries))  # entries at each decode batch's start
            return generate(*args, **kwargs)

        gen._generate_batch = counting
        cleared = PrefixCache.clear

        def keep_at_end(self, held=held, cleared=cleared):  # the runner clears at the end: count first
            held.append(len(self.entries))
            cleared(self)

        PrefixCache.clear = keep_at_end
        try:
            episodes = run_episodes(lambda: make_lookup_env(max_turns=3), [f"k{i}" for i in range(6)], gen,
                                    tokenizer, settings, progress=False)  # fmt: skip
        finally:
            PrefixCache.clear = cleared
        runs[release] = ([e.segments[0].token_ids() for e in episodes], held)
    (ids_on, held_on), (ids_off, held_off) = runs[True], runs[False]
    assert ids_on == ids_off
    assert max(held_off) == 6  # every episode's last entry, held until the run ends
    assert max(held_on) <= 3  # the two in flight and at most one that ended since the last call
