"""Scripted oracle for the fictional-wiki search tasks: the upper bound for evaluation and tests.

It follows the oracle protocol every env family uses (``reset(task)``, then ``act(observation)``
returns the next action *text*) and acts only through the tools, with real Hermes tool calls:
for each hop it searches the current entity's name, opens the result whose title is exactly that
name (skipping near-duplicate distractors), reads the relation's infobox line and follows it
(:class:`SnippetSearchOracle` reads the line from the result's snippet where it is shown whole). It
never looks at the gold answer; it reads the question's chain from ``task.payload``.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from agentrl.env import Task, play_policy
from agentrl.envs.scripted import tool_call
from agentrl.envs.search.wiki import RELATIONS

RESULT_RE = re.compile(r"^\[\d+\] (\S+) \| (.+)$", re.MULTILINE)
# words that pull the page of an entity of this kind above pages that merely mention its name
KIND_HINTS = {
    "person": "born birthplace occupation",
    "city": "city population mayor founded",
    "company": "company founded headquartered employees",
    "country": "country capital independent currency",
}


class Oracle(Protocol):
    """What every scripted oracle offers."""

    def reset(self, task: Task) -> None: ...

    def act(self, observation: str, info: dict[str, Any] | None = None) -> str: ...


class SearchOracle:
    """Solves ``agentrl/Search-v0`` tasks through ``search``/``open`` (Hermes tool calls)."""

    def __init__(self, first_k: int = 5, max_k: int = 10):
        self.first_k, self.max_k = first_k, max_k
        self.task: Task | None = None

    def reset(self, task: Task) -> None:
        payload = task.payload
        self.task = task
        self.relations: list[str] = list(payload["relations"])
        self.name: str = payload["start"]
        self.kind: str = str(payload["start_id"]).split("/")[0]
        self.hop = 0
        self.tries = 0
        self.state = "search"

    def _queries(self) -> list[tuple[str, int]]:
        return [(self.name, self.first_k), (f"{self.name} {KIND_HINTS[self.kind]}", self.max_k)]

    def act(self, observation: str, info: dict[str, Any] | None = None) -> str:
        if self.task is None:
            raise RuntimeError("call reset(task) before act()")
        if self.state == "search":
            query, k = self._queries()[self.tries]
            self.state = "pick"
            return tool_call("search", query=query, k=k)
        if self.state == "pick":
            doc_id = next(
                (d for d, title in RESULT_RE.findall(observation) if title.strip() == self.name), None
            )
            if doc_id is None:
                self.tries += 1
                if self.tries >= len(self._queries()):
                    return "<answer>unknown</answer>"
                self.state = "search"
                return self.act(observation, info)
            self.state = "read"
            return tool_call("open", doc_id=doc_id)
        # state "read": the observation is the page of self.name
        value = self._read(observation)
        if value is None:
            return "<answer>unknown</answer>"
        if self.hop == len(self.relations):
            return f"<answer>{value}</answer>"
        return self.act(observation, info)

    def _read(self, observation: str) -> str | None:
        """The current hop's value from its page (None: not there); moves on to the next hop."""
        label, linked_kind = RELATIONS[self.relations[self.hop]]
        found = re.search(rf"^{re.escape(label)}: (.+)$", observation, re.MULTILINE)
        if found is None:
            return None
        value = found.group(1).strip()
        self.hop += 1
        if self.hop < len(self.relations):
            assert linked_kind is not None  # only link relations lead to another hop
            self.name, self.kind, self.tries, self.state = value, linked_kind, 0, "search"
        return value


class CitingSearchOracle(SearchOracle):
    """:class:`SearchOracle` whose answer turn first quotes the infobox line it read, then answers:
    ``Currency: wiokym`` then ``<answer>wiokym</answer>``. The choice of field is then made at the
    label, a token shared by every entity of a kind, instead of at the value, a fictional name seen
    once. Measured alone, its warm-up picks the label by position, not by the question; see
    :class:`PlanningSearchOracle` (docs/results/2026-11-28-quickstart-answer-turn.md)."""

    def act(self, observation: str, info: dict[str, Any] | None = None) -> str:
        action = super().act(observation, info)
        if action.startswith("<answer>") and self.hop == len(self.relations) and self.hop:
            label = RELATIONS[self.relations[-1]][0]
            return f"{label}: {action[len('<answer>') : -len('</answer>')]}\n{action}"
        return action


class PlanningSearchOracle(CitingSearchOracle):
    """:class:`CitingSearchOracle` that names the infobox label it is after in its first turn, right
    after the question (``Looking for: Currency``, then the search call): the question-to-field
    choice is made where the question is the nearest text, and the answer turn copies it."""

    def act(self, observation: str, info: dict[str, Any] | None = None) -> str:
        first = self.state == "search" and self.hop == 0 and self.tries == 0
        action = super().act(observation, info)
        if first and action.startswith("<tool_call>"):
            return f"Looking for: {RELATIONS[self.relations[-1]][0]}\n{action}"
        return action


