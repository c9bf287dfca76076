"""Vocabulary for the shop: product types with their real attribute lists, option values, openers.

From the real WebShop files (shipped in ``data/webshop/``, checked against their ``SHA256SUMS``;
``AGENTRL_DATA`` overrides) the product types are the product categories named in
``items_ins_v2_1000.json``'s instructions ("Find me <attrs> <category> with <attrs>"), each with the
union of the real attribute lists of its products, and instruction openers follow their frequency in
``human_goals.json``. A small built-in vocabulary in the same form is used only when asked for by
name (``data_dir="builtin"``); missing files are an error, never a silent fallback.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from agentrl.errors import EnvError
from agentrl.paths import benchmark_dir, check_file

log = logging.getLogger(__name__)

# Colour words, in the order normalisation tries them (first colour word of an option wins).
COLORS: tuple[str, ...] = (
    "black", "white", "red", "blue", "navy", "green", "olive", "grey", "gray", "silver", "gold",
    "rose", "pink", "purple", "lavender", "violet", "yellow", "orange", "brown", "beige", "khaki",
    "tan", "ivory", "cream", "teal", "turquoise", "aqua", "burgundy", "wine", "coral", "mint",
    "charcoal", "walnut", "espresso", "oak", "cherry", "natural", "champagne", "copper", "bronze",
    "mocha", "camel", "apricot", "denim", "leopard", "multicolor", "clear", "nickel",
)  # fmt: skip

# Option values per family: name -> candidate values (a product offers a subset).
FAMILY_OPTIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "clothing": {
        "color": ("black", "white", "navy blue", "heather grey", "red", "olive green", "khaki",
                  "burgundy", "light blue", "pink", "charcoal", "beige"),
        "size": ("x-small", "small", "medium", "large", "x-large", "xx-large", "3x-large"),
    },
    "shoes": {
        "color": ("black", "white", "brown", "navy", "grey", "tan", "black white", "red", "beige"),
        "size": ("6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "10.5", "11", "12"),
    },
    "beauty": {
        "scent": ("lavender", "unscented", "rose", "vanilla", "coconut", "eucalyptus", "citrus",
                  "tea tree", "peppermint", "sandalwood"),
        "size": ("1 fl oz (pack of 1)", "2 fl oz (pack of 1)", "4 fl oz (pack of 1)",
                 "8 fl oz (pack of 1)", "16 fl oz (pack of 1)", "3.4 fl oz (pack of 2)",
                 "6 count (pack of 3)"),
    },
    "food": {
        "flavor": ("original", "chocolate", "vanilla", "strawberry", "peanut butter", "sea salt",
                   "barbecue", "honey", "cinnamon", "maple", "smoked", "spicy", "lemon",
                   "mixed berry", "caramel", "teriyaki"),
        "size": ("2.5 ounce (pack of 12)", "4 ounce (pack of 2)", "8 ounce (pack of 1)",
                 "12 ounce (pack of 6)", "1 pound (pack of 1)", "24 count", "3 pound (pack of 1)"),
    },
    "electronics": {
        "color": ("black", "white", "silver", "space gray", "blue", "red", "rose gold"),
        "style": ("standard", "pro", "with adapter", "2 pack", "32gb", "64gb", "128gb", "6 ft",
                  "10 ft"),
    },
    "furniture": {
        "color": ("walnut", "oak", "black", "white", "espresso", "grey", "natural", "cherry",
                  "dark brown", "rustic brown"),
        "size": ("small", "medium", "large", "twin", "full", "queen", "king", "24 inch", "30 inch",
                 "36 inch"),
    },
    "home": {
        "color": ("white", "black", "gold", "brushed nickel", "bronze", "ivory", "blue", "grey",
                  "green", "multicolor"),
        "size": ("12x12 inch", "16x16 inch", "18x18 inch", "20x20 inch", "small", "large",
                 "pack of 2"),
    },
}  # fmt: skip

FAMILY_PRICES: dict[str, tuple[float, float]] = {
    "clothing": (9.0, 60.0),
    "shoes": (25.0, 130.0),
    "beauty": (5.0, 45.0),
    "food": (4.0, 35.0),
    "electronics": (12.0, 260.0),
    "furniture": (45.0, 480.0),
    "home": (10.0, 140.0),
}

FAMILY_ROOTS: dict[str, str] = {
    "clothing": "clothing, shoes & jewelry",
    "shoes": "clothing, shoes & jewelry",
    "beauty": "beauty & personal care",
    "food": "grocery & gourmet food",
    "electronics": "electronics",
    "furniture": "home & kitchen",
    "home": "home & kitchen",
}

# Keyword rules that put a real category into a family (first rule that matches wins).
_FAMILY_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("shoes", ("shoe", "sneaker", "boot", "sandal", "slipper", "pump", "loafer", "mule", "clog",
               "oxford", "flats")),
    ("clothing", ("men's", "women's", "boys'", "girls'", "shirt", "pants", "shorts", "dress",
                  "sweater", "hoodie", "jeans", "underwear", "sock", "swimsuit", "lingerie",
                  "jacket", "coat", "leggings", "skirt")),
    ("food", ("snack", "food", "meat", "seafood", "coffee", "tea", "candy", "chocolate", "sauce",
              "spice", "beverage", "cereal", "jerky", "cookie", "bakery", "dessert", "substitute",
              "grocery", "nut", "rice", "pasta", "soup", "chees", "fruit", "meal", "frozen",
              "pantry", "peas")),
    ("electronics", ("cable", "camera", "speaker", "projector", "receiver", "amplifier", "soundbar",
                     "headphone", "phone", "mac", "tablet", "laptop", "computer", "surveillance",
                     "booster", "mount", "flash", "wearable", "scope", "photography", "audio",
                     "video", "usb", "hdmi", "charger", "monitor", "keyboard", "router", "player",
                     "recorder", "vcr", "dvd", "radio", "television", "batter", "headset", "iphone",
                     "lens", "screen protector", "surround", "turntable", "virtual reality",
                     "car accessories")),
    ("furniture", ("table", "chair", "bed", "mattress", "desk", "cabinet", "stand", "stool",
                   "ottoman", "sofa", "dresser", "shel", "rack", "vanities", "island", "bench",
                   "hall tree", "sets", "bookcase", "nightstand")),
    ("home", ("lamp", "light", "sconce", "chandelier", "mirror", "pillow", "blanket", "candle",
              "window", "curtain", "rug", "decor", "clock", "vase", "towel", "toothpick", "plant",
              "wall art", "frame")),
)  # fmt: skip


@dataclass(frozen=True)
class ProductType:
    """A product category: its family (option schema, prices), path and real attributes."""

    name: str  # the category as a shopper names it, e.g. "men's shorts"
    family: str
    path: tuple[str, ...]  # category path, e.g. ("clothing, shoes & jewelry", "men", "men's shorts")
    nouns: tuple[str, ...]  # noun phrases used in titles, e.g. ("shorts",)
    attributes: tuple[str, ...]


@dataclass(frozen=True)
class Vocabulary:
    """Everything the generator draws words from."""

    types: tuple[ProductType, ...]
    openers: tuple[tuple[str, int], ...]  # (instruction opener, weight)
    source: str  # "webshop" or "builtin"


def family_of(category: str) -> str:
    text = category.lower()
    for family, keys in _FAMILY_RULES:
        if any(re.search(rf"\b{re.escape(k)}", text) for k in keys):
            return family
    return "beauty"


def _nouns_of(category: str) -> tuple[str, ...]:
    """Noun phrases of a category name: "men's t-shirts & tanks" -> ("t-shirts", "tanks")."""
    text = re.sub(r"^(men's|women's|boys'|girls'|children's)\s+", "", category.lower())
    parts = [p.strip() for p in re.split(r",|&|\band\b", text)]
    return tuple(p for p in parts if p) or (text,)


def _path_of(category: str, family: str) -> tuple[str, ...]:
    gender = re.match(r"^(men|women|boys|girls|children)'?s?'?\s", category.lower())
    middle = gender.group(1) if gender else family
    return (FAMILY_ROOTS[family], middle, category.lower())


def make_type(category: str, attributes: list[str] | tuple[str, ...]) -> ProductType:
    family = family_of(category)
    return ProductType(
        name=category.lower(),
        family=family,
        path=_path_of(category, family),
        nouns=_nouns_of(category),
        attributes=tuple(sorted(set(attributes))),
    )


# Built-in fallback: a handful of categories per family with attribute lists in WebShop's style.
BUILTIN_TYPES: dict[str, tuple[str, ...]] = {
    "men's shorts": ("elastic waist", "drawstring closure", "machine wash", "cargo shorts", "classic fit", "daily wear"),
    "men's t-shirts": ("short sleeve", "classic fit", "cotton heather", "machine wash", "needle sleeve", "long sleeve"),
    "women's dresses": ("long sleeve", "hand wash", "polyester spandex", "daily wear", "machine wash", "high waist"),
    "women's pants": ("high waist", "elastic waist", "daily wear", "hand wash", "fleece lined", "cargo pants"),
    "men's sweaters": ("crewneck sweatshirt", "machine wash", "tumble dry", "classic fit", "long sleeve"),
    "women's sandals": ("open toe", "arch support", "rubber sole", "ankle strap", "non slip", "high heel"),
    "men's sneakers": ("rubber sole", "lace closure", "memory foam", "non slip", "arch support"),
    "women's slippers": ("faux fur", "non slip", "rubber sole", "anti slip", "memory foam"),
    "shampoo & conditioner": ("paraben free", "sulfate free", "coconut oil", "hair growth", "dry hair", "natural ingredients"),
    "makeup palettes": ("cruelty free", "long lasting", "highly pigmented", "easy apply", "eye shadow"),
    "body care": ("dry skin", "sensitive skin", "paraben free", "cruelty free", "dermatologist tested"),
    "toothpaste": ("fresh breath", "teeth whitening", "sensitive teeth", "natural ingredients", "fluoride free"),
    "hair extensions": ("natural hair", "synthetic hair", "high quality", "easy use", "double sided"),
    "meat substitutes": ("gluten free", "plant based", "high protein", "non gmo", "keto friendly"),
    "puffed snacks": ("gluten free", "low calorie", "non gmo", "resealable bag", "low carb"),
    "herbal tea": ("caffeine free", "certified organic", "non gmo", "gluten free", "natural ingredients"),
    "bluetooth speakers": ("stereo sound", "hands free", "easy carry", "rechargeable battery", "high power"),
    "hdmi cables": ("high speed", "gold plated", "heavy duty", "plug play", "blu ray"),
    "screen protectors": ("tempered glass", "easy install", "glass screen", "camera lens", "case friendly"),
    "digital cameras": ("optical zoom", "1080p hd", "touch screen", "high speed", "lcd screen"),
    "coffee tables": ("living room", "solid wood", "metal frame", "mid century", "easy assemble"),
    "home office chairs": ("height adjustable", "lumbar support", "easy assemble", "high density", "home office"),
    "bed frames": ("box spring", "solid wood", "heavy duty", "easy assemble", "storage space"),
    "tv stands": ("storage space", "living room", "easy clean", "wall mounted", "tv cabinet"),
    "table lamps": ("living room", "bedside table", "led bulb", "mid century", "home office"),
    "decorative pillows": ("throw pillow", "double sided", "machine washable", "super soft", "living room"),
    "candles": ("soy wax", "long lasting", "lead free", "scented candle", "living room"),
    "wall mirrors": ("wall mounted", "wood frame", "living room", "home decor", "space saving"),
}  # fmt: skip

BUILTIN_OPENERS: tuple[tuple[str, int], ...] = (
    ("i am looking for", 33),
    ("im looking for", 18),
    ("i would like", 15),
    ("i need", 14),
    ("i want", 12),
    ("find me", 2),
    ("can you find", 1),
)

_OPENER_RE = re.compile(
    r"^(i am looking for|im looking for|i'm looking for|i would like|i need|i want|find me|"
    r"get me|can you find|help me find|i am searching for|looking for|buy me)\b"
)


def _parse_items(path: Path) -> dict[str, list[str]]:
    """category -> attributes, from the items file's "Find me <attrs> <category> with <attrs>"."""
    items = json.loads(path.read_text())
    by_category: dict[str, list[str]] = defaultdict(list)
    for record in items.values():
        instruction = record.get("instruction")
        if not instruction or not instruction.startswith("Find me "):
            continue
        head = re.split(r" (?:with|for) ", instruction[len("Find me ") :])[0]
        for attribute in record.get("instruction_attributes", []):
            if head.startswith(attribute):
                head = head[len(attribute) :].lstrip(", ").lstrip()
        category = head.strip().lower()
        if 3 <= len(category) <= 60:
            by_category[category].extend(a.lower() for a in record.get("attributes", []))
    return {c: attrs for c, attrs in by_category.items() if len(set(attrs)) >= 3}


