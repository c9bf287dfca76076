"""A seeded fictional-entity encyclopedia: the corpus behind the search (and GAIA-style) tasks.

Everything is invented from syllables by a seeded RNG, so a model's parametric memory cannot
know any fact in it; the facts are stored structurally (:class:`Entity.attrs`) and rendered into
pages, so gold answers are computed from the structure, never parsed back from text.

    wiki = generate_wiki(seed=0, n_entities=2000)
    person = wiki.by_kind("person")[0]
    page = wiki.page_of(person)            # Page(doc_id, title, text, entity_id)
    city = wiki.entity(person.attrs["birth_city"])

Kinds and attributes (``Entity.attrs``; values are ints/strings, links are entity ids):

- ``country``: ``capital`` (city), ``independence_year``, ``currency``, ``region``
- ``city``: ``country`` (country), ``population``, ``founded_year``, ``mayor`` (person)
- ``person``: ``birth_date`` ("14 March 1902"), ``birth_year``, ``birth_city`` (city), ``occupation``
- ``company``: ``founder`` (person), ``hq`` (city), ``founded_year``, ``employees``, ``industry``

About 15% of cities, people and companies have a *distractor*: another entity of the same kind
with a near-duplicate name ("Alvar Quenton" / "Alvar Quentin") and its own independent facts.
Every page carries an infobox (``Label: value`` lines, labels in :data:`RELATIONS`) after its prose.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MONTHS = ("January February March April May June July August September October November December").split()

# relation -> (infobox label, kind of the linked entity or None for a plain value)
RELATIONS: dict[str, tuple[str, str | None]] = {
    "capital": ("Capital", "city"),
    "independence_year": ("Independence", None),
    "currency": ("Currency", None),
    "region": ("Region", None),
    "country": ("Country", "country"),
    "population": ("Population", None),
    "founded_year": ("Founded", None),
    "mayor": ("Mayor", "person"),
    "birth_date": ("Born", None),
    "birth_year": ("Birth year", None),
    "birth_city": ("Birthplace", "city"),
    "occupation": ("Occupation", None),
    "founder": ("Founder", "person"),
    "hq": ("Headquarters", "city"),
    "employees": ("Employees", None),
    "industry": ("Industry", None),
}

KIND_RELATIONS: dict[str, tuple[str, ...]] = {
    "country": ("capital", "independence_year", "currency", "region"),
    "city": ("country", "population", "founded_year", "mayor"),
    "person": ("birth_date", "birth_year", "birth_city", "occupation"),
    "company": ("founder", "hq", "founded_year", "employees", "industry"),
}

_ONSETS = "b br c ch d dr f g gr h j k kl l m n p pr qu r s st t tr v w z th sh".split()
_VOWELS = "a e i o u ae ei ia io ou y".split()
_CODAS = ["", "", "n", "r", "l", "s", "th", "nd", "rk", "m", "x", "v"]
_OCCUPATIONS = (
    "cartographer glassblower astronomer violinist shipwright botanist engraver archivist "
    "chemist playwright surveyor clockmaker sculptor linguist beekeeper engineer"
).split()
_INDUSTRIES = (
    "shipping textiles mining software aviation brewing pharmaceuticals optics "
    "publishing railways ceramics robotics insurance agriculture"
).split()
_COMPANY_SUFFIXES = "Dynamics Works Holdings Industries Labs Foundry Trading Systems Partners Mills".split()
_CITY_PREFIXES = ("New", "Port", "East", "West", "Upper", "Lower", "Old")
_CITY_SUFFIXES = ("Falls", "Harbor", "Heights", "Crossing", "Springs")
_REGIONS = "northern southern eastern western central coastal highland island".split()


@dataclass(frozen=True)
class Entity:
    """A fictional thing with structured facts. ``attrs`` links other entities by id."""

    id: str  # "person/000042"
    kind: str  # country | city | person | company
    name: str
    attrs: dict[str, Any] = field(default_factory=dict)
    distractor_of: str | None = None  # id of the entity whose name this one nearly duplicates


@dataclass(frozen=True)
class Page:
    """One encyclopedia page = one retrievable passage."""

    doc_id: str  # "d000042"
    title: str
    text: str  # prose, then the infobox as "Label: value" lines
    entity_id: str

    @property
    def contents(self) -> str:
        """Search-R1 corpus format: title on the first line, then the text."""
        return f"{self.title}\n{self.text}"


@dataclass
class Wiki:
    """The generated encyclopedia: entities with facts, and one page per entity."""

    seed: int
    entities: dict[str, Entity]
    pages: list[Page]
    _page_by_entity: dict[str, int] = field(default_factory=dict, repr=False)
    _page_by_doc: dict[str, int] = field(default_factory=dict, repr=False)
    _by_kind: dict[str, list[Entity]] = field(default_factory=dict, repr=False)
    _by_name: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for index, page in enumerate(self.pages):
            self._page_by_entity[page.entity_id] = index
            self._page_by_doc[page.doc_id] = index
        for entity in self.entities.values():
            self._by_kind.setdefault(entity.kind, []).append(entity)
            self._by_name[entity.name] = entity.id

    def __len__(self) -> int:
        return len(self.pages)

    def entity(self, entity_id: str) -> Entity:
        return self.entities[entity_id]

    def by_kind(self, kind: str) -> list[Entity]:
        """Entities of one kind, in generation order."""
        return self._by_kind.get(kind, [])

    def by_name(self, name: str) -> Entity | None:
        entity_id = self._by_name.get(name)
        return self.entities[entity_id] if entity_id else None

    def page_of(self, entity: Entity | str) -> Page:
        """The page describing ``entity`` (an Entity or its id)."""
        entity_id = entity if isinstance(entity, str) else entity.id
        return self.pages[self._page_by_entity[entity_id]]

    def page(self, doc_id: str) -> Page | None:
        index = self._page_by_doc.get(doc_id)
        return None if index is None else self.pages[index]

    def value(self, entity: Entity | str, relation: str) -> Any:
        """The raw fact ``relation`` of ``entity``; links resolve to the linked Entity."""
        entity = self.entities[entity] if isinstance(entity, str) else entity
        raw = entity.attrs[relation]
        return self.entities[raw] if RELATIONS[relation][1] else raw

    def display(self, entity: Entity | str, relation: str) -> str:
        """The fact as the page's infobox writes it (names for links, 1,204 for numbers)."""
        value = self.value(entity, relation)
        if isinstance(value, Entity):
            return value.name
        if isinstance(value, int) and relation in ("population", "employees"):
            return f"{value:,}"
        return str(value)

    def iter_passages(self) -> Iterator[tuple[str, str, str]]:
        """``(doc_id, title, text)`` for every page, for retriever indexing."""
        for page in self.pages:
            yield page.doc_id, page.title, page.text

    def write_jsonl(self, path: str | Path) -> Path:
        """Write the corpus in Search-R1's format (``{"id", "contents": "title\\ntext"}`` a line), so a
        real Search-R1 retrieval server (BM25 or E5) can index and serve this wiki."""
        path = Path(path)
        with path.open("w", encoding="utf-8") as handle:
            for page in self.pages:
                handle.write(json.dumps({"id": page.doc_id, "contents": page.contents}) + "\n")
        return path


