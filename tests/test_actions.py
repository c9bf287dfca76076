"""Action parsing: well-formed, malformed, mixed, several calls, unicode, very long outputs."""

from __future__ import annotations

from agentrl.actions import parse_action

TOOLS = {"search": ["query", "k"], "open": ["doc_id"], "click": ["element"]}


def test_hermes_call():
    p = parse_action('<tool_call>{"name": "search", "arguments": {"query": "x", "k": 2}}</tool_call>', TOOLS)
    assert [(c.name, c.arguments, c.format) for c in p.tool_calls] == [("search", {"query": "x", "k": 2}, "hermes")]
    assert p.answer is None and p.problems == () and not p.is_void


def test_several_calls_in_one_turn_keep_order():
    text = ('think <tool_call>{"name": "open", "arguments": {"doc_id": "d1"}}</tool_call> then '
            '<tool_call>{"name": "search", "arguments": {"query": "y"}}</tool_call>')
    p = parse_action(text, TOOLS)
    assert [c.name for c in p.tool_calls] == ["open", "search"]


def test_answer_and_last_answer_wins():
    p = parse_action("<answer>a</answer> on second thought <answer> Paris </answer>", TOOLS)
    assert p.answer == "Paris" and p.is_final and p.tool_calls == ()


def test_react_style_uses_first_parameter_and_keeps_inner_brackets():
    p = parse_action("I will search[red shoes [size 9]]", TOOLS)
    assert [(c.name, c.arguments, c.format) for c in p.tool_calls] == [("search", {"query": "red shoes [size 9]"}, "react")]


def test_react_ignores_unknown_names_and_is_off_without_tools():
    assert parse_action("foo[bar]", TOOLS).problems[0].kind == "no_action"
    assert parse_action("search[x]", None).tool_calls == ()


def test_malformed_json_is_a_problem_not_an_exception():
    p = parse_action('<tool_call>{"name": "search", "arguments": {"query": }</tool_call>', TOOLS)
    assert p.tool_calls == () and [x.kind for x in p.problems] == ["malformed_json"]
    assert "not valid JSON" in p.problems[0].message


def test_unknown_tool_lists_the_available_ones():
    p = parse_action('<tool_call>{"name": "browse", "arguments": {}}</tool_call>', TOOLS)
    assert p.problems[0].kind == "unknown_tool" and "search, open, click" in p.problems[0].message


def test_arguments_must_be_an_object_but_double_encoded_json_is_accepted():
    bad = parse_action('<tool_call>{"name": "open", "arguments": [1]}</tool_call>', TOOLS)
    assert bad.problems[0].kind == "bad_arguments"
    ok = parse_action('<tool_call>{"name": "open", "arguments": "{\\"doc_id\\": \\"d\\"}"}</tool_call>', TOOLS)
    assert ok.tool_calls[0].arguments == {"doc_id": "d"}


def test_mixed_good_and_bad_calls():
    text = ('<tool_call>{"name": "open", "arguments": {"doc_id": "d"}}</tool_call>'
            "<tool_call>not json</tool_call>")
    p = parse_action(text, TOOLS)
    assert [c.name for c in p.tool_calls] == ["open"] and [x.kind for x in p.problems] == ["malformed_json"]


def test_unclosed_tags_are_reported():
    assert parse_action('<tool_call>{"name": "open"', TOOLS).problems[0].kind == "unclosed_tag"
    assert parse_action("<answer>Paris", TOOLS).problems[0].kind == "unclosed_tag"


def test_void_turn():
    p = parse_action("Let me think about it.", TOOLS)
    assert p.is_void and p.problems[0].kind == "no_action"


def test_final_answer_prefix_only_when_enabled():
    assert parse_action("FINAL ANSWER: 42\nextra", TOOLS).answer is None
    assert parse_action("FINAL ANSWER: 42\nextra", TOOLS, final_answer_prefix=True).answer == "42"


def test_unicode_round_trips():
    p = parse_action('<tool_call>{"name": "search", "arguments": {"query": "Zürich café 東京 ✓"}}</tool_call>', TOOLS)
    assert p.tool_calls[0].arguments["query"] == "Zürich café 東京 ✓"
    assert parse_action("<answer>Ærøskøbing</answer>", TOOLS).answer == "Ærøskøbing"


def test_very_long_output_is_parsed_and_echo_is_clipped():
    junk = "x" * 200_000
    p = parse_action(junk + '<tool_call>{"name": "open", "arguments": {"doc_id": "d"}}</tool_call>', TOOLS)
    assert p.tool_calls[0].arguments == {"doc_id": "d"}
    bad = parse_action(f"<tool_call>{junk}</tool_call>", TOOLS)
    assert len(bad.problems[0].message) < 1000
