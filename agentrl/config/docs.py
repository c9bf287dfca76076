"""A config dataclass's help: its fields' attribute docstrings (``agentrl train --help-config``,
``docs/reference/config.md``)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing

from agentrl.config.sections import RunConfig


def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass (the string literal under each field)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if (
                isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = nxt.value.value.strip()
    return docs


def help_text(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, default, help) for every field, recursively."""
    rows = []
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            rows += help_text(hints[f.name], name + ".")
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            rows.append((name, repr(default), docs.get(f.name, "")))
            item = typing.get_args(hints[f.name])[0] if typing.get_origin(hints[f.name]) is tuple else None
            if dataclasses.is_dataclass(item):  # env.mixture: each entry's fields, as env[i].<field>
                base = name.rsplit(".", 1)[0] if name == "env.mixture" else name
                rows += help_text(item, f"{base}[i].")
    return rows
