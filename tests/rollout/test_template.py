"""Template conformance: SmolLM2, Qwen2.5-style and Llama-3-style pass; a history rewrite is caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.rollout.template import ChatFormat, check_template, with_template
from agentrl.trajectory import Source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "templates"
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the wiki.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}


@pytest.fixture(scope="module")
def qwen(tokenizer):
    return with_template(tokenizer, (FIXTURES / "qwen2_5.jinja").read_text(), agentrl_name="qwen2.5-style")


@pytest.fixture(scope="module")
def llama(tokenizer):
    return with_template(
        tokenizer,
        (FIXTURES / "llama3.jinja").read_text(),
        additional_special_tokens=[
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ],
        eos_token="<|eot_id|>",
        bos_token="<|begin_of_text|>",
        agentrl_name="llama3-style",
    )


def test_smollm2_template_conforms_and_gets_tools_in_the_system_prompt(tokenizer):
    report = check_template(tokenizer, tools=[SEARCH_TOOL])
    assert report.ok, report.summary()
    assert not report.native_tools and report.obs_role == "user"
    assert report.bridge == "<|im_end|>\n<|im_start|>user\nOBS<|im_end|>\n<|im_start|>assistant\n"
    prompt = ChatFormat(tokenizer, [SEARCH_TOOL]).render(
        [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Q"}], add_generation_prompt=True
    )
    assert '"name": "search"' in prompt and prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("fixture", ["tokenizer", "qwen"])
def test_tool_schemas_off_leaves_the_system_prompt_as_the_env_wrote_it(fixture, request):
    tok = request.getfixturevalue(fixture)
    messages = [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Q"}]
    with_schemas = ChatFormat(tok, [SEARCH_TOOL]).render(messages, add_generation_prompt=True)
    without = ChatFormat(tok, [SEARCH_TOOL], tool_schemas=False).render(messages, add_generation_prompt=True)
    assert '"name": "search"' in with_schemas and "search" not in without
    assert without == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_qwen25_style_template_conforms_with_native_tools(qwen):
    report = check_template(qwen, tools=[SEARCH_TOOL])
    assert report.ok, report.summary()
    assert report.native_tools and report.obs_role == "tool"
    assert report.bridge == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nOBS\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_llama3_style_template_renders_incrementally_but_drifts_with_a_gpt2_tokenizer(llama):
    """The Llama-3 layout itself is incremental (no history rewrite, bridge found), but with
    SmolLM2's GPT-2 pre-tokenizer the generation prompt's trailing "\n\n" is one token when the
    prompt is tokenized alone and two when the next turn follows it in a full re-render. (Llama-3's
    own tokenizer keeps "\n\n" whole.) The check must report exactly that drift."""
    report = check_template(llama, tools=[SEARCH_TOOL])
    assert report.native_tools and not report.history_rewrite
    assert report.bridge.startswith("<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\nOBS<|eot_id|>")
    assert report.first_bad_turn == 0 and not report.ok
    assert "incremental ids differ from the full re-render" in report.problems[0]
    assert "llama3-style" in report.summary()


def test_history_rewriting_template_is_caught_with_model_turn_and_diff(tokenizer):
    rewriting = with_template(
        tokenizer, (FIXTURES / "reasoning_stripping.jinja").read_text(), agentrl_name="qwen3-style"
    )
    report = check_template(rewriting)
    assert not report.ok and report.history_rewrite
    assert report.first_bad_turn == 0
    text = report.summary()
    assert "qwen3-style" in text and "turn 0" in text and "I should look this up" in text


def test_eos_that_is_not_the_end_of_turn_is_reported(tokenizer):
    odd = with_template(tokenizer, (FIXTURES / "qwen2_5.jinja").read_text(), eos_token="<|endoftext|>")
    report = check_template(odd)
    assert not report.ok
    assert any("not the EOS token" in p for p in report.problems)


def test_bridge_sources_mark_template_and_observation_tokens(qwen, tokenizer):
    fmt = ChatFormat(qwen, [SEARCH_TOOL])
    bridge = fmt.observation_bridge("Paris is big.", ended_with_eos=True)
    tool_ids = [i for i, s in zip(bridge.ids, bridge.source, strict=True) if s == Source.TOOL]
    assert qwen.decode(tool_ids).strip() == "Paris is big."
    assert bridge.source[0] == Source.TEMPLATE and bridge.source[-1] == Source.TEMPLATE
    # Without the model's EOS the bridge closes the turn itself.
    open_bridge = fmt.observation_bridge("x", ended_with_eos=False)
    assert open_bridge.ids[0] == tokenizer.convert_tokens_to_ids("<|im_end|>")