# --------------------------------------------------------------------------- names
class _Namer:
    """Unique pronounceable fictional names from syllables."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int) -> str:
        rng = self.rng
        parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
        return ("".join(parts) + rng.choice(_CODAS)).capitalize()

    def unique(self, make: Any) -> str:
        for _ in range(1000):
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name
        raise RuntimeError("name space exhausted; use fewer entities")

    def person(self) -> str:
        return self.unique(lambda: f"{self.word(self.rng.randint(1, 2))} {self.word(self.rng.randint(2, 3))}")

    def city(self) -> str:
        return self.unique(lambda: self.word(self.rng.randint(2, 3)))

    def company(self) -> str:
        return self.unique(lambda: f"{self.word(2)} {self.rng.choice(_COMPANY_SUFFIXES)}")

    def country(self) -> str:
        return self.unique(
            lambda: self.word(self.rng.randint(2, 3)) + self.rng.choice(["ia", "land", "or", "ar"])
        )

    def _misspell(self, word: str) -> str:
        vowels = [i for i, ch in enumerate(word) if ch in "aeiouy" and i > 0]
        if not vowels:
            return word + "e"
        i = self.rng.choice(vowels)
        return word[:i] + self.rng.choice([v for v in "aeiouy" if v != word[i]]) + word[i + 1 :]

    def near_duplicate(self, kind: str, name: str) -> str | None:
        """A name one small edit away from ``name`` (None when every try collides)."""
        rng = self.rng

        def variant() -> str:
            words = name.split()
            style = rng.randrange(3)
            if kind == "person":
                if style == 0:
                    return f"{words[0]} {self._misspell(words[-1])}"
                if style == 1:
                    return f"{self._misspell(words[0])} {words[-1]}"
                return f"{words[0]} {rng.choice('ABDEHJKLMRST')}. {words[-1]}"
            if kind == "city":
                if style == 0:
                    return self._misspell(name)
                if style == 1:
                    return f"{rng.choice(_CITY_PREFIXES)} {name}"
                return f"{name} {rng.choice(_CITY_SUFFIXES)}"
            if style == 0:
                return f"{self._misspell(words[0])} {' '.join(words[1:])}"
            if style == 1:
                other = rng.choice([s for s in _COMPANY_SUFFIXES if s != words[-1]])
                return f"{' '.join(words[:-1])} {other}"
            return f"{name} Group"

        for _ in range(20):
            candidate = variant()
            if candidate not in self.used:
                self.used.add(candidate)
                return candidate
        return None


# --------------------------------------------------------------------------- generation
def _date(rng: random.Random, year: int) -> str:
    return f"{rng.randint(1, 28)} {MONTHS[rng.randrange(12)]} {year}"


def _article(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _counts(n_entities: int) -> dict[str, int]:
    countries = max(3, n_entities // 150)
    rest = n_entities - countries
    cities = max(4, rest * 22 // 100)
    companies = max(2, rest * 26 // 100)
    return {
        "country": countries,
        "city": cities,
        "person": max(2, rest - cities - companies),
        "company": companies,
    }


def _render(wiki_entities: dict[str, Entity], entity: Entity) -> str:
    """Prose plus infobox for one entity. Prose is varied on purpose: retrieval noise."""
    a = entity.attrs
    name = entity.name

    def n(entity_id: str) -> str:
        return wiki_entities[entity_id].name

    if entity.kind == "person":
        prose = (
            f"{name} (born {a['birth_date']} in {n(a['birth_city'])}) is {_article(a['occupation'])} "
            f"from {n(wiki_entities[a['birth_city']].attrs['country'])}."
        )
    elif entity.kind == "city":
        prose = (
            f"{name} is a city in {n(a['country'])} with a population of {a['population']:,}. "
            f"It was founded in {a['founded_year']} and its mayor is {n(a['mayor'])}."
        )
    elif entity.kind == "company":
        prose = (
            f"{name} is {_article(a['industry'])} company founded in {a['founded_year']} by {n(a['founder'])}. "
            f"It is headquartered in {n(a['hq'])} and employs {a['employees']:,} people."
        )
    else:
        prose = (
            f"{name} is {_article(a['region'])} country whose capital is {n(a['capital'])}. "
            f"It became independent in {a['independence_year']}; its currency is the {a['currency']}."
        )
    box = []
    for relation in KIND_RELATIONS[entity.kind]:
        label, linked = RELATIONS[relation]
        value = a[relation]
        if linked:
            value = n(value)
        elif relation in ("population", "employees"):
            value = f"{value:,}"
        box.append(f"{label}: {value}")
    return prose + "\n" + "\n".join(box)


def _build(seed: int, n_entities: int) -> Wiki:
    if n_entities < 20:
        raise ValueError(f"n_entities must be >= 20, got {n_entities}")
    rng = random.Random(seed)
    namer = _Namer(rng)
    counts = _counts(n_entities)
    ids: dict[str, list[str]] = {kind: [] for kind in counts}
    names: dict[str, str] = {}
    twins: dict[str, str] = {}
    for kind, count in counts.items():
        made = 0
        while made < count:
            entity_id = f"{kind}/{len(ids[kind]):06d}"
            names[entity_id] = getattr(namer, kind)()
            ids[kind].append(entity_id)
            made += 1
            if kind != "country" and made < count and rng.random() < 0.15:
                twin = namer.near_duplicate(kind, names[entity_id])
                if twin is not None:
                    twin_id = f"{kind}/{len(ids[kind]):06d}"
                    names[twin_id] = twin
                    twins[twin_id] = entity_id
                    ids[kind].append(twin_id)
                    made += 1

    countries, cities, people = ids["country"], ids["city"], ids["person"]
    currencies = [namer.word(2).lower() for _ in countries]
    attrs: dict[str, dict[str, Any]] = {}
    for i, entity_id in enumerate(countries):
        attrs[entity_id] = {
            "capital": None,  # filled once cities exist
            "independence_year": rng.randint(1600, 1990),
            "currency": currencies[i],
            "region": rng.choice(_REGIONS),
        }
    for i, entity_id in enumerate(cities):
        # the first cities are the capitals, one per country, so every capital lies in its country
        country = countries[i] if i < len(countries) else rng.choice(countries)
        if i < len(countries):
            attrs[country]["capital"] = entity_id
        attrs[entity_id] = {
            "country": country,
            "population": rng.randint(800, 4_000_000),
            "founded_year": rng.randint(900, 1950),
            "mayor": rng.choice(people),
        }
    for entity_id in people:
        year = rng.randint(1850, 2000)
        attrs[entity_id] = {
            "birth_date": _date(rng, year),
            "birth_year": year,
            "birth_city": rng.choice(cities),
            "occupation": rng.choice(_OCCUPATIONS),
        }
    for entity_id in ids["company"]:
        founder = rng.choice(people)
        attrs[entity_id] = {
            "founder": founder,
            "hq": rng.choice(cities),
            "founded_year": min(2024, attrs[founder]["birth_year"] + rng.randint(20, 60)),
            "employees": rng.randint(5, 250_000),
            "industry": rng.choice(_INDUSTRIES),
        }

    entities = {
        entity_id: Entity(
            entity_id, entity_id.split("/")[0], names[entity_id], attrs[entity_id], twins.get(entity_id)
        )
        for kind in counts
        for entity_id in ids[kind]
    }
    # doc ids in a seeded shuffled order, so a doc id says nothing about an entity's kind
    order = list(entities)
    rng.shuffle(order)
    pages = [
        Page(f"d{index:06d}", entities[entity_id].name, _render(entities, entities[entity_id]), entity_id)
        for index, entity_id in enumerate(order)
    ]
    return Wiki(seed=seed, entities=entities, pages=pages)


@functools.lru_cache(maxsize=8)
def generate_wiki(seed: int = 0, n_entities: int = 2000) -> Wiki:
    """Generate (or return the cached) encyclopedia for ``seed``: one page per entity.

    Args:
        seed: RNG seed; the same seed and size give the same wiki, byte for byte.
        n_entities: number of entities = number of pages (>= 20); 100_000 takes a few seconds.

    Returns:
        A :class:`Wiki`. It is cached and shared: do not mutate it.
    """
    return _build(int(seed), int(n_entities))