#: a search result shown whole: followed by the next result or the closing line, not by the cut of an
#: over-long observation (``env.max_obs_chars``)
ENTRY_RE = re.compile(r"^\[\d+\] (\S+) \| (.+)\n    (.*)$(?=\n(?:\[\d+\] |Use open))", re.MULTILINE)
#: any infobox label followed by ": " (where a snippet's flattened infobox line starts a field)
LABEL_RE = re.compile("(" + "|".join(re.escape(label) for label, _ in RELATIONS.values()) + "): ")


def snippet_fields(snippet: str) -> str:
    """A search snippet's flattened infobox as ``Label: value`` lines; a field the snippet cut
    (``...`` at its end) is left out, so only values shown whole are read."""
    starts = [m.start() for m in LABEL_RE.finditer(snippet)]
    ends = [*starts[1:], len(snippet)] if starts else []  # each field runs to the next label
    fields = [snippet[a:b].strip() for a, b in zip(starts, ends, strict=True)]
    if fields and snippet.endswith("..."):
        fields.pop()
    return "\n".join(fields)


class SnippetSearchOracle(SearchOracle):
    """:class:`SearchOracle` that reads a hop's field from the search result's snippet where the
    snippet shows it whole, and opens the page only where it does not: on single-hop tasks ~90% of
    episodes are two turns (search, answer) instead of three, and a demonstration is ~21% fewer
    tokens (479 against 607 for the planning variant's quickstart demonstrations) to sample, learn from and evaluate."""

    def act(self, observation: str, info: dict[str, Any] | None = None) -> str:
        if self.task is not None and self.state == "pick":
            shown = (text for _, title, text in ENTRY_RE.findall(observation) if title.strip() == self.name)
            snippet = next(shown, None)
            # _read moves on to the next hop where the field is there
            value = None if snippet is None else self._read(snippet_fields(snippet))
            if value is not None:
                if self.hop == len(self.relations):
                    return f"<answer>{value}</answer>"
                return self.act(observation, info)  # the next hop's search
        return super().act(observation, info)


class SnippetPlanningSearchOracle(PlanningSearchOracle, SnippetSearchOracle):
    """:class:`PlanningSearchOracle` (``Looking for: Currency``, then the cited answer) that answers
    from the search result's snippet where it shows the field (:class:`SnippetSearchOracle`). Measured
    as the quickstart's warm-up and not shipped there (docs/results/2026-11-29-quickstart-avx2.md)."""


class FoldingSearchOracle(SearchOracle):
    """:class:`SearchOracle` that works each hop in a FoldGRPO branch (``rollout.folding=branch``).

    Main thread: one ``branch`` call per hop, then the answer. In the branch: search, open, then
    ``return`` with the fact found, so only that line comes back to the main thread. The warm-up
    uses it for demonstrations of folding (``train.sft_fold_share``).
    """

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.in_branch = False
        self.value: str | None = None

    def act(self, observation: str, info: dict[str, Any] | None = None) -> str:
        if self.task is None:
            raise RuntimeError("call reset(task) before act()")
        if not self.in_branch:
            if self.hop == len(self.relations) or (self.hop > 0 and self.value is None):
                return f"<answer>{self.value or 'unknown'}</answer>"
            self.in_branch = True
            label = RELATIONS[self.relations[self.hop]][0].lower()
            # short calls: a demonstrated turn must fit the policy's per-turn budget (rollout.max_new_tokens)
            return tool_call("branch", description=label, prompt=f"Find the {label} of {self.name}.")
        if self.state == "read":
            label = RELATIONS[self.relations[self.hop]][0]
            name, self.value = self.name, self._read(observation)
            self.in_branch = False
            if self.value is None:
                self.hop += 1  # give up: the main thread answers unknown
                return tool_call("return", message=f"{label} of {name}: not found")
            return tool_call("return", message=f"{label} of {name}: {self.value}")
        action = super().act(observation, info)  # search / pick
        if action.startswith("<answer>"):  # no page found: hand that back instead of answering here
            self.in_branch, self.value, self.hop = False, None, self.hop + 1
            return tool_call("return", message=f"{self.name}: no page found")
        return action


def run_oracle(
    env: Any, task: Task | None = None, *, seed: int | None = None
) -> tuple[float, dict[str, Any]]:
    """Play one episode of ``env`` (a made env or a TextEnv) with :class:`SearchOracle`.

    Returns:
        The final reward and the last step's info.
    """
    return play_policy(env, SearchOracle(), task=task, seed=seed)


class GoldQAOracle:
    """The oracle of the real QA sets (``agentrl/SearchQA-v0``): answers with the first gold answer.

    No retrieval corpus ships for these questions and no solving program is known, so, like the
    math oracle on MATH-500/AIME, it checks the pipeline (the shipped data, answer parsing, EM/F1
    scoring, the report), not question answering. It reads the gold answer from the task.
    """

    def __init__(self) -> None:
        self.task: Task | None = None

    def reset(self, task: Task) -> None:
        self.task = task

    def act(self, observation: str, info: dict[str, Any] | None = None) -> str:
        if self.task is None:
            raise RuntimeError("call reset(task) before act()")
        gold = self.task.answer
        return f"<answer>{gold[0] if isinstance(gold, list | tuple) else gold}</answer>"
