"""Seeded catalogue and goal generator for the shop.

Products are drawn per product type (see :mod:`vocab`): a brand, a title that names one or two of
the product's attributes and a noun of its category, a price in the family's range, options (a
subset of the family's option values), bullet points (one per attribute plus generic ones), a
description and reviews. About half of the products get near-duplicate siblings: the same brand
and wording but one attribute swapped, fewer option values, a higher price, or another category's
noun, so a careless buyer loses reward.

Goals pick a target product, 1-3 of its attributes, one value of most of its options and a price
cap above its price, and phrase them like WebShop's human instructions. Targets of the test and dev
splits are disjoint from each other and from train's.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from agentrl.envs.web.vocab import FAMILY_OPTIONS, FAMILY_PRICES, ProductType, Vocabulary, load_vocabulary

SPLIT_SIZES = {"train": 2000, "dev": 200, "test": 500}

_SYLLABLES = ("lu", "mo", "ra", "vex", "by", "ka", "zen", "tor", "ly", "na", "qui", "bel", "dor", "fi",
              "sa", "mi", "ro", "ven", "tal", "co", "ri", "pax", "el", "ju", "no", "vi", "gar", "so")  # fmt: skip
_ADJECTIVES = ("Classic", "Premium", "Everyday", "Lightweight", "Deluxe", "Modern", "Essential",
               "Original", "Signature", "Ultra", "Comfort", "Pro")  # fmt: skip
_EXTRAS = ("2 Pack", "Upgraded Version", "New Edition", "Value Set", "2024 Model", "Gift Set")
_FEATURE_TEMPLATES = (
    "designed for everyday use, this {noun} keeps its promise wash after wash",
    "a detail customers mention again and again in their reviews",
    "tested by our team so your {noun} performs as described",
    "made to last, with careful quality control on every {noun}",
    "one of the reasons this {noun} is a best seller in its category",
)
_GENERIC_FEATURES = (
    "Satisfaction guarantee: contact us within 30 days for a refund or replacement",
    "Package includes: 1 x {noun} as described",
    "Carefully packed and shipped from our own warehouse",
)
_REVIEWS = (
    (5, "Exactly what I was looking for. Great value for the price."),
    (4, "Good quality, arrived quickly. Would buy again."),
    (3, "It is okay. Does the job but nothing special."),
    (5, "Love it! Already recommended it to friends."),
    (2, "Not as described, the quality could be better."),
    (4, "Nice {noun}, fits my needs well."),
)


@dataclass
class Product:
    """One product page's data; ``attributes`` are hidden from the page except through the text."""

    asin: str
    title: str
    price: float
    type_name: str  # the product type; WebShop's ``query`` (the search term it was listed under)
    family: str
    path: tuple[str, ...]
    brand: str
    noun: str
    attributes: list[str]
    options: dict[str, list[str]]
    features: list[str]
    description: str
    reviews: list[dict[str, Any]]
    rating: float
    variant_of: str | None = None

    def search_text(self) -> str:
        options = [value for values in self.options.values() for value in values]
        return " ".join([self.title, self.type_name, *self.features, *options])


@dataclass
class Goal:
    """What the shopper wants; the reward compares the purchase with it."""

    id: str
    split: str
    asin: str  # the product the goal was made from (one product with reward 1)
    instruction: str
    attributes: list[str]
    options: dict[str, str]
    price_upper: float
    query: str  # the target's product type
    path: tuple[str, ...]
    name: str  # the target's title (WebShop's goal["name"], used by the type factor)
    noun: str  # the noun phrase the instruction uses
    family: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["path"] = list(self.path)
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Goal:
        known = {k: record[k] for k in cls.__dataclass_fields__ if k in record}
        known["path"] = tuple(known.get("path", ()))
        return cls(**known)


def _cap(text: str) -> str:
    return " ".join(w[:1].upper() + w[1:] for w in text.split())


def _gender(ptype: ProductType) -> str:
    return {"men": "Men's ", "women": "Women's ", "boys": "Boys' ", "girls": "Girls' "}.get(ptype.path[1], "")


