"""Answer extraction and scoring of the code env: hand-picked cases, math-verify with gold first."""

from __future__ import annotations

import threading

import pytest

from agentrl.envs.code.scoring import as_int, extract_answer, is_correct, last_boxed


def test_last_boxed_handles_nested_braces_and_takes_the_last():
    assert last_boxed(r"first \boxed{1} then \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert last_boxed("no box here") is None
    assert last_boxed(r"\boxed{unclosed") is None
    assert extract_answer(r"The answer is $\boxed{42}$.") == "42"
    assert extract_answer(" $7$ ") == "7"


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [("070", "70", 70), ("1,234", "1234", 1234), (r"\boxed{204}", "204", 204), ("12.0", "12", 12)],
)
def test_integer_reading(answer, gold, expected):
    assert as_int(answer) == expected == as_int(gold)


@pytest.mark.parametrize(
    ("answer", "gold", "mode", "correct"),
    [
        ("70", "070", "int", True),  # AIME 2024 answers are zero-padded
        (r"\boxed{70}", "70", "int", True),
        ("71", "70", "int", False),
        ("seventy", "70", "int", False),
        ("12.35", "12.35", "number", True),
        ("12.3500001", "12.35", "number", True),
        ("12.36", "12.35", "number", False),
        ("friday", "Friday", "text", True),
        ("2031-05-04", "2031-05-04", "text", True),
        ("2031-05-05", "2031-05-04", "text", False),
        ("0.5", r"\frac{1}{2}", "math", True),
        (r"\frac{2}{4}", r"\frac{1}{2}", "math", True),
        (r"(3, \frac{\pi}{2})", r"\left( 3, \frac{\pi}{2} \right)", "math", True),
        (r"(3, \pi)", r"\left( 3, \frac{\pi}{2} \right)", "math", False),
        (r"2\sqrt{2}", r"\sqrt{8}", "math", True),
        ("3", r"\sqrt{8}", "math", False),
        (None, "1", "math", False),
        ("", "1", "int", False),
    ],
)
def test_is_correct(answer, gold, mode, correct):
    assert is_correct(answer, gold, mode) is correct


def test_math_verify_works_outside_the_main_thread():
    # math-verify's timeout uses SIGALRM (main thread only); rollout workers are threads.
    results = []
    worker = threading.Thread(target=lambda: results.append(is_correct(r"\frac{6}{8}", "0.75", "math")))
    worker.start()
    worker.join(60)
    assert results == [True]


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="unknown compare mode"):
        is_correct("1", "1", "fuzzy")
