"""GAIA scorer: hand-made cases, including the official scorer's quirks."""

from __future__ import annotations

import pytest

from agentrl.scorers.gaia import (
    normalize_number_str,
    normalize_str,
    question_scorer,
    scoring_mode,
    split_string,
)


@pytest.mark.parametrize(
    ("gold", "mode"),
    [
        ("17", "number"),
        ("3.5", "number"),
        ("-2", "number"),
        ("1e3", "number"),
        (" 42 ", "number"),  # float() strips surrounding whitespace
        ("1,000", "list"),  # not a float: float("1,000") fails, and it holds a comma
        ("a; b", "list"),
        ("$5", "string"),  # float("$5") fails and there is no separator
        ("Paris", "string"),
    ],
)
def test_mode_follows_the_gold_answer(gold: str, mode: str) -> None:
    assert scoring_mode(gold) == mode


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [
        # number mode: $ % , are removed from the answer, then float equality
        ("17", "17", True),
        ("17.0", "17", True),
        ("$17", "17", True),
        ("17%", "17", True),
        ("1,700", "1700", True),
        (" 17 ", "17", True),
        ("17 km", "17", False),  # units are not stripped
        ("seventeen", "17", False),
        ("17.01", "17", False),
        ("0.1", "0.10", True),
        (None, "17", False),
        # list mode: a gold 1,000 is the two-item list ["1", "000"]
        ("1000", "1,000", False),
        ("1,000", "1,000", True),
        ("1;000", "1,000", True),  # both separators split
        ("1, 0", "1,000", True),  # "000" is compared as the number 0
        # list order matters, lengths must match
        ("apple, banana", "apple, banana", True),
        ("banana, apple", "apple, banana", False),
        ("apple", "apple, banana", False),
        ("apple, banana, cherry", "apple, banana", False),
        # list items: whitespace and case ignored, punctuation kept
        ("Apple ,BANANA", "apple, banana", True),
        ("apple., banana", "apple, banana", False),
        ("sea gull, tern", "seagull, tern", True),
        # numeric list items compared as numbers
        ("3.0, $4", "3, 4", True),
        ("3 cm, 4", "3, 4", False),
        # string mode: whitespace, case and ASCII punctuation ignored
        ("Paris", "paris", True),
        ("  P a r i s.", "Paris", True),
        ("St. Louis", "St Louis", True),
        ("Saint Louis", "St Louis", False),
        ("$5", "$5", True),
        ("5", "$5", True),  # "$" is ASCII punctuation, removed on both sides
        # unicode punctuation is NOT removed
        ("Obrien", "O’Brien", False),
        ("O’Brien", "O’Brien", True),
        ("O'Brien", "O’Brien", False),
        ("1990–1995", "1990-1995", False),
        (None, "None", True),  # the official scorer turns a missing answer into "None"
    ],
)
def test_question_scorer(answer: str | None, gold: str, expected: bool) -> None:
    assert question_scorer(answer, gold) is expected


def test_helpers() -> None:
    assert normalize_number_str("$1,234.5%") == 1234.5
    assert normalize_number_str("12 apples") == float("inf")
    assert split_string("a,b;c,,") == ["a", "b", "c", "", ""]
    assert normalize_str(" Hello, World! ") == "helloworld"
    assert normalize_str(" Hello, World! ", remove_punct=False) == "hello,world!"
