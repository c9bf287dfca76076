"""agentrl.envs — one package per env family (search/, code/, sql/, web/, gaia/ ...).

Importing this package imports every family's ``__init__``, which only calls
:func:`agentrl.register` with lazy ``"module:Class"`` entry points (no heavy imports).
"""

from __future__ import annotations

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    if _module.ispkg and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
