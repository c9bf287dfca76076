"""Code-interpreter environments: generated computation problems, MATH-500 and AIME (registration only)."""

from agentrl.env import register

_ENTRY = "agentrl.envs.code.env:CodeEnv"
_DOC = "math with a stateful sandboxed python tool"

register(
    "agentrl/Code-v0", _ENTRY, description=f"{_DOC}: seeded computation-heavy word problems", max_turns=8
)
register(
    "agentrl/CodeMath500-v0",
    _ENTRY,
    description=f"{_DOC}: MATH-500",
    max_turns=8,
    kwargs={"source": "math500", "split": "test"},
)
register(
    "agentrl/CodeAIME24-v0",
    _ENTRY,
    description=f"{_DOC}: AIME 2024",
    max_turns=12,
    kwargs={"source": "aime2024", "split": "test"},
)
register(
    "agentrl/CodeAIME25-v0",
    _ENTRY,
    description=f"{_DOC}: AIME 2025",
    max_turns=12,
    kwargs={"source": "aime2025", "split": "test"},
)
