"""EM / F1 with SQuAD normalisation, checked by hand."""

from __future__ import annotations

import pytest

from agentrl.scorers.qa import exact_match, f1_score, normalize_answer, qa_scores


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an   apple\tpie\n", "apple pie"),
        ("A.B.C.", "abc"),
        ("Hello, World!", "hello world"),
        ("theater", "theater"),  # "the" only as a whole word
        ("1,204", "1204"),
        ("Jean-Paul", "jeanpaul"),
        ("", ""),
    ],
)
def test_normalize_answer(raw: str, normalized: str) -> None:
    assert normalize_answer(raw) == normalized


def test_exact_match_ignores_case_articles_punctuation_whitespace() -> None:
    assert exact_match("the  EIFFEL tower.", "Eiffel Tower") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    assert exact_match(None, "x") == 0.0


def test_exact_match_takes_the_best_alias() -> None:
    assert exact_match("1204", ["1,204", "one thousand two hundred four"]) == 1.0
    assert exact_match("March 14, 1902", ["14 March 1902", "March 14, 1902"]) == 1.0
    assert exact_match("1205", ["1,204", "1204"]) == 0.0


def test_f1_by_hand() -> None:
    # pred tokens {new, york, city}, gold {new, york}: P = 2/3, R = 1, F1 = 0.8
    assert f1_score("New York City", "New York") == pytest.approx(0.8)
    # the article is dropped before counting: pred {red, car}, gold {car}: P = 1/2, R = 1 -> 2/3
    assert f1_score("the red car", "a car") == pytest.approx(2 / 3)
    assert f1_score("blue", "red") == 0.0
    # repeated tokens count with multiplicity: "paris paris" vs "paris": P = 1/2, R = 1 -> 2/3
    assert f1_score("Paris Paris", "Paris") == pytest.approx(2 / 3)
    assert f1_score("", "Paris") == 0.0
    assert f1_score(None, "Paris") == 0.0


def test_f1_max_over_aliases() -> None:
    assert f1_score("York", ["New York", "Big Apple"]) == pytest.approx(2 / 3)
    assert f1_score("big apple", ["New York", "Big Apple"]) == 1.0


def test_qa_scores_has_both() -> None:
    assert qa_scores("New York City", ["New York"]) == {"em": 0.0, "f1": pytest.approx(0.8)}
    assert qa_scores("new york", "New York") == {"em": 1.0, "f1": 1.0}
