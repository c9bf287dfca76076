"""WebShop's reward against hand-computed cases: each factor alone, then combined."""

from __future__ import annotations

import pytest

from agentrl.envs.web.reward import compute_reward, fuzzy, normalize_color, option_matches, type_factor

LEXICON = {"acme", "chips", "crisps", "snack", "shirt", "men", "tee", "socks", "pack"}

GOAL = {
    "goal_attrs": ["gluten free", "non gmo"],
    "goal_options": {"flavor": "sea salt", "size": "8 ounce"},
    "price_upper": 20.0,
    "goal_query": "puffed snacks",
    "goal_path": ["grocery", "snacks", "puffed snacks"],
    "goal_name": "Acme Gluten Free Chips",
}
PRODUCT = {
    "product_attrs": ["gluten free", "non gmo", "low carb"],
    "product_title": "Acme Classic Gluten Free Chips",
    "product_bullets": ["Low Carb: light and crunchy"],
    "product_description": "Our best chips.",
    "product_query": "puffed snacks",
    "product_path": ["grocery", "snacks", "puffed snacks"],
    "paid_price": 10.0,
    "chosen_options": {"flavor": "sea salt", "size": "8 ounce"},
}


def reward(**changes):
    return compute_reward(**{**GOAL, **PRODUCT, **changes, "lexicon": LEXICON})


def test_everything_matches_gives_one():
    parts = reward()
    assert (parts.n_att, parts.n_opt, parts.r_price, parts.r_type, parts.reward) == (2, 2, 1.0, 1.0, 1.0)


def test_attributes_alone():
    # neither goal attribute in the attributes, title, bullets or description: (0 + 2 + 1) / 5
    parts = reward(product_attrs=["low carb"], product_title="Acme Classic Chips")
    assert parts.n_att == 0 and parts.reward == pytest.approx(3 / 5)
    # one found only as a lower-case substring of a bullet point: (1 + 2 + 1) / 5
    parts = reward(
        product_attrs=["low carb"], product_title="Acme Chips", product_bullets=["Made NON GMO, always"]
    )
    assert parts.n_att == 1 and parts.reward == pytest.approx(4 / 5)
    # fuzzy: "non-gmo" and "gluten-free" match after punctuation becomes space (ratio 100 > 85)
    parts = reward(product_attrs=["non-gmo", "Gluten-Free"], product_title="Acme Chips")
    assert parts.n_att == 2 and parts.reward == 1.0


def test_options_alone():
    parts = reward(chosen_options={"flavor": "barbecue"})  # (2 + 0 + 1) / 5
    assert parts.n_opt == 0 and parts.reward == pytest.approx(3 / 5)
    parts = reward(chosen_options={"flavor": "sea salt"})  # (2 + 1 + 1) / 5
    assert parts.n_opt == 1 and parts.reward == pytest.approx(4 / 5)
    parts = reward(chosen_options={})  # nothing chosen
    assert parts.n_opt == 0 and parts.r_opt == 0.0


def test_colour_normalisation():
    assert normalize_color("Navy Blue") == "navy" and normalize_color("8 ounce") == "8 ounce"
    # raw token-set ratio is 62.5, but both map to "black"
    assert (
        fuzzy("black 2 pack", "black white") < 85 and option_matches(["black 2 pack"], ["black white"]) == 1
    )
    # "navy blue" maps to its first colour word "navy", which is not "blue" (raw ratio would be 100)
    assert fuzzy("blue", "navy blue") == 100 and option_matches(["blue"], ["navy blue"]) == 0


def test_price_alone():
    parts = reward(paid_price=25.0)  # (2 + 2 + 0) / 5
    assert parts.r_price == 0.0 and parts.reward == pytest.approx(4 / 5)
    assert reward(paid_price=20.0).r_price == 1.0  # the cap itself is allowed


def test_type_factor_cases():
    base = {"product_query": "a", "goal_query": "b", "product_path": ["x", "y"], "goal_path": ["p", "q"],
            "lexicon": LEXICON}  # fmt: skip
    # same query -> 1 (title overlap 1/3 >= 0.1)
    assert type_factor(
        **{**base, "product_query": "b"}, product_title="Acme Tee", goal_name="Acme Shirt Men"
    ) == (
        1.0,
        pytest.approx(1 / 3),
    )
    # two shared category-path items -> 1
    assert (
        type_factor(
            **{**base, "product_path": ["p", "q", "r"]}, product_title="Acme Tee", goal_name="Acme Shirt Men"
        )[0]
        == 1.0
    )
    # no query/category match, overlap 2/3 > 0.2 -> 1
    assert type_factor(**base, product_title="Acme Shirt", goal_name="Acme Shirt Men")[0] == 1.0
    # no match, overlap exactly 0.2 (1 of 5 nouns) -> 0.5
    r_type, score = type_factor(**base, product_title="Acme Tee", goal_name="Acme Shirt Men Socks Pack")
    assert (r_type, score) == (0.5, pytest.approx(0.2))
    # overlap below 0.1 (1 of 11) -> 0.1 even with the same query
    goal = "acme shirt men socks pack tee chips crisps snack " + " ".join(["acme"] * 3)
    lexicon = LEXICON | {"extra1", "extra2"}
    r_type, score = type_factor(
        **{**base, "product_query": "b", "lexicon": lexicon},
        product_title="Acme",
        goal_name=goal + " extra1 extra2",
    )
    assert score == pytest.approx(1 / 11) and r_type == 0.1
    # no shared noun -> 0
    assert (
        type_factor(**{**base, "product_query": "b"}, product_title="Acme Tee", goal_name="Shirt")[0] == 0.0
    )
    # a goal name without nouns gives title score 0.2 (WebShop's default): 0.5 without another match
    assert type_factor(**base, product_title="Acme", goal_name="Classic Blue") == (0.5, 0.2)


def test_combined_factors():
    # another query and category, title nouns overlap 1 of 5 (0.2, not > 0.2): r_type 0.5;
    # one attribute (substring of the title), one option, over the price: 0.5 * (1 + 1 + 0) / 5 = 0.2
    parts = reward(
        product_query="other",
        product_path=["home", "decor"],
        product_title="Acme Bowl Non Gmo",
        goal_name="Acme Chips Crisps Snack Pack",  # 1 of 5 -> 0.2 -> r_type 0.5
        product_attrs=["low carb"],
        chosen_options={"flavor": "sea salt", "size": "16 ounce"},
        paid_price=30.0,
    )
    assert (parts.r_type, parts.n_att, parts.n_opt, parts.r_price) == (0.5, 1, 1, 0.0)
    assert parts.reward == pytest.approx(0.5 * 2 / 5)
