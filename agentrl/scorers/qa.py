"""Answer scorers used by environments and evaluation suites.

Pure functions of strings: no model, no I/O. Environments (``envs/``) import this module, so it
must stay free of heavy imports.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

# =========================================================================== QA (EM / F1)
# Owner: search helper. SQuAD v1.1 evaluation rules, as used by Search-R1, DeepResearcher and IGPO:
# lower-case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace; a prediction
# scores the max over the gold aliases.

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: ``"The  Eiffel-Tower!"`` -> ``"eiffeltower"``."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _as_list(golds: str | Sequence[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else [str(g) for g in golds]


def exact_match(prediction: str | None, golds: str | Sequence[str]) -> float:
    """1.0 when the normalised prediction equals any normalised gold alias, else 0.0."""
    if prediction is None:
        return 0.0
    normalized = normalize_answer(prediction)
    return float(any(normalized == normalize_answer(g) for g in _as_list(golds)))


def _token_f1(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        # both empty counts as a match (SQuAD 2.0 convention); one empty is a miss
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str | None, golds: str | Sequence[str]) -> float:
    """Token-level F1 of the normalised prediction, max over the gold aliases."""
    if prediction is None:
        return 0.0
    return max((_token_f1(prediction, g) for g in _as_list(golds)), default=0.0)


def qa_scores(prediction: str | None, golds: str | Sequence[str]) -> dict[str, float]:
    """``{"em": ..., "f1": ...}`` for one prediction against its gold aliases."""
    return {"em": exact_match(prediction, golds), "f1": f1_score(prediction, golds)}


# =========================================================================== end of QA section
