"""The SQL env's databases: Chinook (converted) and two seeded generated ones (shop, university).

Each database is built once into ``cache_dir()/sql/<name>-<version>.sqlite`` (written to a temporary
file and renamed, so concurrent builders never see half a file) and never written again: the env
copies it into the sandbox and opens that copy read-only.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentrl.envs.sql.chinook import build_chinook
from agentrl.errors import ConfigError
from agentrl.paths import cache_dir

FIRST = "Ava Ben Chloe Dan Elena Farid Grace Hugo Iris Jonas Kira Liam Maya Noah Olga Pavel Quinn Rosa Sami Tara Umar Vera Wen Xavi Yara Zane".split()
LAST = "Adler Brooks Costa Diaz Evans Fischer Garcia Haddad Ito Jensen Kowalski Lopez Moreau Nakamura Okafor Petrov Quispe Rossi Silva Tanaka Ueda Varga Weber Xu Young Zhou".split()
CITIES = ["Lisbon", "Osaka", "Denver", "Lyon", "Porto", "Austin", "Kyoto", "Munich", "Quito", "Leeds"]
COUNTRY = {
    "Lisbon": "Portugal",
    "Porto": "Portugal",
    "Osaka": "Japan",
    "Kyoto": "Japan",
    "Denver": "USA",
    "Austin": "USA",
    "Lyon": "France",
    "Munich": "Germany",
    "Quito": "Ecuador",
    "Leeds": "UK",
}
CATEGORIES = {
    "Books": ["Atlas", "Cookbook", "Novel", "Poetry Volume", "Field Guide", "Comic Album"],
    "Kitchen": ["Kettle", "Skillet", "Chef Knife", "Teapot", "Spice Rack", "Cutting Board"],
    "Garden": ["Rake", "Hose", "Planter", "Seed Kit", "Pruner", "Watering Can"],
    "Electronics": ["Headphones", "Charger", "Speaker", "Webcam", "Keyboard", "Mouse"],
    "Toys": ["Puzzle", "Kite", "Robot Kit", "Board Game", "Yo-yo", "Marble Run"],
}
ADJECTIVES = ["Classic", "Deluxe", "Compact", "Eco", "Pro"]
STATUSES = ["shipped", "delivered", "cancelled", "pending"]
DEPARTMENTS = {
    "Mathematics": ("MATH", "Hall A"),
    "Physics": ("PHYS", "Hall B"),
    "History": ("HIST", "Hall C"),
    "Biology": ("BIOL", "Hall B"),
    "Computer Science": ("CS", "Hall D"),
    "Economics": ("ECON", "Hall C"),
}
COURSE_TOPICS = ["Foundations", "Methods", "Seminar", "Advanced Topics", "Lab", "Theory", "Practicum"]
GRADES = ["A", "B", "C", "D", "F"]
GRADE_POINTS = {"A": 4.0, "B": 3.0, "C": 2.0, "D": 1.0, "F": 0.0}


def _name(rng: random.Random) -> tuple[str, str]:
    return rng.choice(FIRST), rng.choice(LAST)


def build_shop(path: Path, seed: int = 1234) -> None:
    """A web shop: customers, categories, products, orders, order_items (seeded, deterministic)."""
    rng = random.Random(seed)
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE customers (customer_id INTEGER PRIMARY KEY, first_name TEXT NOT NULL,
            last_name TEXT NOT NULL, email TEXT NOT NULL, city TEXT NOT NULL, country TEXT NOT NULL,
            signup_date TEXT NOT NULL);
        CREATE TABLE categories (category_id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
        CREATE TABLE products (product_id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
            category_id INTEGER NOT NULL REFERENCES categories(category_id),
            price REAL NOT NULL, stock INTEGER NOT NULL);
        CREATE TABLE orders (order_id INTEGER PRIMARY KEY,
            customer_id INTEGER NOT NULL REFERENCES customers(customer_id),
            order_date TEXT NOT NULL, status TEXT NOT NULL);
        CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(order_id),
            product_id INTEGER NOT NULL REFERENCES products(product_id),
            quantity INTEGER NOT NULL, unit_price REAL NOT NULL, PRIMARY KEY (order_id, product_id));
        """
    )
    customers = []
    used = set()
    while len(customers) < 80:
        first, last = _name(rng)
        if (first, last) in used:
            continue
        used.add((first, last))
        city = rng.choice(CITIES)
        day = dt.date(2021, 1, 1) + dt.timedelta(days=rng.randrange(700))
        email = f"{first.lower()}.{last.lower()}@example.com"
        customers.append((len(customers) + 1, first, last, email, city, COUNTRY[city], day.isoformat()))
    con.executemany("INSERT INTO customers VALUES (?,?,?,?,?,?,?)", customers)
    con.executemany("INSERT INTO categories VALUES (?,?)", list(enumerate(CATEGORIES, start=1)))
    products = []
    for cat_id, (_, items) in enumerate(CATEGORIES.items(), start=1):
        for item in items:
            adjective = rng.choice(ADJECTIVES)
            price = round(rng.uniform(3, 250), 2)
            products.append((len(products) + 1, f"{adjective} {item}", cat_id, price, rng.randrange(0, 120)))
    con.executemany("INSERT INTO products VALUES (?,?,?,?,?)", products)
    orders, items = [], []
    for order_id in range(1, 401):
        # a few customers never order: questions about them have answers
        customer = rng.randrange(1, 73)
        day = dt.date(2023, 1, 1) + dt.timedelta(days=rng.randrange(730))
        orders.append((order_id, customer, day.isoformat(), rng.choices(STATUSES, [5, 8, 1, 1])[0]))
        for product in rng.sample(products, rng.randint(1, 4)):
            items.append((order_id, product[0], rng.randint(1, 5), product[3]))
    con.executemany("INSERT INTO orders VALUES (?,?,?,?)", orders)
    con.executemany("INSERT INTO order_items VALUES (?,?,?,?)", items)
    con.commit()
    con.close()


