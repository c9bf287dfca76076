"""The fictional wiki and its questions: determinism, structure, gold answers, splits."""

from __future__ import annotations

import re
from collections import Counter

from agentrl.envs.search.questions import generate_questions, split_of
from agentrl.envs.search.wiki import KIND_RELATIONS, RELATIONS, _build, generate_wiki


def test_same_seed_same_wiki_other_seed_other_wiki() -> None:
    first, again, other = _build(7, 300), _build(7, 300), _build(8, 300)
    assert [p.text for p in first.pages] == [p.text for p in again.pages]
    assert first.entities == again.entities
    assert [p.title for p in first.pages] != [p.title for p in other.pages]


def test_structure_links_and_pages() -> None:
    wiki = generate_wiki(0, 2000)
    assert len(wiki) == 2000 == len(wiki.entities)
    kinds = Counter(e.kind for e in wiki.entities.values())
    assert set(kinds) == {"country", "city", "person", "company"}
    assert len({e.name for e in wiki.entities.values()}) == len(wiki.entities)  # names are unique
    assert len({p.doc_id for p in wiki.pages}) == len(wiki.pages)
    for entity in wiki.entities.values():
        assert set(entity.attrs) == set(KIND_RELATIONS[entity.kind])
        page = wiki.page_of(entity)
        assert page.title == entity.name and wiki.page(page.doc_id) is page
        for relation in KIND_RELATIONS[entity.kind]:
            label, linked = RELATIONS[relation]
            if linked:
                assert wiki.entity(entity.attrs[relation]).kind == linked
            # every fact is written in the page's infobox as the scorer's canonical form
            assert f"\n{label}: {wiki.display(entity, relation)}" in page.text
    for country in wiki.by_kind("country"):
        assert wiki.value(wiki.value(country, "capital"), "country") is country
    for company in wiki.by_kind("company"):
        assert company.attrs["founded_year"] > wiki.value(company, "founder").attrs["birth_year"]


def test_distractors_have_near_duplicate_names() -> None:
    wiki = generate_wiki(0, 2000)
    twins = [e for e in wiki.entities.values() if e.distractor_of]
    assert len(twins) > 100
    for twin in twins:
        original = wiki.entity(twin.distractor_of)
        assert original.kind == twin.kind and original.name != twin.name
        shared = set(original.name.split()) & set(twin.name.split())
        # one word in common, or a one-letter change of a single word
        assert shared or sum(a != b for a, b in zip(original.name, twin.name, strict=False)) <= 1


def test_person_page_text_by_hand() -> None:
    wiki = _build(3, 100)
    person = wiki.by_kind("person")[0]
    a = person.attrs
    city = wiki.entity(a["birth_city"])
    text = wiki.page_of(person).text
    assert text.splitlines()[1:] == [
        f"Born: {a['birth_date']}",
        f"Birth year: {a['birth_year']}",
        f"Birthplace: {city.name}",
        f"Occupation: {a['occupation']}",
    ]
    assert re.fullmatch(r"\d{1,2} [A-Z][a-z]+ \d{4}", a["birth_date"])


def test_questions_gold_answers_follow_the_facts() -> None:
    wiki = generate_wiki(0, 2000)
    questions = generate_questions(0, 2000, 3000, "mix")
    assert len(questions) == 3000 == len({q.text for q in questions}) == len({q.id for q in questions})
    hops = Counter(q.hops for q in questions)
    assert set(hops) == {1, 2, 3} and hops[1] > hops[2] > hops[3] > 300
    for q in questions:
        entity = wiki.entity(q.start_id)
        assert entity.name in q.text
        for relation in q.relations[:-1]:
            entity = wiki.value(entity, relation)
        assert q.answers[0] == wiki.display(entity, q.relations[-1])
        assert len(q.path) == q.hops == len(q.relations) and len(set(q.path)) == q.hops


def test_numbers_and_dates_have_aliases() -> None:
    questions = generate_questions(0, 2000, 3000, "mix")
    population = next(q for q in questions if q.relations[-1] == "population")
    first, plain = population.answers
    assert first.replace(",", "") == plain and "," in first
    date = next(q for q in questions if q.relations[-1] == "birth_date")
    day, month, year = date.answers[0].split()
    assert date.answers[1] == f"{month} {day}, {year}"
    assert re.fullmatch(rf"{year}-\d\d-{int(day):02d}", date.answers[2])


def test_splits_are_disjoint_and_stable() -> None:
    questions = generate_questions(0, 2000, 3000, "mix")
    by_split = {s: {q.text for q in questions if q.split == s} for s in ("train", "dev", "test")}
    assert not (by_split["train"] & by_split["dev"] or by_split["train"] & by_split["test"])
    assert not by_split["dev"] & by_split["test"]
    assert 0.07 < len(by_split["test"]) / len(questions) < 0.13
    assert all(split_of(q.text) == q.split for q in questions)
    # a smaller request yields a subset whose questions keep their splits
    fewer = generate_questions(0, 2000, 500, "mix")
    assert {(q.text, q.split) for q in fewer} <= {(q.text, q.split) for q in questions}


def test_multi_hop_preset_has_only_multi_hop() -> None:
    questions = generate_questions(0, 2000, 500, "multi")
    assert {q.hops for q in questions} == {2, 3}


def test_write_jsonl_is_search_r1_corpus_format(tmp_path) -> None:
    import json

    wiki = _build(2, 60)
    path = wiki.write_jsonl(tmp_path / "corpus.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 60 and set(rows[0]) == {"id", "contents"}
    first = wiki.pages[0]
    assert rows[0] == {"id": first.doc_id, "contents": f"{first.title}\n{first.text}"}
