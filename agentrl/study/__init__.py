"""``agentrl study``: objectives side by side, from one warm-up, on equal terms.

One job (issue #45: packages by job), one level above the trainer: ``orchestrator`` plans and runs
``agentrl train`` subprocesses (warm-ups, arms, resumes, parallel runs); ``report`` turns their
summaries and metrics into results.json, report.md and plots.
"""
