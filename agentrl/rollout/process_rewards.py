"""FoldGRPO process rewards Q (ALGORITHMS.md §4a), computed per token on a finished branch/return episode.

Three penalties, summed per generated token (Q <= 0; tokens no rule hits get 0):

- **unfolded** (``unfolded_penalty``, paper -1): every generated token of the main thread whose
  context already holds more than ``unfolded_threshold`` (paper 0.5) x ``max_context_tokens``
  tokens, except tokens of branch-creating turns. The paper words it "once the main thread passes
  50% of the working context limit"; this is read per token (a turn that crosses the line is
  penalised from the crossing on). The open FoldAgent code instead penalises every non-branch main
  turn when the final main context is over the line.
- **failure** (``failure_penalty``, paper -1): every token of a turn whose action failed - a tool
  call that returned an error, a malformed tool call, or branch/return used where it is not
  allowed (``Turn.error`` says which; :meth:`agentrl.outcome.StepOutcome.error` for env steps). A
  turn with no action at all (void) is not a failed call.
- **out of scope** (``scope_penalty``, paper -0.2): every token of a branch that a
  :class:`ScopeJudge` finds went beyond its sub-task, judged from the branch's instruction and what
  it returned. :class:`RuleScopeJudge` is the default; :class:`LLMScopeJudge` asks a model (any
  generator, or an OpenAI-compatible server) as the paper asks GPT-5-nano.

Per turn the result is ``Turn.process_reward`` (one value per output token) and per-kind totals
``Turn.reward_parts["process/<kind>"]``; per episode, token counts ``Episode.metrics["process/..."]``
that the runner turns into ``rollout/process_share/<kind>`` metrics. With R in {0, 1} and
FoldGRPO's ``clip(R + Q, 0, 1)`` the penalties only move successful rollouts' advantages.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agentrl.errors import ConfigError, GeneratorError
from agentrl.rollout import folding
from agentrl.rollout.settings import RolloutConfig
from agentrl.trajectory import Episode, Segment

KINDS = ("unfolded", "failure", "out_of_scope")


def describe(settings: Any) -> str:
    """One line with the resolved settings (printed at the start of a run)."""
    judge = settings.scope_judge
    if judge == "openai":
        judge += f" {settings.scope_judge_url} model={settings.scope_judge_model or '(first served)'}"
    return (
        f"process rewards (FoldGRPO): unfolded {settings.unfolded_penalty:g} past "
        f"{settings.unfolded_threshold:g} x {settings.max_context_tokens} main-context tokens, failure "
        f"{settings.failure_penalty:g}, out-of-scope {settings.scope_penalty:g} (judge: {judge}, "
        f"timeout {settings.scope_judge_timeout_s:g}s)"
    )


# --------------------------------------------------------------------------- scope judges
@dataclass(frozen=True)
class BranchCase:
    """What a scope judge sees of one branch."""

    description: str  # the branch call's short name of the sub-task
    prompt: str  # the branch call's instructions
    message: str | None  # what the branch returned; None if it ended without calling return
    answered: bool  # the episode's final answer was given inside this branch
    actions: tuple[str, ...]  # the branch's action texts, in order


@dataclass(frozen=True)
class ScopeVerdict:
    out_of_scope: bool | None  # None: the judge gave no usable verdict (no penalty)
    reason: str


class ScopeJudge(Protocol):
    async def judge(self, case: BranchCase) -> ScopeVerdict: ...


_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    "the a an and or of to in on for with by from at as is are was were be been it its this that these those "
    "find look up get what which who how value result results sub task subtask please then".split()
)


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in _STOP}


class RuleScopeJudge:
    """Rule-based scope check (a cheap stand-in for the paper's LLM judge).

    Out of scope when the branch answered the whole task itself (the main thread's job), or when
    it returned a message that shares fewer than ``min_overlap`` content words with its sub-task's
    description and prompt (it came back with something else). A branch that ended without
    return is not judged out of scope: it ran out of turns, which says nothing about its scope.
    """

    def __init__(self, min_overlap: int = 1):
        self.min_overlap = min_overlap

    async def judge(self, case: BranchCase) -> ScopeVerdict:
        if case.answered:
            return ScopeVerdict(True, "the branch gave the task's final answer instead of returning")
        if case.message is None:
            return ScopeVerdict(False, "ended without return (turn budget)")
        task_words = content_words(f"{case.description} {case.prompt}")
        shared = task_words & content_words(case.message)
        if task_words and len(shared) < self.min_overlap:
            return ScopeVerdict(True, "the returned message shares no content word with the sub-task")
        return ScopeVerdict(False, f"returned about {', '.join(sorted(shared)) or 'the sub-task'}")


JUDGE_PROMPT = """You check whether a sub-agent stayed within the scope of the sub-task it was given.

Sub-task: {description}
Instructions: {prompt}

What the sub-agent returned:
{message}

Reply <good> if the sub-agent worked only on its sub-task (even if it failed or found nothing),
<fine> if it went slightly beyond it, and <error> if it did substantial work beyond the sub-task.
Then give one short sentence of justification."""


def parse_verdict(text: str) -> ScopeVerdict:
    """``<error>`` -> out of scope; ``<good>`` or ``<fine>`` -> in scope; anything else -> no verdict."""
    tags = re.findall(r"<(good|fine|error)>", text.lower())
    if not tags:
        return ScopeVerdict(None, f"unparsed judge reply: {text[:120]!r}")
    return ScopeVerdict(tags[0] == "error", text.strip()[:200])


class LLMScopeJudge:
    """Asks a model, through ``complete(prompt_text) -> reply_text``, whether a branch kept to its sub-task.

    Build it with :meth:`over_generator` (any :class:`~agentrl.rollout.generators.base.Generator`,
    or the runner's batcher so the policy judges between its own rollouts) or :meth:`over_openai`
    (``/v1/chat/completions`` of any OpenAI-compatible server, with a timeout).
    """

    def __init__(self, complete: Callable[[str], Awaitable[str]]):
        self.complete = complete

    async def judge(self, case: BranchCase) -> ScopeVerdict:
        message = case.message if case.message is not None else "(nothing: it ran out of turns)"
        if case.answered:
            message += "\n(It then answered the whole task itself instead of returning.)"
        prompt = JUDGE_PROMPT.format(description=case.description, prompt=case.prompt, message=message)
        return parse_verdict(await self.complete(prompt))

    @classmethod
    def over_generator(
        cls,
        generate: Any,
        tokenizer: Any,
        *,
        max_new_tokens: int = 64,
        timeout_s: float = 30.0,
    ) -> LLMScopeJudge:
        """``generate``: a Generator, or an async ``submit(prompt_ids, sampling)`` (a Batcher's)."""
        from agentrl.rollout.generators.base import Generator, SamplingParams

        sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, return_entropy=False)
        if isinstance(generate, Generator):
            gen = generate

            async def submit(ids: list[int], params: SamplingParams) -> Any:
                return (await gen.agenerate([ids], params))[0]
        else:
            submit = generate

        async def complete(text: str) -> str:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
            try:
                out = await asyncio.wait_for(submit(list(ids), sampling), timeout=timeout_s)
            except TimeoutError:
                raise GeneratorError(
                    f"scope judge: no reply in {timeout_s:g}s (rollout.scope_judge_timeout_s)"
                ) from None
            return tokenizer.decode(out.ids, skip_special_tokens=True)

        return cls(complete)

    @classmethod
    def over_openai(
        cls, base_url: str, model: str = "", *, timeout_s: float = 30.0, max_tokens: int = 64
    ) -> LLMScopeJudge:
        """A judge behind ``{base_url}/chat/completions`` (``model`` "": the first one served)."""
        import httpx

        url = base_url.rstrip("/")
        state = {"model": model}

        async def complete(text: str) -> str:
            if not state["model"]:
                from agentrl.rollout.generators.openai import served_model_name

                state["model"] = await asyncio.to_thread(served_model_name, url, timeout_s)
            body = {
                "model": state["model"],
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
                "temperature": 0.0,
            }
            try:
                async with httpx.AsyncClient(timeout=timeout_s) as client:
                    response = await client.post(f"{url}/chat/completions", json=body)
                    response.raise_for_status()
                    return str(response.json()["choices"][0]["message"]["content"])
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
                raise GeneratorError(
                    f"scope judge at {url}: {type(exc).__name__}: {exc} "
                    f"(rollout.scope_judge_url, rollout.scope_judge_timeout_s)"
                ) from exc

        return cls(complete)


def build_judge(settings: Any, *, submit: Any = None, tokenizer: Any = None) -> ScopeJudge | None:
    """The judge the settings name (``policy`` needs the rollout's ``submit`` and tokenizer)."""
    kind = settings.scope_judge
    if kind == "none":
        return None
    if kind == "rule":
        return RuleScopeJudge()
    if kind == "openai":
        return LLMScopeJudge.over_openai(
            settings.scope_judge_url, settings.scope_judge_model, timeout_s=settings.scope_judge_timeout_s
        )
    if submit is None or tokenizer is None:
        raise ConfigError(
            "rollout.scope_judge",
            "'policy' judges with the rollout's own generator, and this run has none (scripted policy)",
            "use scope_judge=rule, openai or none",
        )
    return LLMScopeJudge.over_generator(submit, tokenizer, timeout_s=settings.scope_judge_timeout_s)


# --------------------------------------------------------------------------- assignment
def branch_cases(episode: Episode) -> dict[int, BranchCase]:
    """Per branch segment (by fold id), what a judge sees; read from the episode record alone."""
    main = next((s for s in episode.segments if s.kind == "main"), None)
    if main is None:
        return {}
    calls = [t for t in main.turns if t.kind == "branch"]  # the k-th opens the branch with fold id k
    last_index = max((t.index for t in episode.turns), default=-1)
    cases = {}
    for seg in episode.segments:
        if seg.kind != "branch" or not 0 < seg.fold_id <= len(calls):
            continue
        call = folding.find_fold_call(calls[seg.fold_id - 1].action_text)
        args = call.arguments if call is not None else {}
        last = seg.turns[-1] if seg.turns else None
        end = folding.find_fold_call(last.action_text) if last is not None and last.kind == "return" else None
        cases[seg.fold_id] = BranchCase(
            description=str(args.get("description", "")),
            prompt=str(args.get("prompt", "")),
            message=str(end.arguments.get("message", "")) if end is not None else None,
            answered=episode.terminated and any(t.index == last_index for t in seg.turns),
            actions=tuple(t.action_text for t in seg.turns),
        )
    return cases


def _unfolded(main: Segment, config: RolloutConfig) -> dict[int, list[float]]:
    """Per main-thread turn index, the unfolded penalty of each output token."""
    out = {}
    position = len(main.prompt_ids)  # tokens in the context before the next token
    limit = config.unfolded_threshold * config.max_context_tokens
    for turn in main.turns:
        n = len(turn.output_ids)
        if turn.kind == "branch":
            out[turn.index] = [0.0] * n
        else:
            out[turn.index] = [config.unfolded_penalty if position + j > limit else 0.0 for j in range(n)]
        position += n + len(turn.obs_ids)
    return out


async def assign_process_rewards(
    episode: Episode, config: RolloutConfig, judge: ScopeJudge | None
) -> dict[int, ScopeVerdict]:
    """Fill ``process_reward`` / ``reward_parts["process/*"]`` on every turn and counts in ``metrics``,
    with the rollout settings' penalties and unfolded threshold (their check: ``RolloutConfig.validate``).

    Returns the judge's verdict per branch fold id (empty without a judge).
    """
    verdicts: dict[int, ScopeVerdict] = {}
    if judge is not None:  # all branches at once: one judge timeout bounds the wait, not one per branch
        cases = branch_cases(episode)
        found = await asyncio.gather(*(judge.judge(case) for case in cases.values()))
        verdicts = dict(zip(cases, found, strict=True))
    main = next((s for s in episode.segments if s.kind == "main"), None)
    unfolded = _unfolded(main, config) if main is not None else {}
    counts = dict.fromkeys(KINDS, 0)
    generated = penalised = 0
    for seg in episode.segments:
        verdict = verdicts.get(seg.fold_id) if seg.kind == "branch" else None
        out_of_scope = verdict is not None and verdict.out_of_scope is True
        for turn in seg.turns:
            n = len(turn.output_ids)
            per_kind = {
                "unfolded": unfolded.get(turn.index, [0.0] * n) if seg.kind == "main" else [0.0] * n,
                "failure": [config.failure_penalty if turn.error is not None else 0.0] * n,
                "out_of_scope": [config.scope_penalty if out_of_scope else 0.0] * n,
            }
            q = [sum(values) for values in zip(*per_kind.values(), strict=True)]
            turn.process_reward = q
            for kind, values in per_kind.items():
                hit = sum(v < 0 for v in values)
                counts[kind] += hit
                if hit:
                    turn.reward_parts[f"process/{kind}"] = math.fsum(values)
            generated += n
            penalised += sum(v < 0 for v in q)
    episode.metrics.update({f"process/{kind}_tokens": float(c) for kind, c in counts.items()})
    episode.metrics["process/penalised_tokens"] = float(penalised)
    episode.metrics["process/generated_tokens"] = float(generated)
    episode.metrics["process/branches_judged"] = float(len(verdicts))
    episode.metrics["process/branches_out_of_scope"] = float(
        sum(v.out_of_scope is True for v in verdicts.values())
    )
    episode.metrics["process/judge_unparsed"] = float(sum(v.out_of_scope is None for v in verdicts.values()))
    return verdicts


def share_metrics(totals: Mapping[str, float]) -> dict[str, float]:
    """``rollout/process_share/<kind>``: share of generated tokens each penalty hit (summed episode counts)."""
    generated = totals.get("process/generated_tokens", 0.0)
    if generated <= 0:
        return {}
    out = {f"rollout/process_share/{k}": totals.get(f"process/{k}_tokens", 0.0) / generated for k in KINDS}
    out["rollout/process_share/any"] = totals.get("process/penalised_tokens", 0.0) / generated
    out["rollout/process_branches_out_of_scope"] = totals.get("process/branches_out_of_scope", 0.0)
    out["rollout/process_judge_unparsed"] = totals.get("process/judge_unparsed", 0.0)
    return out
