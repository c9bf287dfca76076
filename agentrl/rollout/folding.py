"""Context folding: branch/return (FoldGRPO) and summarization (SUPO/FoldAct) helpers.

The context strategies :class:`~agentrl.rollout.context.Branch` and
:class:`~agentrl.rollout.context.Summary` keep one working context per thread. With
``folding="branch"`` the model gets two extra tools: ``branch(description, prompt)`` opens a
sub-thread whose context is the main history up to the call plus an instruction, and
``return(message)`` closes it; only the message comes back to the main thread as the branch
call's observation. Branches do not nest. With ``folding="summary"``, when the working context
passes a threshold the same policy is asked for a summary and the context restarts as the
prompt plus that summary. Each branch / restart is its own Segment (fold id k > 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.actions import parse_action

BRANCH_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "branch",
            "description": "Start a focused sub-task in a fresh working context. Only the message it returns "
            "comes back here.",
            "parameters": {
                "type": "object",
                "properties": {
                    "description": {"type": "string", "description": "Short name of the sub-task."},
                    "prompt": {"type": "string", "description": "Instructions for the sub-task."},
                },
                "required": ["description", "prompt"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "return",
            "description": "Finish the current sub-task and hand its result back to the main thread.",
            "parameters": {
                "type": "object",
                "properties": {"message": {"type": "string", "description": "The result to hand back."}},
                "required": ["message"],
            },
        },
    },
]
FOLD_TOOL_PARAMS = {"branch": ("description", "prompt"), "return": ("message",)}


def branch_tools_text() -> str:
    """branch/return documented in plain text, for a system prompt that documents its tools itself
    (``rollout.tool_schemas: false``, where no JSON schema is rendered): otherwise the model would
    never be told that the two tools exist."""
    lines = ["To keep this context short you can also work on a sub-task in a separate context:"]
    for tool in BRANCH_TOOLS:
        fn = tool["function"]
        lines.append(f"- {fn['name']}({', '.join(FOLD_TOOL_PARAMS[fn['name']])}): {fn['description']}")
    lines.append('<tool_call>{"name": "branch", "arguments": {"description": "...", "prompt": "..."}}</tool_call>')
    return "\n".join(lines)


SUMMARY_INSTRUCTION = (
    "Your working context is almost full. Summarize everything important so far: the task, what you "
    "found (with exact facts and numbers), what failed, and what remains to do. Reply with the summary only."
)
SUMMARY_PREFIX = "Summary of your progress so far:\n"


@dataclass(frozen=True)
class FoldCall:
    """A branch or return call found in a model turn."""

    name: str  # "branch" | "return"
    arguments: dict[str, Any]


def find_fold_call(action_text: str) -> FoldCall | None:
    """The first ``branch``/``return`` call in the turn (Hermes JSON or ReAct ``return[msg]``), if any."""
    parsed = parse_action(action_text, FOLD_TOOL_PARAMS, react=True)
    for call in parsed.tool_calls:
        if call.name in FOLD_TOOL_PARAMS:
            return FoldCall(call.name, dict(call.arguments))
    return None


def branch_instruction(call: FoldCall) -> str:
    description = str(call.arguments.get("description", "")).strip() or "sub-task"
    prompt = str(call.arguments.get("prompt", "")).strip()
    return (
        f"You are now in a branch for the sub-task: {description}\n{prompt}\n"
        "Work on this sub-task only, using the tools. When it is done, call return with a message that "
        "states the result. You cannot start another branch from here."
    )


def return_observation(call: FoldCall | None) -> str:
    if call is None:
        return "The branch ended without calling return (turn budget); no result came back."
    return f"Branch result: {str(call.arguments.get('message', '')).strip()}"


def summary_task(task_text: str, summary_text: str) -> str:
    """The restarted context's user message: the task followed by the policy's summary."""
    return f"{task_text}\n\n{SUMMARY_PREFIX}{summary_text.strip()}\n\nContinue the task from here."


NESTED_BRANCH = (
    "Error: branch is not available inside a branch (no nesting). Finish this sub-task and call return."
)
RETURN_IN_MAIN = "Error: return is only valid inside a branch. Use branch to start a sub-task."
BRANCH_LIMIT = "Error: the branch limit for this episode is reached. Continue in the main thread."
