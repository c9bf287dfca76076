"""Seeded computation-heavy word problems that are easy with code and hard without it.

Four kinds: ``arithmetic`` (huge powers, modular exponentiation, prime counts, divisor sums),
``combinatorics`` (restricted committees, lattice paths around a blocked point, inclusion-exclusion,
derangements, integer partitions), ``dates`` (day offsets, day counts, weekdays, Friday-the-13ths) and
``tables`` (aggregations over a CSV table printed in the question).

Every problem carries its exact gold answer (computed here) and ``solution_code``: an independent,
straightforward program that prints the answer, which the scripted oracle runs in the sandbox.
``generate(n, seed)`` is deterministic in ``seed``.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KINDS = ("arithmetic", "combinatorics", "dates", "tables")
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


@dataclass(frozen=True)
class Problem:
    """One generated problem."""

    kind: str
    template: str
    question: str
    answer: str
    compare: str  # "int" | "number" | "text" | "math" (see scoring.py)
    solution_code: str
    level: int


def _prime_count(lo: int, hi: int) -> int:
    sieve = bytearray([1]) * (hi + 1)
    sieve[0:2] = b"\0\0"
    for p in range(2, math.isqrt(hi) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytearray(len(range(p * p, hi + 1, p)))
    return sum(sieve[lo : hi + 1])


def _sigma(n: int) -> int:
    total, m, p = 1, n, 2
    while p * p <= m:
        if m % p == 0:
            power_sum, term = 1, 1
            while m % p == 0:
                m //= p
                term *= p
                power_sum += term
            total *= power_sum
        p += 1
    return total * (m + 1) if m > 1 else total


def arithmetic(rng: random.Random) -> Problem:
    form = rng.randrange(5)
    if form == 0:
        a, b = rng.randrange(2, 99), rng.randrange(60, 400)
        return Problem(
            "arithmetic",
            "digit_sum_power",
            f"What is the sum of the decimal digits of {a}^{b}?",
            str(sum(map(int, str(a**b)))),
            "int",
            f"print(sum(int(d) for d in str({a}**{b})))",
            1,
        )
    if form == 1:
        a, b, m = rng.randrange(2, 10**6), rng.randrange(10**12, 10**15), rng.randrange(10**6, 10**9)
        return Problem(
            "arithmetic",
            "modpow",
            f"What is the remainder when {a}^{b} is divided by {m}?",
            str(pow(a, b, m)),
            "int",
            f"print(pow({a}, {b}, {m}))",
            2,
        )
    if form == 2:
        lo = rng.randrange(10**5, 10**6)
        hi = lo + rng.randrange(2000, 20000)
        code = (
            f"lo, hi = {lo}, {hi}\n"
            "def is_prime(n):\n    if n < 2: return False\n    d = 2\n"
            "    while d * d <= n:\n        if n % d == 0: return False\n        d += 1\n    return True\n"
            "print(sum(1 for n in range(lo, hi + 1) if is_prime(n)))"
        )
        return Problem(
            "arithmetic",
            "prime_count",
            f"How many prime numbers are there between {lo} and {hi}, inclusive?",
            str(_prime_count(lo, hi)),
            "int",
            code,
            2,
        )
    if form == 3:
        n = rng.randrange(10**8, 10**10)
        code = (
            f"n = {n}\ntotal = 0\nd = 1\nwhile d * d <= n:\n    if n % d == 0:\n"
            "        total += d\n        if d != n // d: total += n // d\n    d += 1\nprint(total)"
        )
        return Problem(
            "arithmetic",
            "divisor_sum",
            f"What is the sum of all positive divisors of {n}?",
            str(_sigma(n)),
            "int",
            code,
            2,
        )
    x, y, z = (rng.randrange(10**14, 10**16) for _ in range(3))
    return Problem(
        "arithmetic",
        "big_product",
        f"Compute {x} * {y} - {z}.",
        str(x * y - z),
        "int",
        f"print({x} * {y} - {z})",
        1,
    )


def combinatorics(rng: random.Random) -> Problem:
    form = rng.randrange(5)
    if form == 0:
        n, k = rng.randrange(20, 60), rng.randrange(4, 12)
        answer = math.comb(n, k) - math.comb(n - 2, k - 2)
        code = (
            f"from itertools import combinations\nfrom math import comb\nn, k = {n}, {k}\n"
            "# committees containing both rivals (people 0 and 1) are forbidden\n"
            "print(comb(n, k) - comb(n - 2, k - 2))"
        )
        question = (
            f"A club has {n} members. In how many ways can a committee of {k} members be chosen if two "
            "particular members refuse to serve together?"
        )
        return Problem("combinatorics", "committee", question, str(answer), "int", code, 2)
    if form == 1:
        a, b = rng.randrange(8, 25), rng.randrange(8, 25)
        c, d = rng.randrange(1, a), rng.randrange(1, b)
        answer = math.comb(a + b, a) - math.comb(c + d, c) * math.comb(a - c + b - d, a - c)
        code = (
            f"a, b, c, d = {a}, {b}, {c}, {d}\nways = [[0] * (b + 1) for _ in range(a + 1)]\n"
            "for x in range(a + 1):\n    for y in range(b + 1):\n        if (x, y) == (c, d): continue\n"
            "        if x == 0 and y == 0: ways[x][y] = 1; continue\n"
            "        ways[x][y] = (ways[x - 1][y] if x else 0) + (ways[x][y - 1] if y else 0)\nprint(ways[a][b])"
        )
        question = (
            f"How many lattice paths go from (0, 0) to ({a}, {b}) using unit steps right (+1, 0) or up "
            f"(0, +1) and never pass through the point ({c}, {d})?"
        )
        return Problem("combinatorics", "lattice_paths", question, str(answer), "int", code, 2)
    if form == 2:
        n = rng.randrange(10**5, 10**6)
        p, q, r = rng.sample([3, 5, 7, 11, 13, 17, 19, 23], 3)
        # |A or B| minus the part of it divisible by r (p, q, r distinct primes)
        answer = n // p + n // q - n // (p * q) - (n // (p * r) + n // (q * r) - n // (p * q * r))
        code = f"n, p, q, r = {n}, {p}, {q}, {r}\nprint(sum(1 for m in range(1, n + 1) if (m % p == 0 or m % q == 0) and m % r))"
        question = f"How many integers from 1 to {n} are divisible by {p} or {q} but not by {r}?"
        return Problem("combinatorics", "inclusion_exclusion", question, str(answer), "int", code, 2)
    if form == 3:
        n = rng.randrange(9, 22)
        exact = sum((-1) ** i * (math.factorial(n) // math.factorial(i)) for i in range(n + 1))
        code = f"n = {n}\nd = [1, 0]\nfor m in range(2, n + 1):\n    d.append((m - 1) * (d[-1] + d[-2]))\nprint(d[n])"
        question = (
            f"{n} guests check their coats. In how many ways can the coats be handed back so that no guest "
            "gets their own coat?"
        )
        return Problem("combinatorics", "derangements", question, str(exact), "int", code, 2)
    n = rng.randrange(40, 120)
    table = [1] + [0] * n
    for part in range(1, n + 1):
        for total in range(part, n + 1):
            table[total] += table[total - part]
    code = (
        f"from functools import lru_cache\nimport sys\nsys.setrecursionlimit(10000)\n@lru_cache(None)\n"
        "def p(n, largest):\n    if n == 0: return 1\n    return sum(p(n - k, k) for k in range(1, min(n, largest) + 1))\n"
        f"print(p({n}, {n}))"
    )
    question = f"In how many ways can {n} be written as a sum of positive integers, if the order of the terms does not matter?"
    return Problem("combinatorics", "partitions", question, str(table[n]), "int", code, 3)


def dates(rng: random.Random) -> Problem:
    form = rng.randrange(4)
    start = dt.date(1900, 1, 1) + dt.timedelta(days=rng.randrange(200 * 365))
    if form == 0:
        days = rng.randrange(1000, 60000)
        answer = (start + dt.timedelta(days=days)).isoformat()
        code = f"import datetime as dt\nprint(dt.date.fromisoformat('{start}') + dt.timedelta(days={days}))"
        return Problem(
            "dates",
            "date_offset",
            f"What date is {days} days after {start:%B %d, %Y}? Answer as YYYY-MM-DD.",
            answer,
            "text",
            code,
            1,
        )
    if form == 1:
        end = start + dt.timedelta(days=rng.randrange(500, 40000))
        code = f"import datetime as dt\nprint((dt.date.fromisoformat('{end}') - dt.date.fromisoformat('{start}')).days)"
        return Problem(
            "dates",
            "day_count",
            f"How many days are there from {start:%B %d, %Y} to {end:%B %d, %Y} "
            "(counting the end date but not the start date)?",
            str((end - start).days),
            "int",
            code,
            1,
        )
    if form == 2:
        code = f"import datetime as dt\nprint(dt.date.fromisoformat('{start}').strftime('%A'))"
        return Problem(
            "dates",
            "weekday",
            f"On what day of the week did {start:%B %d, %Y} fall?",
            WEEKDAYS[start.weekday()],
            "text",
            code,
            1,
        )
    y1 = rng.randrange(1800, 2100)
    y2 = y1 + rng.randrange(5, 60)
    count = sum(1 for y in range(y1, y2 + 1) for m in range(1, 13) if dt.date(y, m, 13).weekday() == 4)
    code = (
        f"import calendar\nprint(sum(1 for y in range({y1}, {y2 + 1}) for m in range(1, 13) "
        "if calendar.weekday(y, m, 13) == calendar.FRIDAY))"
    )
    return Problem(
        "dates",
        "friday13",
        f"How many Friday the 13ths are there from the start of {y1} to the end of {y2}?",
        str(count),
        "int",
        code,
        2,
    )


REGIONS = ["North", "South", "East", "West", "Central"]
PRODUCTS = ["anvil", "bolt", "cable", "drill", "easel", "flute", "gauge"]


def tables(rng: random.Random) -> Problem:
    rows = []
    for order_id in range(1, rng.randrange(30, 60)):
        rows.append(
            (
                order_id,
                rng.choice(REGIONS),
                rng.choice(PRODUCTS),
                rng.randrange(1, 90),
                rng.randrange(150, 9999) / 100,
            )
        )
    csv = "order_id,region,product,units,unit_price\n" + "\n".join(",".join(map(str, r)) for r in rows)
    load = f"import csv, io\nrows = list(csv.DictReader(io.StringIO('''{csv}''')))\n"
    form = rng.randrange(3)
    if form == 0:
        region, product = rng.choice(REGIONS), rng.choice(PRODUCTS)
        cents = sum(round(u * p * 100) for _, r, pr, u, p in rows if r == region and pr == product)
        answer = f"{cents / 100:.2f}"
        code = load + (
            f"print('%.2f' % sum(int(r['units']) * float(r['unit_price']) for r in rows "
            f"if r['region'] == '{region}' and r['product'] == '{product}'))"
        )
        question = (
            f"What is the total revenue (units times unit price) of {product} orders in the {region} region?"
        )
        compare = "number"
    elif form == 1:
        totals: dict[str, int] = {}
        for _, region, _, units, _ in rows:
            totals[region] = totals.get(region, 0) + units
        ranked = sorted(totals.values(), reverse=True)
        if len(ranked) > 1 and ranked[0] == ranked[1]:
            return tables(rng)  # a tie would make the answer ambiguous: draw another table
        answer = max(totals, key=totals.get)
        code = load + (
            "totals = {}\nfor r in rows:\n    totals[r['region']] = totals.get(r['region'], 0) + int(r['units'])\n"
            "print(max(totals, key=totals.get))"
        )
        question = "Which region sold the most units in total?"
        compare = "text"
    else:
        product = rng.choice([p for p in PRODUCTS if any(r[2] == p for r in rows)])
        prices = [p for _, _, pr, _, p in rows if pr == product]
        answer = f"{sum(prices) / len(prices):.2f}"
        code = load + (
            f"xs = [float(r['unit_price']) for r in rows if r['product'] == '{product}']\n"
            "print('%.2f' % (sum(xs) / len(xs)))"
        )
        question = f"What is the average unit price of the {product} orders, rounded to 2 decimal places?"
        compare = "number"
    return Problem(
        "tables",
        f"table_{form}",
        f"Here are the orders of a store:\n\n{csv}\n\n{question}",
        answer,
        compare,
        code,
        2,
    )


MAKERS: dict[str, Callable[[random.Random], Problem]] = {
    "arithmetic": arithmetic,
    "combinatorics": combinatorics,
    "dates": dates,
    "tables": tables,
}


def generate(n: int, seed: int, kinds: tuple[str, ...] = KINDS) -> list[Problem]:
    """``n`` problems, cycling through ``kinds``, deterministic in ``seed``."""
    unknown = [k for k in kinds if k not in MAKERS]
    if unknown:
        raise ValueError(f"unknown problem kinds {unknown}; choose from {list(MAKERS)}")
    rng = random.Random(seed)
    return [MAKERS[kinds[i % len(kinds)]](rng) for i in range(n)]


def to_record(problem: Problem) -> dict[str, Any]:
    return {"kind": problem.kind, "template": problem.template, "compare": problem.compare,
            "solution_code": problem.solution_code}  # fmt: skip
