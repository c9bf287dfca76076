"""GAIA's official answer scorer, re-implemented rule for rule.

The leaderboard's ``question_scorer`` (gaia-benchmark/leaderboard ``scorer.py``) picks one of three
modes from the *gold* answer and never looks at the question:

- **number mode** when Python's ``float()`` accepts the gold string as is. The model answer loses
  every ``$``, ``%`` and ``,`` and must then parse with ``float()`` to exactly the gold value;
  anything else (``"17 km"``) counts as infinity and fails.
- **list mode** when the gold string holds a ``,`` or a ``;``. Both sides are split on either
  character; the lengths must match and the items are compared *in order*: an item whose gold
  parses as a float is compared in number mode, any other item after removing all whitespace and
  lower-casing (punctuation is kept). A consequence: a gold ``1,000`` is a two-item list
  ``["1", "000"]``, so the answer ``1000`` fails while ``1,000`` passes.
- **string mode** otherwise: whitespace removed, lower-cased, ASCII punctuation
  (``string.punctuation``) deleted; unicode punctuation such as ``’`` or ``–`` stays.

A missing answer is scored as the string ``"None"``, as the official scorer does. These quirks are
kept on purpose: numbers reported here are comparable with GAIA's leaderboard only if they are.
"""

from __future__ import annotations

import re
import string

_LIST_SEPARATORS = (",", ";")
_NUMBER_NOISE = ("$", "%", ",")
_ASCII_PUNCTUATION = str.maketrans("", "", string.punctuation)


def _parses_as_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def normalize_number_str(text: str) -> float:
    """Drop ``$``, ``%`` and ``,`` and parse as float; unparsable text becomes ``inf``."""
    for noise in _NUMBER_NOISE:
        text = text.replace(noise, "")
    try:
        return float(text)
    except ValueError:
        return float("inf")


def split_string(text: str) -> list[str]:
    """Split on every ``,`` and ``;`` (empty pieces are kept, like ``re.split``)."""
    return re.split("[" + "".join(_LIST_SEPARATORS) + "]", text)


def normalize_str(text: str, remove_punct: bool = True) -> str:
    """Remove all whitespace, lower-case, and (by default) delete ASCII punctuation."""
    compact = re.sub(r"\s", "", text).lower()
    return compact.translate(_ASCII_PUNCTUATION) if remove_punct else compact


def scoring_mode(ground_truth: str) -> str:
    """Which rule the gold answer selects: ``"number"``, ``"list"`` or ``"string"``."""
    if _parses_as_float(ground_truth):
        return "number"
    if any(sep in ground_truth for sep in _LIST_SEPARATORS):
        return "list"
    return "string"


def question_scorer(model_answer: str | None, ground_truth: str) -> bool:
    """True when ``model_answer`` matches ``ground_truth`` under GAIA's rules (see module doc)."""
    answer = "None" if model_answer is None else str(model_answer)
    mode = scoring_mode(ground_truth)
    if mode == "number":
        return normalize_number_str(answer) == float(ground_truth)
    if mode == "list":
        gold_items = split_string(ground_truth)
        answer_items = split_string(answer)
        if len(gold_items) != len(answer_items):
            return False
        for given, gold in zip(answer_items, gold_items, strict=True):
            if _parses_as_float(gold):
                if normalize_number_str(given) != float(gold):
                    return False
            elif normalize_str(given, remove_punct=False) != normalize_str(gold, remove_punct=False):
                return False
        return True
    return normalize_str(answer) == normalize_str(ground_truth)