class Catalog:
    """The products, their lookup by ASIN, and the goals of each split (all from one seed)."""

    def __init__(self, *, seed: int = 0, n_products: int = 1500, data_dir: Path | str | None = "auto"):
        if n_products < 50:
            raise ValueError(f"n_products must be >= 50, got {n_products}")
        self.seed = seed
        self.vocab: Vocabulary = load_vocabulary(data_dir)
        self.types = {t.name: t for t in self.vocab.types}
        rng = random.Random(f"catalog-{seed}")
        self._brands = self._make_brands(rng, 160)
        self._asins: set[str] = set()
        self.products: list[Product] = []
        type_list = list(self.vocab.types)
        while len(self.products) < n_products:
            rng.shuffle(type_list)
            for ptype in type_list:
                if len(self.products) >= n_products:
                    break
                base = self._make_product(rng, ptype)
                self.products.append(base)
                for _ in range(rng.choice((0, 0, 1, 1, 2))):
                    if len(self.products) < n_products:
                        self.products.append(self._make_variant(rng, base))
        self.by_asin = {p.asin: p for p in self.products}
        self._goals: dict[str, list[Goal]] = {}
        digest = hashlib.sha1("\n".join(f"{p.asin}|{p.title}|{p.price}" for p in self.products).encode())
        self.fingerprint = digest.hexdigest()[:16]
        # every noun a title may contain: what stands in for spaCy's NOUN/PROPN tags (see reward.py)
        self.noun_lexicon = (
            frozenset(w for t in self.vocab.types for n in t.nouns for w in _words(n) if len(w) > 1)
            | frozenset(b.lower() for b in self._brands)
            | {"men", "women", "boys", "girls", "pack", "set"}
        )

    # ------------------------------------------------------------------ products
    def _make_brands(self, rng: random.Random, count: int) -> list[str]:
        brands: list[str] = []
        while len(brands) < count:
            name = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((2, 2, 3)))).capitalize()
            if name not in brands:
                brands.append(name)
        return brands

    def _new_asin(self, rng: random.Random) -> str:
        while True:
            asin = "B0" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(8))
            if asin not in self._asins:
                self._asins.add(asin)
                return asin

    def _compose(self, product: Product, adjective: str, title_attrs: list[str], extra: str | None) -> None:
        ptype = self.types[product.type_name]
        title = f"{product.brand} {_gender(ptype)}{adjective} {_cap(title_attrs[0])} {_cap(product.noun)}"
        if len(title_attrs) > 1:
            title += f", {_cap(title_attrs[1])}"
        if extra:
            title += f" - {extra}"
        product.title = title
        rng = random.Random(f"{product.asin}-text")
        product.features = [
            f"{_cap(a)}: {rng.choice(_FEATURE_TEMPLATES).format(noun=product.noun)}"
            for a in product.attributes
        ] + [f.format(noun=product.noun) for f in rng.sample(_GENERIC_FEATURES, 2)]
        product.description = (
            f"The {product.brand} {product.noun} is our {adjective.lower()} take on a favourite. "
            f"Customers choose it because it is {product.attributes[0]}. "
            f"Please check the size and colour charts before ordering."
        )
        picks = rng.sample(_REVIEWS, 3)
        product.reviews = [{"rating": r, "text": t.format(noun=product.noun)} for r, t in picks]
        product.rating = round(sum(r for r, _ in picks) / len(picks), 1)

    def _make_product(self, rng: random.Random, ptype: ProductType) -> Product:
        attributes = rng.sample(list(ptype.attributes), min(len(ptype.attributes), rng.choice((3, 4, 4, 5))))
        low, high = FAMILY_PRICES[ptype.family]
        price = round(math.exp(rng.uniform(math.log(low), math.log(high))), 2)
        options: dict[str, list[str]] = {}
        for name, values in FAMILY_OPTIONS[ptype.family].items():
            if rng.random() < 0.85 or (not options and name == list(FAMILY_OPTIONS[ptype.family])[-1]):
                count = rng.randint(2, min(6, len(values)))
                if name == "size":  # sizes come in a contiguous run
                    start = rng.randint(0, len(values) - count)
                    options[name] = list(values[start : start + count])
                else:
                    options[name] = rng.sample(list(values), count)
        product = Product(
            asin=self._new_asin(rng),
            title="",
            price=price,
            type_name=ptype.name,
            family=ptype.family,
            path=ptype.path,
            brand=rng.choice(self._brands),
            noun=rng.choice(ptype.nouns),
            attributes=attributes,
            options=options,
            features=[],
            description="",
            reviews=[],
            rating=0.0,
        )
        self._compose(
            product, rng.choice(_ADJECTIVES), attributes[:2] if rng.random() < 0.5 else attributes[:1], None
        )
        return product

    def _make_variant(self, rng: random.Random, base: Product) -> Product:
        """A near-duplicate of ``base`` that differs in one way that matters to the reward."""
        ptype = self.types[base.type_name]
        variant = Product(
            **{**base.__dict__, "attributes": list(base.attributes), "options": dict(base.options)}
        )
        variant.asin = self._new_asin(rng)
        variant.variant_of = base.asin
        kind = rng.choice(("attribute", "options", "price", "type"))
        spare = [a for a in ptype.attributes if a not in base.attributes]
        if kind == "attribute" and spare:
            variant.attributes[rng.randrange(len(variant.attributes))] = rng.choice(spare)
        elif kind == "options":
            name = rng.choice(list(base.options))
            values = base.options[name]
            keep = rng.sample(values, max(1, len(values) - rng.randint(1, 3)))
            variant.options[name] = [v for v in values if v in keep]
        elif kind == "type":
            siblings = [t for t in self.vocab.types if t.family == ptype.family and t.name != ptype.name]
            if siblings:
                other = rng.choice(siblings)
                variant.type_name, variant.path, variant.noun = (
                    other.name,
                    other.path,
                    rng.choice(other.nouns),
                )
            else:
                variant.price = round(base.price * rng.uniform(1.5, 2.5), 2)
        else:
            variant.price = round(base.price * rng.uniform(1.5, 2.5), 2)
        title_attrs = [
            a for a in variant.attributes if a.lower() in base.title.lower()
        ] or variant.attributes[:1]
        self._compose(
            variant,
            base.title.split()[1] if not _gender(ptype) else rng.choice(_ADJECTIVES),
            title_attrs[:2],
            rng.choice(_EXTRAS),
        )
        return variant

    # ------------------------------------------------------------------ goals
    def goals(self, split: str) -> list[Goal]:
        """The goals of ``split`` ("train", "dev" or "test"), generated once."""
        if split not in SPLIT_SIZES:
            raise ValueError(f"unknown split {split!r}; choose one of {tuple(SPLIT_SIZES)}")
        if split not in self._goals:
            order = list(range(len(self.products)))
            random.Random(f"targets-{self.seed}").shuffle(order)
            n_test, n_dev = (
                min(SPLIT_SIZES["test"], len(order) // 3),
                min(SPLIT_SIZES["dev"], len(order) // 6),
            )
            pools = {
                "test": order[:n_test],
                "dev": order[n_test : n_test + n_dev],
                "train": order[n_test + n_dev :],
            }
            rng = random.Random(f"goals-{self.seed}-{split}")
            pool = pools[split]
            self._goals[split] = [
                self._make_goal(rng, self.products[pool[i % len(pool)]], f"{split}-{i}", split)
                for i in range(SPLIT_SIZES[split])
            ]
        return self._goals[split]

    def _make_goal(self, rng: random.Random, target: Product, goal_id: str, split: str) -> Goal:
        attributes = rng.sample(target.attributes, min(len(target.attributes), rng.choice((1, 2, 2, 3))))
        names = [n for n in target.options if rng.random() < 0.8] or list(target.options)[:1]
        options = {n: rng.choice(target.options[n]) for n in names}
        step = 10.0 if target.price < 200 else 50.0
        price_upper = math.ceil(target.price * rng.uniform(1.1, 1.6) / step) * step
        ptype = self.types[target.type_name]
        noun = (_gender(ptype).lower() + target.noun).strip()
        instruction = self._phrase(rng, noun, attributes, options, price_upper)
        return Goal(
            id=f"web-{self.seed}-{goal_id}",
            split=split,
            asin=target.asin,
            instruction=instruction,
            attributes=attributes,
            options=options,
            price_upper=price_upper,
            query=target.type_name,
            path=target.path,
            name=target.title,
            noun=noun,
            family=target.family,
        )

    def _phrase(
        self, rng: random.Random, noun: str, attributes: list[str], options: dict[str, str], cap: float
    ) -> str:
        openers, weights = zip(*self.vocab.openers, strict=True)
        opener = rng.choices(openers, weights=weights)[0]
        plural = noun.endswith("s") and not noun.endswith("ss")
        article = "some" if plural else ("an" if noun[0] in "aeiou" else "a")
        joined = (
            attributes[0] if len(attributes) == 1 else ", ".join(attributes[:-1]) + " and " + attributes[-1]
        )
        style = rng.randrange(3)
        if style == 0:
            body = f"{article} {joined} {noun}"
        elif style == 1:
            body = f"{article} {noun} that {'are' if plural else 'is'} {joined}"
        else:
            body = f"{article} {noun} with {joined}"
        if opener == "i would like":
            body = body if rng.random() < 0.5 else f"to buy {body}"
        phrases = []
        for name, value in options.items():
            if name == "color":
                phrases.append(rng.choice((f"in {value} color", f"in the color {value}", f"{value} colored")))
            elif name == "size":
                phrases.append(rng.choice((f"in size {value}", f"size {value}", f"in {value} size")))
            else:
                phrases.append(rng.choice((f"with {value} {name}", f"in {value} {name}", f"{name} {value}")))
        text = f"{opener} {body}"
        if phrases:
            text += ", " + " and ".join(phrases)
        return f"{text}, and price lower than {cap:.2f} dollars"


def _words(text: str) -> list[str]:
    import re

    return re.findall(r"[a-z0-9]+", text.lower())


@lru_cache(maxsize=4)
def get_catalog(seed: int = 0, n_products: int = 1500, data_dir: str | None = "auto") -> Catalog:
    """A cached :class:`Catalog` (building one takes well under a second)."""
    return Catalog(seed=seed, n_products=n_products, data_dir=data_dir)
