"""Rollouts: models, chat-template agent (token ids in, token ids out), generators, runner, folding."""

from __future__ import annotations

from agentrl.registry import GENERATORS, lazy

lazy(GENERATORS, "hf", "agentrl.rollout.generators.hf:HFGenerator")
lazy(GENERATORS, "vllm", "agentrl.rollout.generators.vllm:VLLMGenerator")
lazy(GENERATORS, "openai", "agentrl.rollout.generators.openai:OpenAIGenerator")
