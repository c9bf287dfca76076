"""Answer extraction and mathematical-equivalence scoring for the code-interpreter env.

Modes (``Task.payload["compare"]``):

- ``"math"``: ``math-verify`` decides equivalence (gold parsed first, as its docs ask), both sides
  wrapped in ``\\boxed{}``; a timeout bounds each parse/verify (only in the main thread: math-verify's
  timeout uses SIGALRM, so other threads run without one).
- ``"int"``: both sides read as integers (AIME: ``"070"`` equals ``70``; commas and ``\\boxed{}`` are fine).
- ``"number"``: decimals within 1e-6 (e.g. an average rounded to 2 places).
- ``"text"``: stripped, case-folded string equality (weekdays, ISO dates).
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction

MATH_TIMEOUT_S = 5
MAX_ANSWER_CHARS = 2000  # longer answers are not parsed (sympy on huge strings is slow)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, if any."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract_answer(text: str) -> str:
    """The answer inside a final-answer text: the last ``\\boxed{}`` if present, without ``$``."""
    boxed = last_boxed(text)
    answer = boxed if boxed is not None else text
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == "$" and answer[-1] == "$":
        answer = answer.strip("$").strip()
    return answer


def _plain_number(text: str) -> str:
    text = re.sub(r"\\[,!; ]|\\text\{[^}]*\}|\\%|%|\$", "", text)
    return text.replace(",", "").replace(" ", "").strip().rstrip(".")


def as_int(text: str) -> int | None:
    """Read an integer answer (``"070"``, ``"1,234"``, ``"12.0"``); None if it is not one."""
    plain = _plain_number(extract_answer(text))
    if re.fullmatch(r"[+-]?\d+", plain):
        return int(plain)
    if re.fullmatch(r"[+-]?\d+\.0*", plain):
        return int(plain.split(".")[0])
    return None


def as_number(text: str) -> Fraction | None:
    plain = _plain_number(extract_answer(text))
    fraction = re.fullmatch(r"\\[dt]?frac\{(-?\d+)\}\{(\d+)\}", plain)
    if fraction:
        return Fraction(int(fraction.group(1)), int(fraction.group(2)))
    try:
        return Fraction(plain)
    except (ValueError, ZeroDivisionError):
        return None


def math_equal(answer: str, gold: str, timeout_s: int = MATH_TIMEOUT_S) -> bool:
    """math-verify equivalence of ``answer`` and ``gold`` (gold first)."""
    from math_verify import parse, verify

    in_main = threading.current_thread() is threading.main_thread()
    timeout = timeout_s if in_main else None
    gold_parsed = parse("\\boxed{" + extract_answer(gold) + "}", parsing_timeout=timeout)
    answer_parsed = parse("\\boxed{" + extract_answer(answer) + "}", parsing_timeout=timeout)
    if not gold_parsed or not answer_parsed:
        return False
    return bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout))


def is_correct(answer: str | None, gold: str, mode: str = "math") -> bool:
    """Score one final answer against the gold answer in ``mode`` (see the module docstring)."""
    if answer is None or not answer.strip() or len(answer) > MAX_ANSWER_CHARS:
        return False
    if mode == "int":
        value = as_int(answer)
        return value is not None and value == as_int(gold)
    if mode == "number":
        got, want = as_number(answer), as_number(gold)
        return got is not None and want is not None and abs(got - want) <= Fraction(1, 10**6)
    if mode == "text":
        return extract_answer(answer).strip().strip(".").casefold() == extract_answer(gold).strip().casefold()
    if mode == "math":
        if extract_answer(answer) == extract_answer(gold):
            return True
        return math_equal(answer, gold)
    raise ValueError(f"unknown compare mode {mode!r}; use math, int, number or text")