def _parse_openers(path: Path) -> tuple[tuple[str, int], ...]:
    counts: Counter[str] = Counter()
    for goal in json.loads(path.read_text()):
        found = _OPENER_RE.match(goal.strip().lower().replace("’", "'"))
        if found:
            counts[found.group(1).replace("i'm", "im")] += 1
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def load_vocabulary(data_dir: Path | str | None = "auto") -> Vocabulary:
    """The vocabulary from the real WebShop files, or the built-in one when asked for by name.

    Args:
        data_dir: ``"auto"``: the shipped ``data/webshop/`` (or ``$AGENTRL_DATA/webshop``);
            a folder holding ``webshop/``; ``"builtin"`` (or ``None``): the built-in vocabulary.

    Raises:
        EnvError: the real files are missing or do not match their manifest.
    """
    if data_dir is None or data_dir == "builtin":
        log.warning("web shop: the built-in vocabulary (data_dir='builtin'), not the real WebShop files")
        types = tuple(make_type(c, attrs) for c, attrs in sorted(BUILTIN_TYPES.items()))
        return Vocabulary(types=types, openers=BUILTIN_OPENERS, source="builtin")
    folder = benchmark_dir("webshop") if data_dir == "auto" else Path(data_dir) / "webshop"
    items, goals = folder / "items_ins_v2_1000.json", folder / "human_goals.json"
    for path in (items, goals):
        if not path.is_file():
            raise EnvError(
                f"the WebShop vocabulary needs {path}, which does not exist; use data_dir='auto' "
                "(the files shipped with agentrl), a folder holding webshop/, or data_dir='builtin'"
            )
        check_file(path)
    categories = _parse_items(items)
    types = tuple(make_type(c, attrs) for c, attrs in sorted(categories.items()))
    openers = _parse_openers(goals) or BUILTIN_OPENERS
    return Vocabulary(types=types, openers=openers, source="webshop")
