"""Learner, engines, checkpoints and the RL training run: trainer.py (Trainer: setup / step / evaluate / finish) and step.py (one RL step, top to bottom)."""
