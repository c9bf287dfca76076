"""WebShop's reward (Yao et al. 2022, ``web_agent_site/engine/goal.py``), recomputed here.

``R = r_type * (n_att + n_opt + r_price) / (|goal_attrs| + |goal_opts| + 1)``

- ``n_att``: goal attributes found in the product: some product attribute has a fuzzy token-set
  ratio > 85 with it, else it is a lower-case substring of the title, bullet points or description.
- ``n_opt``: goal options matched (> 85) by some chosen option, after mapping both to their first
  colour word ("black 2 pack" -> "black", "navy blue" -> "navy"; see :func:`normalize_color`).
- ``r_price``: 1 if the paid price is at most the goal's cap (0 if there is a cap and it is over).
- ``r_type``: 1.0; 0.5 if none of (same search query, >= 2 shared category-path items, title-noun
  overlap > 0.2); 0.1 if the overlap is < 0.1; 0 if it is 0.

Fuzzy matching uses rapidfuzz's ``token_set_ratio`` with its ``default_process`` (lower-case,
non-alphanumerics to spaces), as thefuzz's ``full_process`` did in WebShop.

Difference to WebShop: WebShop keeps the title tokens that spaCy's ``en_core_web_sm`` tags NOUN,
PROPN (or "PNOUN") for the title overlap. That model cannot be downloaded here, so a title's nouns
are its tokens found in the catalogue's noun lexicon: the words of every product type's noun
phrases, the brand names and a few shop nouns (men, women, pack, set). Adjectives, attribute words
that are not also product nouns, numbers and units never count, where spaCy would tag some of them
NOUN (e.g. "cotton", "oz"); the overlap is therefore computed over fewer, more type-specific words.

Difference in colour normalisation: WebShop returns the first colour of its list that is a
substring of the option; we return the first *word* of the option that is a colour, which avoids
substring accidents ("red" in "shredded") and reads as the research notes describe it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentrl.envs.web.vocab import COLORS

if TYPE_CHECKING:
    from agentrl.envs.web.catalog import Goal, Product
from rapidfuzz import fuzz, utils

MATCH_THRESHOLD = 85.0
_COLOR_SET = frozenset(COLORS)


def fuzzy(a: str, b: str) -> float:
    """Token-set ratio (0-100) with WebShop's preprocessing."""
    return fuzz.token_set_ratio(a, b, processor=utils.default_process)


def normalize_color(option: str) -> str:
    """The option's first colour word, or the option unchanged if it names no colour."""
    for word in re.findall(r"[a-z]+", option.lower()):
        if word in _COLOR_SET:
            return word
    return option


def title_nouns(title: str, lexicon: Iterable[str]) -> set[str]:
    """The title's tokens that are nouns according to ``lexicon`` (stands in for spaCy tags)."""
    words = set(lexicon)
    return {w for w in re.findall(r"[a-z0-9]+", title.lower()) if w in words}


@dataclass(frozen=True)
class RewardParts:
    """Every factor of the reward, for metrics and tests."""

    reward: float
    r_type: float
    n_att: int
    n_opt: int
    r_price: float
    r_att: float  # n_att / |goal_attrs| (1 when the goal has none)
    r_opt: float  # n_opt / |goal_opts| (1 when the goal has none)
    title_score: float


def attribute_matches(
    goal_attrs: list[str], attributes: list[str], title: str, bullets: list[str], description: str
) -> int:
    count = 0
    haystacks = (title.lower(), " ".join(bullets).lower(), description.lower())
    for goal_attr in goal_attrs:
        if any(fuzzy(p_attr, goal_attr) > MATCH_THRESHOLD for p_attr in attributes):
            count += 1
        elif any(goal_attr.lower() in text for text in haystacks):
            count += 1
    return count


def option_matches(goal_options: Iterable[str], chosen_options: Iterable[str]) -> int:
    chosen = [normalize_color(o) for o in chosen_options]
    return sum(
        1
        for goal in (normalize_color(g) for g in goal_options)
        if any(fuzzy(c, goal) > MATCH_THRESHOLD for c in chosen)
    )


def type_factor(
    *,
    product_query: str,
    goal_query: str,
    product_path: Iterable[str],
    goal_path: Iterable[str],
    product_title: str,
    goal_name: str,
    lexicon: Iterable[str],
) -> tuple[float, float]:
    """(r_type, title_score) as in WebShop's ``get_type_reward``."""
    lexicon = set(lexicon)
    desired = title_nouns(goal_name, lexicon)
    purchased = title_nouns(product_title, lexicon)
    title_score = 0.2 if not desired else len(desired & purchased) / len(desired)
    query_match = product_query == goal_query
    category_match = len({p.strip() for p in product_path} & {g.strip() for g in goal_path}) >= 2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, title_score


def compute_reward(
    *,
    goal_attrs: list[str],
    goal_options: Mapping[str, str] | Iterable[str],
    price_upper: float,
    goal_query: str,
    goal_path: Iterable[str],
    goal_name: str,
    product_attrs: list[str],
    product_title: str,
    product_bullets: list[str],
    product_description: str,
    product_query: str,
    product_path: Iterable[str],
    paid_price: float,
    chosen_options: Mapping[str, str] | Iterable[str],
    lexicon: Iterable[str],
) -> RewardParts:
    """WebShop's reward for buying a product with ``chosen_options`` at ``paid_price``."""
    goal_option_values = (
        list(goal_options.values()) if isinstance(goal_options, Mapping) else list(goal_options)
    )
    chosen_values = (
        list(chosen_options.values()) if isinstance(chosen_options, Mapping) else list(chosen_options)
    )
    r_type, title_score = type_factor(
        product_query=product_query,
        goal_query=goal_query,
        product_path=product_path,
        goal_path=goal_path,
        product_title=product_title,
        goal_name=goal_name,
        lexicon=lexicon,
    )
    n_att = attribute_matches(goal_attrs, product_attrs, product_title, product_bullets, product_description)
    n_opt = option_matches(goal_option_values, chosen_values)
    r_price = float(paid_price <= price_upper) if price_upper > 0 else 1.0
    total = (n_att + n_opt + r_price) / (len(goal_attrs) + len(goal_option_values) + 1)
    return RewardParts(
        reward=total * r_type,
        r_type=r_type,
        n_att=n_att,
        n_opt=n_opt,
        r_price=r_price,
        r_att=n_att / len(goal_attrs) if goal_attrs else 1.0,
        r_opt=n_opt / len(goal_option_values) if goal_option_values else 1.0,
        title_score=title_score,
    )


def reward_for_purchase(
    goal: Goal, product: Product, options: Mapping[str, str], lexicon: Iterable[str]
) -> RewardParts:
    """Convenience wrapper over :func:`compute_reward` for a catalogue ``Goal`` and ``Product``."""
    return compute_reward(
        goal_attrs=goal.attributes,
        goal_options=goal.options,
        price_upper=goal.price_upper,
        goal_query=goal.query,
        goal_path=goal.path,
        goal_name=goal.name,
        product_attrs=product.attributes,
        product_title=product.title,
        product_bullets=product.features,
        product_description=product.description,
        product_query=product.type_name,
        product_path=product.path,
        paid_price=product.price,
        chosen_options=options,
        lexicon=lexicon,
    )
