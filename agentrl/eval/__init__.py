"""Evaluation: suites over the registered envs, the runner behind ``agentrl eval``, records, reports.

Kept import-free so that loading this package pulls in neither the runner, torch nor the rollout
engine. Answer scorers live in the leaf package :mod:`agentrl.scorers` (envs use them too). Use
``from agentrl.eval.runner import evaluate, run_eval``.
"""
