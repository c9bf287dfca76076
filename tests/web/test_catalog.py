"""The seeded catalogue and goals: size, variety, determinism, splits, the built-in vocabulary by name."""

from __future__ import annotations

import pytest

from agentrl.envs.web.catalog import Catalog, get_catalog
from agentrl.envs.web.env import purchase_reward
from agentrl.envs.web.vocab import load_vocabulary
from agentrl.errors import EnvError


def test_catalogue_size_variety_and_determinism():
    catalog = get_catalog(0, 1500, "auto")
    assert len(catalog.products) == 1500 and len(catalog.by_asin) == 1500
    assert len({p.type_name for p in catalog.products}) >= 25
    assert len({p.family for p in catalog.products}) == 7
    assert sum(p.variant_of is not None for p in catalog.products) >= 300  # near-duplicate distractors
    again = Catalog(seed=0, n_products=1500)
    assert again.fingerprint == catalog.fingerprint
    assert Catalog(seed=1, n_products=1500).fingerprint != catalog.fingerprint
    for product in catalog.products[:50]:
        assert product.options and product.attributes and product.features and product.price > 0
        assert all(
            a.title().split()[0].lower() in " ".join(product.features).lower() for a in product.attributes
        )


def test_variants_differ_in_what_the_reward_checks():
    catalog = get_catalog(0, 1500, "auto")
    for variant in (p for p in catalog.products if p.variant_of):
        base = catalog.by_asin[variant.variant_of]
        assert (
            variant.attributes != base.attributes
            or variant.options != base.options
            or variant.price != base.price
            or variant.type_name != base.type_name
        ), variant.asin


def test_goals_splits_and_targets_score_one():
    catalog = get_catalog(0, 1500, "auto")
    goals = {split: catalog.goals(split) for split in ("train", "dev", "test")}
    assert {s: len(g) for s, g in goals.items()} == {"train": 2000, "dev": 200, "test": 500}
    targets = {s: {g.asin for g in gs} for s, gs in goals.items()}
    assert not targets["test"] & targets["train"] and not targets["test"] & targets["dev"]
    assert len({g.id for g in goals["test"]}) == 500
    for goal in goals["test"][:100]:
        assert goal.instruction.endswith(f"price lower than {goal.price_upper:.2f} dollars")
        assert all(a in goal.instruction for a in goal.attributes)
        assert all(v in goal.instruction for v in goal.options.values())
        target = catalog.by_asin[goal.asin]
        assert target.price <= goal.price_upper
        assert purchase_reward(goal, {"asin": goal.asin, "options": goal.options}, catalog).reward == 1.0


def test_real_vocabulary_ships_and_builtin_only_by_name(tmp_path, caplog):
    vocab = load_vocabulary("auto")
    assert vocab.source == "webshop" and len(vocab.types) >= 100
    assert vocab.openers[0][0] == "i am looking for"  # the most common opener of the human goals
    with pytest.raises(EnvError, match="items_ins_v2_1000.json, which does not exist"):
        load_vocabulary(tmp_path)  # a folder without webshop/: an error, not the built-in words
    with caplog.at_level("WARNING"):
        builtin = Catalog(seed=0, n_products=1000, data_dir="builtin")
    assert "built-in vocabulary (data_dir='builtin')" in caplog.text
    assert builtin.vocab.source == "builtin" and len(builtin.products) == 1000
    assert len({p.type_name for p in builtin.products}) >= 20
    goal = builtin.goals("test")[0]
    assert purchase_reward(goal, {"asin": goal.asin, "options": goal.options}, builtin).reward == 1.0
