"""local-gaia task generator: GAIA-shaped questions over the fictional wiki shared with the search env.

Every task is built by one template from a seeded RNG. Gold answers are computed from the wiki's
structured facts (never parsed back from text) and written in GAIA's answer format: numbers
without separators or units, names as written, lists as ``a, b``. Each task also carries a
*program* (payload ``program``): the solution steps — look up a fact on a page, read the
attachment, filter / arg-max a table, compute in Python — that the scripted oracle executes
through the real tools. The oracle never sees the gold answer.

Levels follow GAIA: level 1 is one lookup (maybe plus arithmetic); level 2 chains several hops or
combines a hop with the attachment or a table filter; level 3 chains pages, a file and a
computation, with near-duplicate-name distractors from the wiki in the table.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl.env import Task
from agentrl.envs.gaia.attachments import FORMATS, TableDoc
from agentrl.envs.search.wiki import RELATIONS, Entity, Wiki

REFERENCE_YEAR = 2025
# split -> (level -> number of tasks); test is the reported local-gaia suite (50/70/30 = 150)
DEFAULT_COUNTS: dict[str, dict[int, int]] = {
    "test": {1: 50, 2: 70, 3: 30},
    "dev": {1: 50, 2: 70, 3: 30},
    "train": {1: 400, 2: 560, 3: 240},
}
SPLIT_SEEDS = {"train": 1, "dev": 2, "test": 3}

_PLAIN_FACTS = {
    "city": ("population", "founded_year"),
    "person": ("birth_year", "occupation"),
    "company": ("employees", "industry", "founded_year"),
    "country": ("currency", "independence_year"),
}
_LINK_FACTS = {"city": ("mayor", "country"), "person": ("birth_city",), "company": ("founder", "hq")}


def _number(value: float) -> str:
    """GAIA style: plain digits, no thousands separator, no trailing .0."""
    return str(int(value)) if float(value).is_integer() else str(value)


def _label(relation: str) -> str:
    return RELATIONS[relation][0].lower()


@dataclass
class Draft:
    """One generated task before it gets an id."""

    question: str
    answer: str
    program: list[dict[str, Any]]
    doc: TableDoc | None = None
    fmt: str | None = None


Template = Callable[[Wiki, random.Random], Draft]


def _lookup(name: str, relation: str, out: str, kind: str) -> dict[str, Any]:
    return {"op": "lookup", "name": name, "kind": kind, "label": RELATIONS[relation][0], "out": out}


def _compute(fn: str, args: list[str], out: str) -> dict[str, Any]:
    return {"op": "compute", "fn": fn, "args": args, "out": out}


def _pick(rng: random.Random, entities: list[Entity]) -> Entity:
    return entities[rng.randrange(len(entities))]


def _with_twin(wiki: Wiki, kind: str) -> list[tuple[Entity, Entity]]:
    """Pairs (entity, its near-duplicate-name distractor) of ``kind``."""
    return [(wiki.entity(e.distractor_of), e) for e in wiki.by_kind(kind) if e.distractor_of]


# --------------------------------------------------------------------------- level 1
def t_fact(wiki: Wiki, rng: random.Random) -> Draft:
    kind = rng.choice(["city", "person", "company", "country"])
    entity = _pick(rng, wiki.by_kind(kind))
    relation = rng.choice(_PLAIN_FACTS[kind] + _LINK_FACTS.get(kind, ()))
    value = wiki.value(entity, relation)
    answer = (
        value.name if isinstance(value, Entity) else (_number(value) if isinstance(value, int) else value)
    )
    question = f"According to the encyclopedia, what is the {_label(relation)} of the {kind} {entity.name}?"
    return Draft(
        question, answer, [_lookup(entity.name, relation, "a", kind), {"op": "answer", "value": "{a}"}]
    )


def t_fact_arith(wiki: Wiki, rng: random.Random) -> Draft:
    kind, relation, phrase = rng.choice(
        [
            ("person", "birth_year", "How many years before {y} was the person {n} born?"),
            ("company", "founded_year", "How many years before {y} was the company {n} founded?"),
            ("city", "founded_year", "How many years before {y} was the city {n} founded?"),
            (
                "country",
                "independence_year",
                "How many years before {y} did the country {n} become independent?",
            ),
        ]
    )
    entity = _pick(rng, wiki.by_kind(kind))
    answer = _number(REFERENCE_YEAR - wiki.value(entity, relation))
    program = [
        _lookup(entity.name, relation, "a", kind),
        _compute("sub", [str(REFERENCE_YEAR), "{a}"], "b"),
        {"op": "answer", "value": "{b}"},
    ]
    return Draft(phrase.format(y=REFERENCE_YEAR, n=entity.name), answer, program)


# --------------------------------------------------------------------------- level 2
def t_founder_age(wiki: Wiki, rng: random.Random) -> Draft:
    company = _pick(rng, wiki.by_kind("company"))
    founder = wiki.value(company, "founder")
    answer = _number(company.attrs["founded_year"] - founder.attrs["birth_year"])
    program = [
        _lookup(company.name, "founder", "f", "company"),
        _lookup(company.name, "founded_year", "y", "company"),
        _lookup("{f}", "birth_year", "b", "person"),
        _compute("sub", ["{y}", "{b}"], "r"),
        {"op": "answer", "value": "{r}"},
    ]
    question = (
        f"The company {company.name} was founded by a person. How many years after that founder's birth "
        "year was the company founded?"
    )
    return Draft(question, answer, program)


def t_capital_currency(wiki: Wiki, rng: random.Random) -> Draft:
    city = _pick(rng, wiki.by_kind("city"))
    country = wiki.value(city, "country")
    answer = f"{wiki.value(country, 'capital').name}, {country.attrs['currency']}"
    program = [
        _lookup(city.name, "country", "c", "city"),
        _lookup("{c}", "capital", "k", "country"),
        _lookup("{c}", "currency", "m", "country"),
        {"op": "answer", "value": "{k}, {m}"},
    ]
    question = (
        f"Consider the country in which the city {city.name} lies. Give that country's capital and its "
        "currency, as a comma separated list in that order."
    )
    return Draft(question, answer, program)


def _fmt(rng: random.Random) -> str:
    return FORMATS[rng.randrange(len(FORMATS))]


def t_visitors_mayor(wiki: Wiki, rng: random.Random) -> Draft:
    cities = rng.sample(wiki.by_kind("city"), rng.randint(4, 7))
    visitors = rng.sample(range(1_000, 90_000), len(cities))
    top = cities[max(range(len(cities)), key=visitors.__getitem__)]
    doc = TableDoc(
        "Visitor counts",
        ["City", "Visitors"],
        [[c.name, v] for c, v in zip(cities, visitors, strict=True)],
        ["Visitors counted at the city gates last season."],
    )
    fmt = _fmt(rng)
    program = [
        {"op": "read_file", "out": "t"},
        {"op": "argmax", "table": "t", "key": "Visitors", "value": "City", "out": "c"},
        _lookup("{c}", "mayor", "m", "city"),
        {"op": "answer", "value": "{m}"},
    ]
    question = "The attached file lists visitor counts per city. Who is the mayor of the city with the most visitors?"
    return Draft(question, wiki.value(top, "mayor").name, program, doc, fmt)


def t_industry_total(wiki: Wiki, rng: random.Random) -> Draft:
    company = _pick(rng, wiki.by_kind("company"))
    industry = company.attrs["industry"]
    others = sorted({c.attrs["industry"] for c in wiki.by_kind("company")} - {industry})
    rows = []
    for i in range(rng.randint(6, 10)):
        row_industry = industry if i < 2 or rng.random() < 0.25 else rng.choice(others)
        rows.append([f"Contract {100 + i}", row_industry, rng.randint(10, 999) * 10])
    rng.shuffle(rows)
    answer = _number(sum(r[2] for r in rows if r[1] == industry))
    doc = TableDoc("Contracts", ["Contract", "Industry", "Amount"], rows, ["Signed contracts by industry."])
    program = [
        _lookup(company.name, "industry", "i", "company"),
        {"op": "read_file", "out": "t"},
        {"op": "filter_sum", "table": "t", "where": "Industry", "equals": "{i}", "sum": "Amount", "out": "s"},
        {"op": "answer", "value": "{s}"},
    ]
    question = (
        f"The attached file lists contracts. What is the total amount of the contracts in the industry of "
        f"the company {company.name}?"
    )
    return Draft(question, answer, program, doc, _fmt(rng))


# --------------------------------------------------------------------------- level 3
def t_investment_gap(wiki: Wiki, rng: random.Random) -> Draft:
    original, twin = rng.choice(_with_twin(wiki, "company"))
    extra = rng.sample(wiki.by_kind("company"), 3)
    names = [original, twin, *[c for c in extra if c.id not in (original.id, twin.id)]]
    amounts = sorted(rng.sample(range(50, 5000), len(names)), reverse=True)
    rows = [[c.name, a * 1000] for c, a in zip(names, amounts, strict=True)]  # original gets the most
    rng.shuffle(rows)
    hq = wiki.value(original, "hq")
    answer = _number(original.attrs["founded_year"] - hq.attrs["founded_year"])
    doc = TableDoc("Investments", ["Company", "Investment"], rows, ["Investments committed this year."])
    program = [
        {"op": "read_file", "out": "t"},
        {"op": "argmax", "table": "t", "key": "Investment", "value": "Company", "out": "c"},
        _lookup("{c}", "hq", "h", "company"),
        _lookup("{c}", "founded_year", "y1", "company"),
        _lookup("{h}", "founded_year", "y2", "city"),
        _compute("sub", ["{y1}", "{y2}"], "r"),
        {"op": "answer", "value": "{r}"},
    ]
    question = (
        "The attached file lists investments in several companies (mind the similar names). Take the company "
        "with the largest investment. How many years after its headquarters city was founded was that company "
        "founded? (A negative number if the company is older.)"
    )
    return Draft(question, answer, program, doc, _fmt(rng))


def t_headcount_check(wiki: Wiki, rng: random.Random) -> Draft:
    original, twin = rng.choice(_with_twin(wiki, "company"))
    extra = [c for c in rng.sample(wiki.by_kind("company"), 4) if c.id not in (original.id, twin.id)][:3]
    companies = [original, twin, *extra]
    rng.shuffle(companies)
    rows, count = [], 0
    for company in companies:
        true = company.attrs["employees"]
        reported = max(1, true + rng.choice([-1, 1]) * rng.randint(1, max(2, true // 5)))
        count += reported > true
        rows.append([company.name, reported])
    doc = TableDoc("Reported headcount", ["Company", "Reported employees"], rows, ["Figures as filed."])
    program = [
        {"op": "read_file", "out": "t"},
        {
            "op": "lookup_each",
            "table": "t",
            "column": "Company",
            "kind": "company",
            "label": "Employees",
            "out": "e",
        },
        {"op": "column", "table": "t", "column": "Reported employees", "out": "r"},
        _compute("count_greater", ["{r}", "{e}"], "n"),
        {"op": "answer", "value": "{n}"},
    ]
    question = (
        "The attached file gives the headcount that several companies reported (some names are similar, "
        "check each exact name). For how many of these companies is the reported headcount greater than "
        "the number of employees given on the company's encyclopedia page?"
    )
    return Draft(question, _number(count), program, doc, _fmt(rng))


def t_population_ratio(wiki: Wiki, rng: random.Random) -> Draft:
    original, _twin = rng.choice(_with_twin(wiki, "company"))
    city = wiki.value(wiki.value(original, "founder"), "birth_city")
    ratio = round(city.attrs["population"] / original.attrs["employees"], 2)
    program = [
        _lookup(original.name, "founder", "f", "company"),
        _lookup(original.name, "employees", "e", "company"),
        _lookup("{f}", "birth_city", "b", "person"),
        _lookup("{b}", "population", "p", "city"),
        _compute("ratio2", ["{p}", "{e}"], "r"),
        {"op": "answer", "value": "{r}"},
    ]
    question = (
        f"Find the birth city of the founder of the company {original.name} (beware of companies with similar "
        "names). Divide that city's population by the company's number of employees. Give the result rounded "
        "to two decimal places."
    )
    return Draft(question, _number(ratio), program)


TEMPLATES: dict[int, list[tuple[str, Template, int]]] = {
    # level -> (template name, function, weight)
    1: [("fact", t_fact, 3), ("fact_arith", t_fact_arith, 2)],
    2: [
        ("founder_age", t_founder_age, 1),
        ("capital_currency", t_capital_currency, 1),
        ("visitors_mayor", t_visitors_mayor, 1),
        ("industry_total", t_industry_total, 1),
    ],
    3: [
        ("investment_gap", t_investment_gap, 1),
        ("headcount_check", t_headcount_check, 1),
        ("population_ratio", t_population_ratio, 1),
    ],
}


def generate_tasks(
    wiki: Wiki,
    split: str,
    counts: dict[int, int],
    seed: int,
    exclude: set[str] | frozenset[str] = frozenset(),
) -> list[Task]:
    """Generate ``counts[level]`` tasks per level for ``split``; the same arguments give the same tasks.

    Templates of a level take turns in proportion to their weight, so every template is represented.
    Questions in ``exclude`` (e.g. the test split's) are skipped, keeping training tasks disjoint.
    """
    rng = random.Random(f"local-gaia/{split}/{seed}")
    tasks: list[Task] = []
    seen: set[str] = set(exclude)
    for level, count in sorted(counts.items()):
        cycle = [(name, fn) for name, fn, weight in TEMPLATES[level] for _ in range(weight)]
        made, attempts = 0, 0
        while made < count:
            name, fn = cycle[attempts % len(cycle)]
            attempts += 1
            draft = fn(wiki, rng)
            if draft.question in seen and draft.doc is None:
                continue  # the same lookup twice adds nothing
            seen.add(draft.question)
            task_id = f"lg-{split}-L{level}-{made:04d}"
            file_name = f"{task_id}.{draft.fmt}" if draft.doc is not None else ""
            payload = {
                "template": name,
                "program": draft.program,
                "file_name": file_name,
                "file_format": draft.fmt or "",
                "document": draft.doc.to_dict() if draft.doc is not None else None,
            }
            tasks.append(Task(task_id, draft.question, draft.answer, split, level, payload))
            made += 1
    return tasks
