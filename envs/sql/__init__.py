"""Text-to-SQL environments: Chinook plus seeded generated databases (registration only)."""

from agentrl.env import register

_ENTRY = "agentrl.envs.sql.env:SQLEnv"
_DOC = "Text-to-SQL with list_tables/describe/query tools in a read-only sandbox; execution accuracy"

register(
    "agentrl/SQL-v0", _ENTRY, description=f"{_DOC} (all databases)", max_turns=10, kwargs={"database": "all"}
)
register(
    "agentrl/SQLChinook-v0",
    _ENTRY,
    description=f"{_DOC} (Chinook)",
    max_turns=10,
    kwargs={"database": "chinook"},
)
register(
    "agentrl/SQLShop-v0",
    _ENTRY,
    description=f"{_DOC} (generated shop)",
    max_turns=10,
    kwargs={"database": "shop"},
)
register(
    "agentrl/SQLUniversity-v0",
    _ENTRY,
    description=f"{_DOC} (generated university)",
    max_turns=10,
    kwargs={"database": "university"},
)
