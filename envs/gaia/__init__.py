"""GAIA-shaped environments.

- ``agentrl/GAIA-v0``: local-gaia, ~150 generated tasks (levels 1-3) over the fictional-entity wiki
  shared with the search env, with attachments, a Python interpreter and SQL (see ``local.py``).
- ``agentrl/GAIA-Real-v0``: GAIA's own ``metadata.jsonl`` layout from a local folder
  (``data_dir=`` or ``AGENTRL_GAIA_DIR``; see ``real.py``).
"""

from __future__ import annotations

from agentrl.env import register

register(
    "agentrl/GAIA-v0",
    "agentrl.envs.gaia.local:LocalGaiaEnv",
    description="local-gaia: GAIA-shaped tasks (levels 1-3) over the fictional wiki, files, python; GAIA scorer",
    max_turns=30,
    max_obs_chars=8192,
)
register(
    "agentrl/GAIA-Real-v0",
    "agentrl.envs.gaia.real:GaiaRealEnv",
    description="Real GAIA from a local metadata.jsonl folder (data_dir=...), file reader + python tools, GAIA scorer",
    max_turns=12,
    max_obs_chars=8192,
)
