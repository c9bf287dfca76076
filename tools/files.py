"""File reader tools for task attachments (GAIA's ``file_name``): CSV, XLSX, JSON, SQLite, PDF, DOCX,
PPTX, ZIP (members listed and read), images (size and embedded description; no pixels), and every
text-like type (code, markup, PDB ...: sniffed, not only by suffix). Audio and Git-LFS pointer files
become a clear observation saying the content is not available.

:func:`render_file` turns a file into text a model can read; :func:`make_file_tools` binds a set of
attachments to two tools, ``read_file`` (paged text) and ``query_sqlite`` (read-only SQL over an
attached SQLite database). Files that cannot be read (unknown type, corrupt content) become a
``ToolError`` observation, never a crash.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import zipfile
from collections.abc import Mapping
from pathlib import Path

from agentrl.errors import ToolError
from agentrl.tools.base import Tool, tool

PAGE_CHARS = 6000  # one read_file page; the env's observation budget cuts beyond its own limit
MAX_TABLE_ROWS = 500  # rows per table/sheet rendered before "... N more rows"
SQL_MAX_ROWS = 200
SQL_MAX_STEPS = 2_000_000  # sqlite VM steps before a query is interrupted (runaway joins)

TEXT_SUFFIXES = {".txt", ".md", ".py", ".log", ".html", ".xml", ".yaml", ".yml", ".pdb"}
SQLITE_SUFFIXES = {".sqlite", ".sqlite3", ".db"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff"}
AUDIO_SUFFIXES = {".mp3", ".wav", ".m4a", ".flac", ".ogg", ".aac"}
LFS_HEADER = b"version https://git-lfs.github.com/spec/v1"
ZIP_MAX_MEMBER_BYTES = 20_000_000  # members larger than this are listed, not read
TEXT_SNIFF_BYTES = 4096


def is_lfs_pointer(path: str | Path) -> bool:
    """True when ``path`` is a Git-LFS pointer file (the repository was cloned without ``git lfs pull``)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(LFS_HEADER)) == LFS_HEADER
    except OSError:
        return False


def _looks_like_text(path: Path) -> bool:
    with open(path, "rb") as handle:
        head = handle.read(TEXT_SNIFF_BYTES)
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 4  # a multi-byte character cut by the sniff window
    return True


def _table_text(rows: list[list[object]], *, sep: str = " | ") -> str:
    shown = rows[: MAX_TABLE_ROWS + 1]  # header + rows
    lines = [sep.join("" if cell is None else str(cell) for cell in row) for row in shown]
    if len(rows) > len(shown):
        lines.append(f"... {len(rows) - len(shown)} more rows")
    return "\n".join(lines)


def _render_csv(path: Path) -> str:
    text = path.read_text(encoding="utf-8-sig", errors="replace")
    dialect = "excel-tab" if path.suffix.lower() == ".tsv" else "excel"
    rows = list(csv.reader(io.StringIO(text), dialect=dialect))
    return _table_text([list(r) for r in rows])


def _render_xlsx(path: Path) -> str:
    import openpyxl

    try:
        book = openpyxl.load_workbook(path, read_only=True, data_only=True)
    except (zipfile.BadZipFile, KeyError, OSError, ValueError) as exc:
        raise ToolError(f"cannot open {path.name} as an Excel workbook: {exc}") from exc
    parts = []
    try:
        for sheet in book.worksheets:
            rows = [list(row) for row in sheet.iter_rows(values_only=True)]
            parts.append(f"## Sheet: {sheet.title}\n{_table_text(rows)}")
    finally:
        book.close()
    return "\n\n".join(parts)


def _render_json(path: Path) -> str:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ToolError(f"{path.name} is not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    return json.dumps(value, indent=2, ensure_ascii=False)


def _render_jsonl(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _connect_readonly(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
    steps = 0

    def guard() -> int:
        nonlocal steps
        steps += 1000
        return 1 if steps > SQL_MAX_STEPS else 0  # non-zero interrupts the statement

    def authorize(action: int, *_: object) -> int:
        # reading other database files through ATTACH would escape the attachment
        return (
            sqlite3.SQLITE_DENY
            if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH)
            else sqlite3.SQLITE_OK
        )

    conn.set_progress_handler(guard, 1000)
    conn.set_authorizer(authorize)
    return conn


def _render_sqlite(path: Path) -> str:
    try:
        conn = _connect_readonly(path)
        tables = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        ).fetchall()
    except sqlite3.DatabaseError as exc:
        raise ToolError(f"cannot open {path.name} as a SQLite database: {exc}") from exc
    parts = [f"SQLite database with {len(tables)} table(s). Use query_sqlite to run SELECT queries."]
    try:
        for name, ddl in tables:
            cursor = conn.execute(f'SELECT * FROM "{name}" LIMIT 20')
            header = [d[0] for d in cursor.description]
            count = conn.execute(f'SELECT COUNT(*) FROM "{name}"').fetchone()[0]
            parts.append(
                f"## Table {name} ({count} rows)\n{ddl}\n{_table_text([header, *cursor.fetchall()])}"
            )
    finally:
        conn.close()
    return "\n\n".join(parts)


def _render_pdf(path: Path) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(path)
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PdfReadError, OSError, ValueError) as exc:
        raise ToolError(f"cannot read {path.name} as a PDF: {exc}") from exc
    return "\n\n".join(f"## Page {i + 1}\n{text.strip()}" for i, text in enumerate(pages))


