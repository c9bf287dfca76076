"""Single- and multi-hop questions over a generated :class:`~agentrl.envs.search.wiki.Wiki`.

A question is a chain of relations from a named start entity: ``founder -> birth_city ->
population`` gives "What is the population of the birthplace of the founder of Stapruv Mills?".
Gold answers (with aliases: "1,204,331" / "1204331") come from the structured facts. Each hop
needs one page, so ``hops`` = pages an agent must read.

Splits are disjoint by question text: a stable hash of the text puts 80% in train, 10% in dev and
10% in test, whatever the number of questions asked for.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.envs.search.wiki import KIND_RELATIONS, MONTHS, RELATIONS, Entity, Wiki, generate_wiki

# noun phrase of a link relation applied to an inner phrase X
NOUN_PHRASES: dict[str, str] = {
    "founder": "the founder of {x}",
    "birth_city": "the birthplace of {x}",
    "hq": "the headquarters city of {x}",
    "country": "the country of {x}",
    "mayor": "the mayor of {x}",
    "capital": "the capital of {x}",
}
# the question asked about the last relation
QUESTIONS: dict[str, str] = {
    "capital": "What is the capital of {x}?",
    "independence_year": "In what year did {x} become independent?",
    "currency": "What is the currency of {x}?",
    "country": "In which country is {x}?",
    "population": "What is the population of {x}?",
    "founded_year": "In what year was {x} founded?",
    "mayor": "Who is the mayor of {x}?",
    "birth_date": "On what date was {x} born?",
    "birth_year": "In what year was {x} born?",
    "birth_city": "In which city was {x} born?",
    "occupation": "What is the occupation of {x}?",
    "founder": "Who founded {x}?",
    "hq": "In which city is {x} headquartered?",
    "employees": "How many people does {x} employ?",
    "industry": "In which industry does {x} operate?",
}
# start kinds, weighted towards the kinds with most entities and links
_START_KINDS = ("person", "person", "company", "company", "city", "country")
HOP_MIXES: dict[str, tuple[float, float, float]] = {
    "mix": (0.5, 0.3, 0.2),
    "single": (1.0, 0.0, 0.0),
    "multi": (0.0, 0.6, 0.4),
}


@dataclass(frozen=True)
class Question:
    """A generated question with its reasoning chain and gold answers."""

    id: str
    text: str
    answers: tuple[str, ...]  # first = canonical form, then aliases
    hops: int
    start_id: str
    relations: tuple[str, ...]
    path: tuple[str, ...]  # entity ids visited, one per hop
    split: str

    def payload(self, wiki: Wiki) -> dict[str, Any]:
        return {
            "hops": self.hops,
            "start": wiki.entity(self.start_id).name,
            "start_id": self.start_id,
            "relations": list(self.relations),
            "path": list(self.path),
            "doc_ids": [wiki.page_of(entity_id).doc_id for entity_id in self.path],
            "wiki_seed": wiki.seed,
        }


def answer_aliases(wiki: Wiki, entity: Entity, relation: str) -> tuple[str, ...]:
    """Gold answer forms for ``relation`` of ``entity``: the infobox form first."""
    shown = wiki.display(entity, relation)
    value = wiki.value(entity, relation)
    if relation in ("population", "employees"):
        return (shown, str(value)) if shown != str(value) else (shown,)
    if relation == "birth_date":
        day, month, year = shown.split()
        return (shown, f"{month} {day}, {year}", f"{year}-{MONTHS.index(month) + 1:02d}-{int(day):02d}")
    return (shown,)


def split_of(text: str) -> str:
    """The split a question belongs to, from a stable hash of its text."""
    bucket = int(hashlib.md5(text.encode()).hexdigest()[:8], 16) % 10
    return "test" if bucket == 0 else "dev" if bucket == 1 else "train"


def _chain(wiki: Wiki, rng: random.Random, hops: int) -> tuple[Entity, list[str], list[str]] | None:
    start = rng.choice(wiki.by_kind(rng.choice(_START_KINDS)))
    entity, relations, path = start, [], [start.id]
    for hop in range(hops):
        last = hop == hops - 1
        options = [
            r
            for r in KIND_RELATIONS[entity.kind]
            if r in QUESTIONS and (RELATIONS[r][1] is not None or last) and (last or r in NOUN_PHRASES)
        ]
        # a link must not lead back to an entity already on the path ("capital of the country of X" = X)
        options = [r for r in options if RELATIONS[r][1] is None or entity.attrs[r] not in path]
        if not options:
            return None
        relation = rng.choice(options)
        relations.append(relation)
        if not last:
            entity = wiki.entity(entity.attrs[relation])
            path.append(entity.id)
    return start, relations, path


def _phrase(start: Entity, relations: Sequence[str]) -> str:
    phrase = start.name
    for relation in relations[:-1]:
        phrase = NOUN_PHRASES[relation].format(x=phrase)
    text = QUESTIONS[relations[-1]].format(x=phrase)
    return text[0].upper() + text[1:]


@functools.lru_cache(maxsize=16)
def generate_questions(
    seed: int = 0, n_entities: int = 2000, n_questions: int = 3000, hops: str = "mix"
) -> tuple[Question, ...]:
    """Seeded questions over ``generate_wiki(seed, n_entities)``; unique by text.

    Args:
        seed: the wiki seed (questions use their own RNG derived from it).
        n_entities: the wiki size.
        n_questions: how many distinct questions to generate (all splits together).
        hops: "mix" (50% 1-hop, 30% 2-hop, 20% 3-hop), "single" or "multi" (2-3 hops).
    """
    if hops not in HOP_MIXES:
        raise ValueError(f"hops must be one of {sorted(HOP_MIXES)}, got {hops!r}")
    wiki = generate_wiki(seed, n_entities)
    rng = random.Random(f"questions/{seed}/{hops}")
    weights = HOP_MIXES[hops]
    seen: set[str] = set()
    questions: list[Question] = []
    attempts = 0
    while len(questions) < n_questions and attempts < n_questions * 20:
        attempts += 1
        n_hops = rng.choices((1, 2, 3), weights)[0]
        chain = _chain(wiki, rng, n_hops)
        if chain is None:
            continue
        start, relations, path = chain
        text = _phrase(start, relations)
        if text in seen:
            continue
        seen.add(text)
        last = wiki.entity(path[-1])
        digest = hashlib.md5(text.encode()).hexdigest()[:12]
        questions.append(
            Question(
                id=f"search-{seed}-{digest}",
                text=text,
                answers=answer_aliases(wiki, last, relations[-1]),
                hops=n_hops,
                start_id=start.id,
                relations=tuple(relations),
                path=tuple(path),
                split=split_of(text),
            )
        )
    return tuple(questions)
