"""Attachment writers for local-gaia: one table (plus a few lines of prose) in six file formats.

Every task that has an attachment describes it as a :class:`TableDoc`; :func:`write_attachment`
renders it as CSV, XLSX, JSON, SQLite, PDF or DOCX. Content depends only on the document (the
task generator's seed decides the document), and fixed metadata and zip member dates keep PDF,
XLSX and DOCX bytes stable from run to run.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import re
import sqlite3
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

FORMATS = ("csv", "xlsx", "json", "sqlite", "pdf", "docx")
_FIXED_DATE = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
_CORE_DATES = re.compile(rb"(<dcterms:(?:created|modified)\b[^>]*>)[^<]*(</dcterms:(?:created|modified)>)")

Cell = str | int | float


@dataclass
class TableDoc:
    """A titled table with optional prose lines before it."""

    title: str
    columns: list[str]
    rows: list[list[Cell]]
    notes: list[str] = field(default_factory=list)

    @property
    def table_name(self) -> str:
        """SQL-safe table name derived from the title."""
        return re.sub(r"[^a-z0-9]+", "_", self.title.lower()).strip("_") or "data"

    def to_dict(self) -> dict:
        return {"title": self.title, "columns": self.columns, "rows": self.rows, "notes": self.notes}

    @classmethod
    def from_dict(cls, record: dict) -> TableDoc:
        return cls(
            record["title"], list(record["columns"]), [list(r) for r in record["rows"]], list(record["notes"])
        )


def _fix_zip_times(path: Path) -> None:
    """Rewrite a zip (XLSX, DOCX) with every member dated ``_FIXED_DATE``.

    openpyxl and python-docx stamp each member with the current time (2-second resolution), so two
    writes of one document that straddle a tick differ in bytes. openpyxl also writes the save time
    into ``docProps/core.xml``'s ``dcterms:modified`` whatever the workbook's properties say (its
    newer releases), so the core properties' dates are rewritten too.
    """
    stamp = _FIXED_DATE.timetuple()[:6]
    with zipfile.ZipFile(path) as src:
        members = [(info, src.read(info)) for info in src.infolist()]
    core_date = rb"\g<1>" + _FIXED_DATE.strftime("%Y-%m-%dT%H:%M:%SZ").encode() + rb"\g<2>"
    with zipfile.ZipFile(path, "w") as dst:
        for info, data in members:
            fixed = zipfile.ZipInfo(info.filename, date_time=stamp)
            fixed.compress_type = info.compress_type
            fixed.external_attr = info.external_attr
            if info.filename == "docProps/core.xml":
                data = _CORE_DATES.sub(core_date, data)
            dst.writestr(fixed, data)


def _write_csv(doc: TableDoc, path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(doc.columns)
        writer.writerows(doc.rows)


def _write_xlsx(doc: TableDoc, path: Path) -> None:
    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = doc.title[:31]  # Excel's sheet-name limit
    sheet.append(doc.columns)
    for row in doc.rows:
        sheet.append(row)
    book.properties.created = _FIXED_DATE.replace(tzinfo=None)
    book.properties.modified = _FIXED_DATE.replace(tzinfo=None)
    book.save(path)
    _fix_zip_times(path)


def _write_json(doc: TableDoc, path: Path) -> None:
    records = [dict(zip(doc.columns, row, strict=True)) for row in doc.rows]
    payload = {"title": doc.title, "notes": doc.notes, "records": records}
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False), encoding="utf-8")


def _sql_type(values: Sequence[Cell]) -> str:
    if all(isinstance(v, int) for v in values):
        return "INTEGER"
    if all(isinstance(v, int | float) for v in values):
        return "REAL"
    return "TEXT"


def _write_sqlite(doc: TableDoc, path: Path) -> None:
    columns = [re.sub(r"[^a-z0-9]+", "_", c.lower()).strip("_") for c in doc.columns]
    types = [_sql_type([row[i] for row in doc.rows]) for i in range(len(columns))]
    conn = sqlite3.connect(path)
    try:
        ddl = ", ".join(f"{c} {t}" for c, t in zip(columns, types, strict=True))
        conn.execute(f"CREATE TABLE {doc.table_name} ({ddl})")
        marks = ", ".join("?" for _ in columns)
        conn.executemany(f"INSERT INTO {doc.table_name} VALUES ({marks})", doc.rows)
        conn.commit()
    finally:
        conn.close()


def _latin1(text: str) -> str:
    # the PDF core fonts are latin-1; generated names are ASCII, this guards anything else
    return text.encode("latin-1", "replace").decode("latin-1")


def _write_pdf(doc: TableDoc, path: Path) -> None:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_creation_date(_FIXED_DATE)
    pdf.add_page()
    pdf.set_font("Helvetica", "B", 14)
    pdf.cell(0, 10, _latin1(doc.title), new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("Helvetica", size=10)
    for line in doc.notes:
        pdf.multi_cell(0, 6, _latin1(line), new_x="LMARGIN", new_y="NEXT")
    pdf.ln(2)
    for row in [doc.columns, *doc.rows]:
        pdf.cell(0, 6, _latin1(" | ".join(str(c) for c in row)), new_x="LMARGIN", new_y="NEXT")
    pdf.output(str(path))


def _write_docx(doc: TableDoc, path: Path) -> None:
    import docx

    document = docx.Document()
    document.core_properties.created = _FIXED_DATE.replace(tzinfo=None)
    document.core_properties.modified = _FIXED_DATE.replace(tzinfo=None)
    document.add_heading(doc.title, level=1)
    for line in doc.notes:
        document.add_paragraph(line)
    table = document.add_table(rows=1 + len(doc.rows), cols=len(doc.columns))
    for j, name in enumerate(doc.columns):
        table.cell(0, j).text = name
    for i, row in enumerate(doc.rows, start=1):
        for j, value in enumerate(row):
            table.cell(i, j).text = str(value)
    document.save(str(path))
    _fix_zip_times(path)


_WRITERS = {
    "csv": _write_csv,
    "xlsx": _write_xlsx,
    "json": _write_json,
    "sqlite": _write_sqlite,
    "pdf": _write_pdf,
    "docx": _write_docx,
}


def write_attachment(doc: TableDoc, fmt: str, path: str | Path) -> Path:
    """Write ``doc`` as ``fmt`` to ``path`` atomically (a concurrent reader never sees half a file)."""
    if fmt not in _WRITERS:
        raise ValueError(f"unknown attachment format {fmt!r}; choose one of {FORMATS}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=path.suffix)
    os.close(fd)
    tmp_path = Path(tmp)
    tmp_path.unlink()  # sqlite and the zip writers want to create the file themselves
    try:
        _WRITERS[fmt](doc, tmp_path)
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)
    return path
