"""Log-prob of closing the first tool call with </answer> vs </tool_call>, per trained model.

Run from a study's seed folder (the one the study wrote, with warmup/, ppo/, stppo/):
    cd <out_dir>/seed-0 && python close_tag_logprob.py ppo stppo
Takes the first 24 episodes of the warm-up's held-out eval, cuts each first turn at its closing
</tool_call>, and sums each closing sequence's token log-probs under each named arm's model/.
Output on 2026-11-29, seed 0 (the study running beside it):
    ppo n 24 mean logp </answer> -7.973  </tool_call> -0.022 share answer>tool 0
    stppo n 24 mean logp </answer> -0.066  </tool_call> -3.102 share answer>tool 24
"""
import json
import statistics
import sys

import torch

from agentrl.rollout.model import load_model


def closing_logprob(model, context: list[int], closing: list[int]) -> float:
    """Sum of the log-probs of ``closing`` placed after ``context``."""
    logits = model(torch.tensor([context + closing])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    start = len(context) - 1
    return sum(float(logp[start + i, token]) for i, token in enumerate(closing))


def main(arms: list[str]) -> None:
    episodes = [json.loads(line) for line in open("warmup/eval/step-000000.jsonl")][:24]
    firsts = [(ep["segments"][0]["prompt_ids"], ep["segments"][0]["turns"][0]["output_ids"]) for ep in episodes]
    for arm in arms:
        model, tok = load_model(f"{arm}/model")
        model.eval()
        answer, tool = tok.encode("</answer>"), tok.encode("</tool_call>")
        by_answer, by_tool = [], []
        with torch.no_grad():
            for prompt, output in firsts:
                text = tok.decode(output)
                cut = text.rfind("</tool_call>")
                if cut < 0:
                    continue
                context = list(prompt) + tok.encode(text[:cut], add_special_tokens=False)
                by_answer.append(closing_logprob(model, context, answer))
                by_tool.append(closing_logprob(model, context, tool))
        wins = sum(a > t for a, t in zip(by_answer, by_tool, strict=True))
        print(arm, "n", len(by_answer), "mean logp </answer>", round(statistics.mean(by_answer), 3),
              " </tool_call>", round(statistics.mean(by_tool), 3), "share answer>tool", wins)


if __name__ == "__main__":
    main(sys.argv[1:])
