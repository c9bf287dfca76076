"""Learner, engines, checkpoints and the RL training loop (see trainer.py for the loop, top to bottom)."""
