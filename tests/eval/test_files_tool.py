"""File reader tools over generated attachments of every supported format."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from agentrl.envs.gaia.attachments import FORMATS, TableDoc, write_attachment
from agentrl.errors import ToolError
from agentrl.tools.files import PAGE_CHARS, make_file_tools, render_file

DOC = TableDoc(
    "Orchard yields",
    ["Orchard", "Region", "Tons"],
    [["Brevik Hollow", "Tamsa", 41], ["Ostrel Farm", "Quell", 17.5], ["Nim Gardens", "Tamsa", 9]],
    ["Yields of the 1901 harvest."],
)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_round_trips_through_the_reader(tmp_path: Path, fmt: str) -> None:
    path = write_attachment(DOC, fmt, tmp_path / f"yields.{fmt}")
    text = render_file(path)
    for row in DOC.rows:
        assert str(row[0]) in text and str(row[1]) in text
    assert "41" in text and "17.5" in text
    if fmt != "csv":  # csv carries the table only
        assert "Yields of the 1901 harvest." in text or fmt in ("xlsx", "sqlite")


@pytest.mark.parametrize("fmt", FORMATS)
def test_same_document_same_bytes(tmp_path: Path, fmt: str) -> None:
    a = write_attachment(DOC, fmt, tmp_path / "a" / f"x.{fmt}")
    b = write_attachment(DOC, fmt, tmp_path / "b" / f"x.{fmt}")
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()


@pytest.mark.parametrize("fmt", ["xlsx", "docx"])
def test_zip_members_carry_the_fixed_date_not_the_clock(tmp_path: Path, fmt: str) -> None:
    # openpyxl and python-docx date each member now (2 s ticks): two writes across a tick differed
    path = write_attachment(DOC, fmt, tmp_path / f"x.{fmt}")
    with zipfile.ZipFile(path) as archive:
        dates = {info.date_time for info in archive.infolist()}
        assert archive.testzip() is None
        core = archive.read("docProps/core.xml")
    assert dates == {(2024, 1, 1, 0, 0, 0)}
    # openpyxl writes the save time as the workbook's modified date whatever its properties say
    assert b">2024-01-01T00:00:00Z</dcterms:modified>" in core
    assert b">2024-01-01T00:00:00Z</dcterms:created>" in core


def test_sqlite_query_tool_is_read_only(tmp_path: Path) -> None:
    path = write_attachment(DOC, "sqlite", tmp_path / "y.sqlite")
    read_file, query = make_file_tools({"y.sqlite": path})
    assert query.name == "query_sqlite"
    out = query.call(
        {"file_name": "y.sqlite", "query": "SELECT SUM(tons) FROM orchard_yields WHERE region='Tamsa'"}
    )
    assert out.ok and "50" in out.text
    bad = query.call({"file_name": "y.sqlite", "query": "DROP TABLE orchard_yields"})
    assert not bad.ok and "readonly" in bad.text
    attach = query.call({"file_name": "y.sqlite", "query": f"ATTACH DATABASE '{path}' AS other"})
    assert not attach.ok and "not authorized" in attach.text
    syntax = query.call({"file_name": "y.sqlite", "query": "SELEC 1"})
    assert not syntax.ok and "syntax error" in syntax.text
    assert "orchard_yields" in read_file.call({"file_name": "y.sqlite"}).text


def test_paging_and_bad_names(tmp_path: Path) -> None:
    long_doc = TableDoc("Long", ["n", "text"], [[i, "x" * 50] for i in range(400)])
    path = write_attachment(long_doc, "csv", tmp_path / "long.csv")
    (read_file,) = make_file_tools({"long.csv": path})
    first = read_file.call({"file_name": "long.csv"})
    assert first.ok and "page 1 of" in first.text and len(first.text) <= PAGE_CHARS + 100
    second = read_file.call({"file_name": "long.csv", "page": 2})
    assert second.ok and second.text != first.text
    assert not read_file.call({"file_name": "long.csv", "page": 99}).ok
    missing = read_file.call({"file_name": "other.csv"})
    assert not missing.ok and "long.csv" in missing.text
    (nothing,) = make_file_tools({})
    assert "no attachment" in nothing.call({"file_name": "x"}).text


def test_corrupt_files_become_tool_errors(tmp_path: Path) -> None:
    for suffix in (".xlsx", ".docx", ".pdf", ".json", ".sqlite"):
        path = tmp_path / f"broken{suffix}"
        path.write_bytes(b"this is not what the suffix says")
        with pytest.raises(ToolError):
            render_file(path)


def test_downloaded_gaia_attachment_types(tmp_path: Path) -> None:
    """Types found in GAIA downloads: zip members read by their own type, any text type sniffed,
    unknown binaries, LFS pointers and audio refused with a clear message."""
    import zipfile

    from agentrl.tools.files import is_lfs_pointer

    write_attachment(DOC, "xlsx", tmp_path / "inner.xlsx")
    with zipfile.ZipFile(tmp_path / "bundle.zip", "w") as archive:
        archive.write(tmp_path / "inner.xlsx", "sheets/yields.xlsx")
        archive.writestr("blob.bin", bytes(range(256)))
    text = render_file(tmp_path / "bundle.zip")
    assert "- sheets/yields.xlsx (" in text and "Brevik Hollow | Tamsa | 41" in text
    assert "## blob.bin\n(not readable: cannot read blob.bin: files of type .bin are not supported" in text
    (tmp_path / "script.R").write_text("x <- c(1, 2)\nprint(mean(x))\n")
    assert render_file(tmp_path / "script.R").startswith("x <- c(1, 2)")
    (tmp_path / "pointer.xlsx").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n"
    )
    assert is_lfs_pointer(tmp_path / "pointer.xlsx") and not is_lfs_pointer(tmp_path / "script.R")
    with pytest.raises(ToolError, match="Git-LFS pointer, not the file"):
        render_file(tmp_path / "pointer.xlsx")
    (tmp_path / "talk.mp3").write_bytes(b"ID3" + bytes(64))
    with pytest.raises(ToolError, match="audio file"):
        render_file(tmp_path / "talk.mp3")
    with pytest.raises(ToolError, match="missing from this copy"):
        render_file(tmp_path / "absent.pdf")
