"""Request batching: many concurrent single-prompt requests become one batched ``generate`` call.

Episodes (and HTTP clients of ``agentrl serve``) each ask for one continuation at a time; the
:class:`Batcher` collects the requests that arrive while the generator is busy (or within a short
window), groups them by sampling parameters and runs one batched call in a worker thread, so the
event loop stays free for environment steps, the watchdog and the progress display.

Generators whose requests are independent anyway (``independent_requests``: one HTTP request per
prompt, e.g. the OpenAI-compatible client) are not batched: each request goes out on its own, so
a hung or failing request costs only its own episode, never the requests queued behind it.

Per-request seeds (``SamplingParams.seed``, set per episode turn by the runner) do not split
batches: a generator with per-row streams (``supports_row_seeds``, the HF backend) gets them as
``seeds=``, so each request's continuation is the same whatever it was batched with; other
backends sample batch-wise and the seeds are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.rollout.generators.base import GenerationOutput, Generator, SamplingParams, check_fits

#: per-request token callback: ``(token_id, logprob, top_logprobs) -> stop this request now``
RequestCallback = Callable[[int, float, Any], bool]


@dataclass
class _Request:
    prompt: Sequence[int]
    sampling: SamplingParams
    future: asyncio.Future = field(repr=False)
    on_token: RequestCallback | None = field(default=None, repr=False)


class Batcher:
    """Batches concurrent ``submit`` calls into ``generator.generate`` calls.

    Also measures how long the generator was busy, so callers can report the share of wall time
    it sat idle (e.g. waiting for environments).
    """

    def __init__(self, generator: Generator, *, max_batch_size: int | None = None, window_s: float = 0.002,
                 lockstep: bool = False, lockstep_wait_s: float | None = None):  # fmt: skip
        """``lockstep``: a batch waits until every active episode (see :meth:`enter`) has asked or
        ended, and its requests are ordered by seed, so which prompts share a batch (and therefore
        the batch's float rounding) does not depend on timing. ``lockstep_wait_s``: wait at most
        this long for the last episodes (an env call that hangs then delays the others by this
        much, not until its own timeout); a batch that went ahead without them is counted in
        :attr:`cut` (from there on the run may not repeat bit for bit). None: wait without limit.
        Without lockstep, a batch takes what arrived within ``window_s``."""
        self.generator = generator
        self.max_batch_size = max_batch_size or generator.max_batch_size
        self.window_s = window_s
        self.lockstep = lockstep
        self.lockstep_wait_s = lockstep_wait_s
        self.cut = 0  # lockstep batches that went ahead after lockstep_wait_s without every episode
        self.active = 0  # episodes that will submit or end (lockstep only)
        self._changed: asyncio.Event | None = None
        self._queue: asyncio.Queue[_Request] | None = None
        self._task: asyncio.Task | None = None
        self.busy_s = 0.0
        self.calls = 0
        self.requests = 0
        self.generated_tokens = 0
        self.started_at: float | None = None

    def enter(self) -> None:
        """An episode started (lockstep: later batches wait for its request). Episodes admitted
        through :class:`Slots` enter and leave through it."""
        self.active += 1

    def leave(self) -> None:
        """An episode ended."""
        self.active -= 1
        if self._changed is not None:
            self._changed.set()

    async def start(self) -> None:
        if self._task is None:
            self._queue = asyncio.Queue()
            self._changed = asyncio.Event()
            self._task = asyncio.create_task(self._loop(), name="agentrl-batcher")
            self.started_at = time.perf_counter()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def submit(
        self, prompt: Sequence[int], sampling: SamplingParams, on_token: RequestCallback | None = None
    ) -> GenerationOutput:
        """Queue one prompt and wait for its continuation.

        ``on_token`` (called from the generator's worker thread) sees each token as it is sampled and
        may end the request by returning True (``agentrl serve``'s streaming and stop strings).
        A request that does not fit the model's positions fails alone, here, with
        :class:`~agentrl.rollout.generators.base.ContextTooLong` (never its batch-mates).
        """
        check_fits(len(prompt), sampling.max_new_tokens, self.generator.max_positions)
        if getattr(self.generator, "independent_requests", False):
            return await self._direct(prompt, sampling)
        await self.start()
        assert self._queue is not None
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Request(prompt, sampling, future, on_token))
        assert self._changed is not None
        self._changed.set()
        return await future

    async def _direct(self, prompt: Sequence[int], sampling: SamplingParams) -> GenerationOutput:
        if self.started_at is None:
            self.started_at = time.perf_counter()
        t0 = time.perf_counter()
        try:
            (output,) = await self.generator.agenerate([prompt], sampling)
        finally:
            self.busy_s += time.perf_counter() - t0  # overlapping requests: an upper bound
            self.calls += 1
            self.requests += 1
        self.generated_tokens += len(output.ids)
        return output

    def idle_share(self, wall_s: float | None = None) -> float:
        """Fraction of wall time (since start) the generator was not running a batch."""
        if self.started_at is None:
            return 0.0
        wall = wall_s if wall_s is not None else time.perf_counter() - self.started_at
        return max(0.0, 1.0 - self.busy_s / wall) if wall > 0 else 0.0

    async def _loop(self) -> None:
        assert self._queue is not None
        while True:
            first = await self._queue.get()
            pending = [first]
            if self.lockstep:
                await self._all_asked(pending)
            elif self.window_s > 0:
                await asyncio.sleep(self.window_s)
            while not self._queue.empty() and (self.lockstep or len(pending) < self.max_batch_size * 4):
                pending.append(self._queue.get_nowait())
            if self.lockstep:
                pending.sort(key=lambda r: (r.sampling.seed is None, r.sampling.seed or 0))
            groups: dict[SamplingParams, list[_Request]] = {}
            for request in pending:
                groups.setdefault(dataclasses.replace(request.sampling, seed=None), []).append(request)
            for sampling, requests in groups.items():
                for start in range(0, len(requests), self.max_batch_size):
                    await self._run(sampling, requests[start : start + self.max_batch_size])

    async def _all_asked(self, pending: list[_Request]) -> None:
        """Lockstep: wait until every active episode has a request queued (or has ended), or
        ``lockstep_wait_s`` has passed (counted in :attr:`cut`)."""
        assert self._changed is not None and self._queue is not None
        deadline = None if self.lockstep_wait_s is None else time.perf_counter() + self.lockstep_wait_s
        while True:
            self._changed.clear()
            if len(pending) + self._queue.qsize() >= self.active:
                return
            if deadline is None:
                await self._changed.wait()
                continue
            left = deadline - time.perf_counter()
            if left <= 0:
                self.cut += 1
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def _run(self, sampling: SamplingParams, requests: list[_Request]) -> None:
        live = [r for r in requests if not r.future.done()]  # cancelled episodes drop out
        if not live:
            return
        t0 = time.perf_counter()
        seeds = [r.sampling.seed for r in live]
        try:
            prompts = [r.prompt for r in live]
            row_seeds = seeds if self.generator.supports_row_seeds and any(s is not None for s in seeds) else None
            callbacks = [r.on_token for r in live]
            if any(callbacks):

                def on_token(row: int, token: int, logprob: float, top: Any) -> bool:
                    callback = callbacks[row]
                    return callback(token, logprob, top) if callback is not None else False

                outputs = await self.generator.agenerate_streaming(prompts, sampling, on_token, row_seeds)
            elif row_seeds is not None:
                outputs = await self.generator.agenerate(prompts, sampling, seeds=row_seeds)
            else:  # generators that take no seeds override agenerate(prompts, sampling)
                outputs = await self.generator.agenerate(prompts, sampling)
        except asyncio.CancelledError:
            for r in live:
                if not r.future.done():
                    r.future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the waiting episodes, which record it
            if len(live) == 1:
                if not live[0].future.done():
                    live[0].future.set_exception(exc)
                return
            # One bad request must not fail its batch-mates: retry each alone (in-process generators
            # only: remote ones never come here, see the module doc; not a streamed one, whose
            # consumer may have seen tokens already).
            for r in live:
                if r.on_token is not None:
                    if not r.future.done():
                        r.future.set_exception(exc)
                else:
                    await self._run(sampling, [r])
            return
        finally:
            self.busy_s += time.perf_counter() - t0
            self.calls += 1
            self.requests += len(live)
        for request, output in zip(live, outputs, strict=True):
            self.generated_tokens += len(output.ids)
            if not request.future.done():
                request.future.set_result(output)


class Slots:
    """At most ``n`` episodes in flight, admitted in the order they ask (an ``asyncio.Semaphore``),
    each counted by a lock-step :class:`Batcher` from admission to end (:meth:`Batcher.enter`,
    :meth:`Batcher.leave`).

    An ending episode that frees its slot for a waiting one enters the newcomer into the batcher
    *before* it leaves. Otherwise a lock-step batch could form in between, without the newcomer's
    first request, whenever every other episode in flight happened to have asked already: the
    batches' composition (and so every row's floats) would depend on how long env steps took, and
    the same seed would not give the same run. Without the handover this happened with the uncapped
    wait (``train.deterministic``); the capped one held only because ``asyncio.wait_for`` wakes its
    waiter through a task of its own, one event-loop pass later (Python 3.11).
    """

    def __init__(self, n: int, batcher: Batcher | None):
        self._semaphore = asyncio.Semaphore(n)
        self.batcher = batcher
        self._waiting = 0  # episodes blocked on the semaphore
        self._handed = 0  # of those, entered into the batcher by an episode that freed its slot

    @contextlib.asynccontextmanager
    async def admit(self) -> Any:
        """Hold a slot (and a place in the batcher) for the ``async with`` block."""
        self._waiting += 1
        try:
            await self._semaphore.acquire()
        except BaseException:  # cancelled while waiting: a place entered for it is given back
            self._waiting -= 1
            if self._handed > self._waiting:
                self._handed -= 1
                if self.batcher is not None:
                    self.batcher.leave()
            raise
        self._waiting -= 1
        if self._handed:
            self._handed -= 1  # entered by the episode whose slot this was
        elif self.batcher is not None:
            self.batcher.enter()
        try:
            yield
        finally:
            if self._waiting > self._handed:  # the release below wakes a waiting episode: enter it now
                self._handed += 1
                if self.batcher is not None:
                    self.batcher.enter()
            if self.batcher is not None:
                self.batcher.leave()
            self._semaphore.release()
