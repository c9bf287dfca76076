"""Evaluation: suites over the registered envs, scorers, the runner behind ``agentrl eval``, reports.

Kept import-free: envs import :mod:`agentrl.eval.gaia_scorer` and :mod:`agentrl.eval.scorers`, so
loading this package must not pull in the runner, torch or the rollout engine. Use
``from agentrl.eval.runner import evaluate, run_eval``.
"""
