"""agentrl: train and evaluate tool-using LLM agents with reinforcement learning."""

import agentrl.envs  # noqa: E402,F401  (registers the built-in env ids; cheap: entry points are lazy)
from agentrl.env import Score, Task, TextEnv, make, register, registered_ids

__version__ = "0.1.0"
__all__ = ["Score", "Task", "TextEnv", "make", "register", "registered_ids", "__version__"]
