"""Execution accuracy: does an answer's result equal the gold result?

An answer is either a SQL query (``SELECT ...`` / ``WITH ...``; its rows are compared) or a value list:

- a JSON or Python literal: ``42``, ``"Rock"``, ``["AC/DC", "Accept"]``, ``[["Rock", 1297], ["Jazz", 130]]``;
  a flat list is one column of rows when the gold result has one column, else one row;
- plain text: one row per line with cells separated by ``|`` (markdown tables work; a header line equal
  to the gold column names and ``---`` lines are skipped); on a single line, cells may also be
  separated by commas.

Rows compare as a multiset (order-insensitive) unless the question asks for an order. Cells compare
after normalisation: numbers (and numeric strings) to 9 significant digits, text stripped and
case-folded, NULL/None/empty as NULL. Columns may come in any order, as long as one order fits all rows.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
from collections import Counter
from typing import Any

MAX_ANSWER_CHARS = 100_000
_SQL_START = re.compile(r"^\s*(SELECT|WITH)\b", re.IGNORECASE)
_FENCE = re.compile(r"^\s*```(?:sql|json|text)?\s*\n?(.*?)\n?```\s*$", re.DOTALL | re.IGNORECASE)


def strip_fence(text: str) -> str:
    found = _FENCE.match(text)
    return found.group(1).strip() if found else text.strip()


def is_sql(answer: str) -> bool:
    """True when the answer is a SQL query rather than a value list."""
    return bool(_SQL_START.match(strip_fence(answer)))


def canonical(value: Any) -> Any:
    """Normalise one cell for comparison (hashable)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(f"{float(value):.9g}")
    text = str(value).strip()
    if text.upper() in ("NULL", "NONE", ""):
        return None
    number = text.replace(",", "") if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text) else text
    try:
        return float(f"{float(number):.9g}")
    except ValueError:
        return text.strip("\"'").casefold()


def _literal(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return None


def _split_cells(line: str, allow_commas: bool) -> list[str]:
    line = line.strip()
    if "|" in line:
        return [cell.strip() for cell in line.strip("|").split("|")]
    if "\t" in line:
        return [cell.strip() for cell in line.split("\t")]
    if allow_commas and "," in line:
        return [cell.strip() for cell in line.split(",")]
    return [line]


def parse_values(answer: str, gold_columns: list[str], gold_rows: int) -> list[list[Any]]:
    """Turn a value-list answer into rows, using the gold result's shape to read flat lists."""
    text = strip_fence(answer)[:MAX_ANSWER_CHARS]
    n_cols = len(gold_columns)
    value = _literal(text) if text[:1] in "[({\"'-0123456789" else None
    if value is not None or text.lower() in ("null", "none"):
        if isinstance(value, dict):
            value = list(value.values())
        if not isinstance(value, list | tuple):
            return [[value]]
        if all(isinstance(v, list | tuple) for v in value) and value:
            return [list(v) for v in value]
        if n_cols == 1:
            return [[v] for v in value]
        if gold_rows == 1 and len(value) == n_cols:
            return [list(value)]
        return [[v] for v in value]
    lines = [ln for ln in text.splitlines() if ln.strip() and not re.fullmatch(r"[\s|:\-+]+", ln)]
    if len(lines) > 1:
        rows = [_split_cells(ln, allow_commas=n_cols > 1) for ln in lines]
        header = [c.casefold() for c in gold_columns]
        if rows and [c.casefold() for c in rows[0]] == header and gold_rows != len(rows):
            rows = rows[1:]
        return rows
    if not lines:
        return []
    cells = _split_cells(lines[0], allow_commas=True)
    if n_cols == 1 and gold_rows > 1:
        return [[c] for c in cells]
    if n_cols == 1 and gold_rows == 1:
        return [[lines[0].strip()]]
    return [cells]


def rows_match(predicted: list[list[Any]], gold: list[list[Any]], ordered: bool) -> bool:
    """Execution-accuracy comparison of two results (see the module docstring)."""
    if len(predicted) != len(gold):
        return False
    if not gold:
        return True
    n_cols = len(gold[0])
    if any(len(row) != n_cols for row in predicted):
        return False
    gold_c = [tuple(canonical(v) for v in row) for row in gold]
    pred_c = [tuple(canonical(v) for v in row) for row in predicted]
    orders = itertools.permutations(range(n_cols)) if n_cols <= 4 else [tuple(range(n_cols))]
    for order in orders:
        permuted = [tuple(row[i] for i in order) for row in pred_c]
        if (permuted == gold_c) if ordered else (Counter(permuted) == Counter(gold_c)):
            return True
    return False
