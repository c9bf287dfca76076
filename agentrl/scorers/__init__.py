"""Answer scorers: pure functions of strings (no model, no I/O), shared by envs and evaluation.

A leaf package: it imports nothing from agentrl, so ``envs/`` and :mod:`agentrl.eval` both use it
without either importing the other. :mod:`.qa` holds the SQuAD EM/F1 rules (search QA),
:mod:`.gaia` GAIA's official question scorer.
"""