def build_university(path: Path, seed: int = 4321) -> None:
    """A university: departments, instructors, courses, students, enrollments (seeded, deterministic)."""
    rng = random.Random(seed)
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE departments (dept_id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
            code TEXT NOT NULL UNIQUE, building TEXT NOT NULL, budget INTEGER NOT NULL);
        CREATE TABLE instructors (instructor_id INTEGER PRIMARY KEY, first_name TEXT NOT NULL,
            last_name TEXT NOT NULL, dept_id INTEGER NOT NULL REFERENCES departments(dept_id),
            salary INTEGER NOT NULL, hire_year INTEGER NOT NULL);
        CREATE TABLE courses (course_id INTEGER PRIMARY KEY, code TEXT NOT NULL UNIQUE,
            title TEXT NOT NULL, dept_id INTEGER NOT NULL REFERENCES departments(dept_id),
            credits INTEGER NOT NULL, instructor_id INTEGER REFERENCES instructors(instructor_id));
        CREATE TABLE students (student_id INTEGER PRIMARY KEY, first_name TEXT NOT NULL,
            last_name TEXT NOT NULL, major_dept_id INTEGER REFERENCES departments(dept_id),
            enrollment_year INTEGER NOT NULL, city TEXT NOT NULL);
        CREATE TABLE enrollments (student_id INTEGER NOT NULL REFERENCES students(student_id),
            course_id INTEGER NOT NULL REFERENCES courses(course_id), term TEXT NOT NULL,
            grade TEXT, PRIMARY KEY (student_id, course_id));
        """
    )
    departments = [
        (i, name, code, building, rng.randrange(200, 2000) * 1000)
        for i, (name, (code, building)) in enumerate(DEPARTMENTS.items(), start=1)
    ]
    con.executemany("INSERT INTO departments VALUES (?,?,?,?,?)", departments)
    instructors = []
    for i in range(1, 31):
        first, last = _name(rng)
        dept = departments[(i - 1) % len(departments)][0]
        instructors.append((i, first, last, dept, rng.randrange(60, 160) * 1000, rng.randrange(1995, 2024)))
    con.executemany("INSERT INTO instructors VALUES (?,?,?,?,?,?)", instructors)
    courses = []
    for dept_id, _, code, _, _ in departments:
        topics = rng.sample(COURSE_TOPICS, 5)
        staff = [ins for ins in instructors if ins[3] == dept_id]
        for n, topic in enumerate(topics, start=1):
            instructor = rng.choice(staff)[0] if rng.random() > 0.1 else None
            dept_name = next(d[1] for d in departments if d[0] == dept_id)
            courses.append(
                (len(courses) + 1, f"{code}{100 * n + rng.randrange(1, 99)}", f"{dept_name} {topic}",
                 dept_id, rng.choice([2, 3, 3, 4, 5]), instructor)
            )  # fmt: skip
    con.executemany("INSERT INTO courses VALUES (?,?,?,?,?,?)", courses)
    students = []
    for i in range(1, 151):
        first, last = _name(rng)
        major = rng.choice(departments)[0] if rng.random() > 0.05 else None
        students.append((i, first, last, major, rng.randrange(2019, 2025), rng.choice(CITIES)))
    con.executemany("INSERT INTO students VALUES (?,?,?,?,?,?)", students)
    enrollments = []
    for student in students:
        for course in rng.sample(courses, rng.randint(0, 6)):
            term = f"{rng.choice(['Fall', 'Spring'])} {rng.randrange(2021, 2025)}"
            grade = rng.choices(GRADES, [4, 5, 3, 1, 1])[0] if rng.random() > 0.15 else None
            enrollments.append((student[0], course[0], term, grade))
    con.executemany("INSERT INTO enrollments VALUES (?,?,?,?)", enrollments)
    con.commit()
    con.close()


@dataclass(frozen=True)
class Database:
    """One database the SQL env can use."""

    name: str
    version: str  # bump when the builder changes, so caches rebuild
    builder: Callable[[Path], None]
    description: str


DATABASES: dict[str, Database] = {
    "chinook": Database("chinook", "1", build_chinook, "Chinook: a digital music store (artists, albums, tracks, invoices)"),
    "shop": Database("shop", "1", build_shop, "a web shop (customers, products, orders)"),
    "university": Database("university", "1", build_university, "a university (departments, courses, students, enrollments)"),
}  # fmt: skip


def database_path(name: str) -> Path:
    """Path of the built database ``name`` (built on first use, then cached)."""
    if name not in DATABASES:
        raise ConfigError(
            "database", f"unknown database {name!r}", f"choose one of {sorted(DATABASES)} or 'all'"
        )
    db = DATABASES[name]
    folder = cache_dir() / "sql"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{db.name}-v{db.version}.sqlite"
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        os.close(fd)
        try:
            db.builder(Path(tmp))
            os.chmod(tmp, 0o444)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
    return path


def open_readonly(path: Path) -> sqlite3.Connection:
    """A trusted host-side connection (gold answers, schema); never used for model-written SQL."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con.execute("PRAGMA query_only = 1")
    return con