def _render_docx(path: Path) -> str:
    import docx
    from docx.opc.exceptions import PackageNotFoundError

    try:
        document = docx.Document(str(path))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise ToolError(f"cannot open {path.name} as a Word document: {exc}") from exc
    parts = [p.text for p in document.paragraphs if p.text.strip()]
    for index, table in enumerate(document.tables):
        rows = [[cell.text for cell in row.cells] for row in table.rows]
        parts.append(f"## Table {index + 1}\n{_table_text(rows)}")
    return "\n".join(parts)


def _render_pptx(path: Path) -> str:
    """Slide texts in slide order (PowerPoint files are zipped XML; no extra dependency)."""
    import re
    from xml.etree import ElementTree

    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if re.fullmatch(r"ppt/slides/slide\d+\.xml", n)]
            names.sort(key=lambda n: int(re.sub(r"\D", "", n)))
            slides = [ElementTree.fromstring(archive.read(n)) for n in names]
    except (zipfile.BadZipFile, KeyError, ElementTree.ParseError) as exc:
        raise ToolError(f"cannot open {path.name} as a PowerPoint file: {exc}") from exc
    parts = []
    for number, root in enumerate(slides, start=1):
        paragraphs = []
        for paragraph in root.iter("{http://schemas.openxmlformats.org/drawingml/2006/main}p"):
            text = "".join(
                t.text or ""
                for t in paragraph.iter("{http://schemas.openxmlformats.org/drawingml/2006/main}t")
            )
            if text.strip():
                paragraphs.append(text)
        parts.append(f"## Slide {number}\n" + "\n".join(paragraphs))
    return "\n\n".join(parts) if parts else f"{path.name} has no slides"


def _render_zip(path: Path) -> str:
    """The member list, then every readable member rendered by its own type."""
    import tempfile

    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise ToolError(f"cannot open {path.name} as a ZIP archive: {exc}") from exc
    with archive, tempfile.TemporaryDirectory(prefix="agentrl-zip-") as tmp:
        members = [m for m in archive.infolist() if not m.is_dir()]
        parts = [f"ZIP archive {path.name} with {len(members)} file(s):"]
        parts += [f"- {m.filename} ({m.file_size} bytes)" for m in members]
        for member in members:
            if member.file_size > ZIP_MAX_MEMBER_BYTES:
                parts.append(f"\n## {member.filename}\n(not read: over {ZIP_MAX_MEMBER_BYTES} bytes)")
                continue
            target = Path(tmp) / f"{len(parts)}{Path(member.filename).suffix}"
            target.write_bytes(archive.read(member))
            try:
                body = render_file(target)
            except ToolError as exc:
                body = f"(not readable: {str(exc).replace(target.name, member.filename)})"
            parts.append(f"\n## {member.filename}\n{body}")
    return "\n".join(parts)


