"""A scripted shopper that knows the goal and acts only through the page text and real actions.

It searches with the goal's noun and attributes, opens the best-looking affordable result, checks
the options on the item page and the attributes on the Features page, goes back when a candidate
fails, selects the goal's options and buys. Protocol: ``reset(task)``, ``act(observation) -> str``.
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.env import Task

_RESULT_RE = re.compile(r"^\[(B0[A-Z0-9]{8})\]\n(.+)\n\$([0-9.]+)$", re.MULTILINE)
_OPTION_LINE_RE = re.compile(r"^([a-z ]+): ((?:\[[^\]]+\](?: \(selected\))? ?)+)$", re.MULTILINE)
_VALUE_RE = re.compile(r"\[([^\]]+)\]( \(selected\))?")
_PRICE_RE = re.compile(r"^Price: \$([0-9.]+)$", re.MULTILINE)


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


class WebShopOracle:
    """Scripted policy for the web env (see the module docstring)."""

    #: select the goal's options as soon as an affordable matching item opens, before its Features check
    options_first = False

    def __init__(self) -> None:
        self.goal: dict[str, Any] = {}
        self.reset_state()

    def reset_state(self) -> None:
        self.visited: set[str] = set()
        self.verified: dict[str, bool] = {}
        self.current: str | None = None
        self.query_index = 0

    def reset(self, task: Task | dict[str, Any]) -> None:
        payload = task.payload if isinstance(task, Task) else task.get("payload", task)
        self.goal = dict(payload)
        self.reset_state()

    # ------------------------------------------------------------------ helpers
    def _queries(self) -> list[str]:
        noun, attrs = self.goal["noun"], " ".join(self.goal["attributes"])
        options = " ".join(self.goal["options"].values())
        return [f"{noun} {attrs} {options}", f"{noun} {attrs}", noun]

    def _noun_ok(self, title: str) -> bool:
        noun_words = _words(self.goal["noun"]) - {"men", "women", "s", "boys", "girls"}
        return bool(noun_words) and noun_words <= _words(title)

    def _candidate_score(self, title: str) -> float:
        lowered = title.lower()
        return 2.0 * self._noun_ok(title) + sum(a.lower() in lowered for a in self.goal["attributes"])

    # ------------------------------------------------------------------ policy
    def act(self, observation: str, info: dict[str, Any] | None = None) -> str:
        if "shop server restarted" in observation:
            self.reset_state()
        if "Thank you for shopping" in observation:
            return "click[Back to Search]"
        if "[Buy Now]" in observation:
            return self._on_item(observation)
        if re.search(r"^Features$", observation, re.MULTILINE) and self.current:
            text = "\n".join(observation.lower().split("\n")[1:])  # not the instruction line
            self.verified[self.current] = all(a.lower() in text for a in self.goal["attributes"])
            return "click[< Prev]"
        if "(Total results:" in observation:
            return self._on_results(observation)
        if "[Search]" in observation:
            query = self._queries()[min(self.query_index, 2)]
            self.query_index += 1
            return f"search[{query}]"
        return "click[< Prev]" if "[< Prev]" in observation else "click[Back to Search]"

    def _on_results(self, observation: str) -> str:
        cap = float(self.goal["price_upper"])
        best, best_score = None, -1.0
        for asin, title, price in _RESULT_RE.findall(observation):
            if asin in self.visited or float(price) > cap:
                continue
            score = self._candidate_score(title)
            if score > best_score:
                best, best_score = asin, score
        if best is not None and best_score >= 2.0:
            self.current = best
            return f"click[{best}]"
        if "[Next >]" in observation:
            return "click[Next >]"
        return "click[Back to Search]"

    def _on_item(self, observation: str) -> str:
        asin = self.current
        title = observation.split("\n")[2] if observation.count("\n") >= 2 else ""
        price_found = _PRICE_RE.search(observation)
        price = float(price_found.group(1)) if price_found else float("inf")
        groups = {}
        for name, values in _OPTION_LINE_RE.findall(observation):
            groups[name.strip()] = {v: bool(sel) for v, sel in _VALUE_RE.findall(values)}
        wanted = self.goal["options"]
        ok = price <= float(self.goal["price_upper"]) and self._noun_ok(title)
        ok = ok and all(value in groups.get(name, {}) for name, value in wanted.items())
        unselected = [value for name, value in wanted.items() if ok and not groups[name][value]]
        if unselected and self.options_first:
            return f"click[{unselected[0]}]"
        if ok and asin is not None and asin not in self.verified:
            attrs_in_title = all(a.lower() in title.lower() for a in self.goal["attributes"])
            if not attrs_in_title:
                return "click[Features]"
            self.verified[asin] = True
        if not ok or (asin is not None and not self.verified.get(asin, False)):
            if asin is not None:
                self.visited.add(asin)
            return "click[< Prev]"
        return f"click[{unselected[0]}]" if unselected else "click[Buy Now]"


class OptionsFirstWebShopOracle(WebShopOracle):
    """The same shopper, selecting the goal's options on the item page before checking its Features.

    Its item page is then followed by an option click while an option is unselected, and by
    ``click[Buy Now]`` once the Features check came back; the default order checks Features first, so
    the page it comes back to asks for options, which a small warm-started policy skipped
    (see benchmarks/results/gpu_h200/shop_warmups/)."""

    options_first = True
