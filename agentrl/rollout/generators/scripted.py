"""A deterministic generator that emits scripted text as real token ids of a real tokenizer.

Not a mock: it is how exact multi-turn episodes are scripted for tests and demos. The reply for a
prompt comes from ``respond(prompt_text, call_index)``; its ids are ``tokenizer.encode(reply)``
plus the EOS id, with a fixed log-prob per token. Every prompt it was given is recorded, so tests
can check that a training row holds exactly what was fed to and sampled from the generator.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from agentrl.rollout.generators.base import GenerationOutput, Generator, SamplingParams, check_prompts


class ScriptedGenerator(Generator):
    """Replies chosen by a function of the decoded prompt."""

    name = "scripted"
    shared_batches = True
    supports_entropy = True

    def __init__(
        self,
        tokenizer: object,
        respond: Callable[[str, int], str],
        *,
        logprob: float = -0.5,
        entropy: float = 1.0,
        add_eos: bool = True,
    ):
        self.tokenizer = tokenizer
        self.respond = respond
        self.logprob = logprob
        self.entropy = entropy
        self.add_eos = add_eos
        self.calls: list[tuple[list[int], GenerationOutput]] = []
        self._lock = threading.Lock()

    @classmethod
    def by_turn(
        cls, tokenizer: object, replies: Sequence[str], marker: str = "<|im_start|>assistant", **kw
    ) -> ScriptedGenerator:
        """Reply ``replies[k]`` where k = number of earlier assistant turns in the prompt."""

        def respond(prompt: str, _index: int) -> str:
            k = prompt.count(marker) - 1
            return replies[min(k, len(replies) - 1)]

        return cls(tokenizer, respond, **kw)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[GenerationOutput]:
        check_prompts(prompts)
        outputs = []
        for prompt in prompts:
            with self._lock:
                index = len(self.calls)
                text = self.respond(self.tokenizer.decode(list(prompt)), index)
                ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
                reason = "length" if len(ids) >= sampling.max_new_tokens else "stop"
                ids = ids[: sampling.max_new_tokens]
                if self.add_eos and reason == "stop":
                    ids.append(self.tokenizer.eos_token_id)
                n = len(ids)
                out = GenerationOutput(
                    ids=ids,
                    logprobs=[self.logprob] * n,
                    entropy=[self.entropy] * n if sampling.return_entropy else None,
                    finish_reason=reason,
                )
                self.calls.append((list(prompt), out))
            outputs.append(out)
        return outputs