def _render_image(path: Path) -> str:
    """What can be said about an image without seeing it: format, size, embedded text metadata."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            facts = f"{image.format} image, {image.width}x{image.height} pixels, mode {image.mode}"
            described = [f"{k}: {v}" for k, v in image.info.items() if isinstance(v, str) and v.strip()]
            exif = image.getexif()
            described += [f"EXIF {tag}: {exif[tag]}" for tag in (270, 315, 37510) if exif.get(tag)]
    except (UnidentifiedImageError, OSError) as exc:
        raise ToolError(f"cannot open {path.name} as an image: {exc}") from exc
    lines = [
        f"{path.name}: {facts}.",
        "This reader returns no pixels: you cannot see this image's content through read_file.",
    ]
    if described:
        lines += ["Text stored in the file:", *described]
    return "\n".join(lines)


def _refuse_audio(path: Path) -> str:
    raise ToolError(
        f"{path.name} is an audio file; no speech-to-text is available here, so its content cannot be "
        "read. Answer from the question alone, or say that the recording is needed."
    )


_RENDERERS = {
    ".csv": _render_csv,
    ".tsv": _render_csv,
    ".xlsx": _render_xlsx,
    ".json": _render_json,
    ".jsonld": _render_json,
    ".jsonl": _render_jsonl,
    ".pdf": _render_pdf,
    ".docx": _render_docx,
    ".pptx": _render_pptx,
    ".zip": _render_zip,
    **{suffix: _render_sqlite for suffix in SQLITE_SUFFIXES},
    **{suffix: _render_image for suffix in IMAGE_SUFFIXES},
    **{suffix: _refuse_audio for suffix in AUDIO_SUFFIXES},
}


def render_file(path: str | Path) -> str:
    """Return the readable text of a file, chosen by its suffix.

    Raises:
        ToolError: the file is missing, of an unsupported type, or unreadable as its type.
    """
    path = Path(path)
    if not path.is_file():
        raise ToolError(
            f"the attachment {path.name!r} is missing from this copy of the data; its content is not available"
        )
    if is_lfs_pointer(path):
        raise ToolError(
            f"the attachment {path.name!r} is a Git-LFS pointer, not the file (the data was cloned without "
            "`git lfs pull`); its content is not available"
        )
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return path.read_text(encoding="utf-8", errors="replace")
    renderer = _RENDERERS.get(suffix)
    if renderer is None:
        if _looks_like_text(path):
            return path.read_text(encoding="utf-8", errors="replace")
        supported = ", ".join(sorted({*_RENDERERS, *TEXT_SUFFIXES}))
        raise ToolError(
            f"cannot read {path.name}: files of type {suffix or '(none)'} are not supported "
            f"({supported}, and text of any type)"
        )
    return renderer(path)


def query_sqlite_file(path: str | Path, query: str, *, max_rows: int = SQL_MAX_ROWS) -> str:
    """Run one read-only SQL statement on a SQLite file and format the rows."""
    path = Path(path)
    conn = _connect_readonly(path)
    try:
        cursor = conn.execute(query)
        if cursor.description is None:
            return "Statement ran; it returned no rows."
        header = [d[0] for d in cursor.description]
        rows = cursor.fetchmany(max_rows + 1)
    except sqlite3.Warning as exc:
        raise ToolError(f"SQL error: {exc} (run one statement at a time)") from exc
    except sqlite3.OperationalError as exc:
        message = "query interrupted: too much work" if "interrupted" in str(exc) else str(exc)
        raise ToolError(f"SQL error: {message}") from exc
    except sqlite3.DatabaseError as exc:
        raise ToolError(f"SQL error: {exc}") from exc
    finally:
        conn.close()
    more = len(rows) > max_rows
    text = _table_text([header, *rows[:max_rows]])
    return text + (f"\n... more than {max_rows} rows; add a LIMIT or aggregate" if more else "")


def make_file_tools(files: Mapping[str, str | Path]) -> list[Tool]:
    """Tools over the attachments ``files`` (name shown to the model -> path on disk).

    ``read_file(file_name, page=1)`` pages the rendered text in chunks of ``PAGE_CHARS``;
    ``query_sqlite(file_name, query)`` runs read-only SQL when a SQLite file is attached.
    """
    paths = {name: Path(p) for name, p in files.items()}
    rendered: dict[str, str] = {}

    def resolve(file_name: str) -> Path:
        name = file_name.strip().strip("'\"")
        if name in paths:
            return paths[name]
        by_base = {Path(n).name: p for n, p in paths.items()}
        if Path(name).name in by_base:
            return by_base[Path(name).name]
        available = ", ".join(paths) or "none: this task has no attachment"
        raise ToolError(f"no attached file named {file_name!r}; attached files: {available}")

    @tool
    def read_file(file_name: str, page: int = 1) -> str:
        """Read an attached file (CSV, XLSX, JSON, SQLite, PDF, DOCX, PPTX, ZIP, image facts or text) as text, one page at a time.

        Args:
            file_name: the attachment's file name, as given in the task.
            page: which page of the rendered text to show (1-based).
        """
        path = resolve(file_name)
        if path.name not in rendered:
            rendered[path.name] = render_file(path)
        text = rendered[path.name]
        pages = max(1, -(-len(text) // PAGE_CHARS))
        if not 1 <= page <= pages:
            raise ToolError(f"page {page} is out of range; {path.name} has {pages} page(s)")
        chunk = text[(page - 1) * PAGE_CHARS : page * PAGE_CHARS]
        footer = (
            f"\n[page {page} of {pages}; call read_file with page={page + 1} for more]"
            if page < pages
            else ""
        )
        return chunk + footer

    @tool
    def query_sqlite(file_name: str, query: str) -> str:
        """Run one read-only SQL query (SQLite dialect) on an attached SQLite database.

        Args:
            file_name: the attached database's file name.
            query: a single SQL statement, e.g. SELECT name FROM t WHERE x > 3.
        """
        path = resolve(file_name)
        if path.suffix.lower() not in SQLITE_SUFFIXES:
            raise ToolError(f"{path.name} is not a SQLite database; use read_file for it")
        return query_sqlite_file(path, query)

    has_sqlite = any(p.suffix.lower() in SQLITE_SUFFIXES for p in paths.values())
    return [read_file, query_sqlite] if has_sqlite else [read_file]
