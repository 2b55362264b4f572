"""Tool calls in the forms real models write them (model/decoding/call_formats.py), without a model: the lazy grammar
(`compile_tools` under llguidance over a byte vocabulary) leaves free text alone and holds a call in any form to a
declared name and that function's schema from its trigger on; the reader (`read_calls`, `opens_calls`,
`starts_calls`) reads every form back, a growing call only ever grows, and a stream's fragments assemble into it;
the voice session's tool loop reads the same forms."""

from __future__ import annotations

import json

import llguidance
import pytest

from model.chat.tools import Function, ToolCall, call_text, opens_calls, read_calls, starts_calls
from model.decoding.call_formats import DEFAULT_FORMS, PYTHON_TAG, CallForm, forms_for
from model.decoding.grammar import compile_tools
from model.decoding.options import GenerationOptions, ToolConstraint
from model.server.answer import ToolCallDeltas
from tests.unit.test_tools import TIME, TOKENIZER, VOCABULARY, WEATHER, matches
from voice.tools.loop import RunTools, Speak, ToolLoop

AUTO = ToolConstraint((("get_weather", WEATHER), ("get_time", TIME)), required=False)
REQUIRED = ToolConstraint(AUTO.tools, required=True)

# One call in each family's own spelling (llama.cpp's common/chat parsers list the same forms).
QWEN = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
HERMES_COMPACT = call_text("get_weather", '{"city":"Paris","days":2}')
BARE = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
FENCED = '```json\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n```'
LLAMA_BARE = '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}'
LLAMA_TAG = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}'
PARIS = ToolCall("get_weather", '{"city": "Paris", "days": 2}', closed=True)


@pytest.mark.parametrize("text", [QWEN, HERMES_COMPACT, BARE, FENCED, LLAMA_BARE, "  \n" + BARE, BARE + "\n"])
def test_each_familys_call_is_a_valid_call_in_auto_and_required(text: str) -> None:
    assert matches(AUTO, text) and matches(REQUIRED, text)


@pytest.mark.parametrize("text", [
    "It is sunny in Paris.",
    'Here it is: {"name": "get_weather", "arguments": {"city": "Paris"}}',  # JSON further in is text
    '{"answer": 42}',  # an object whose first key is not "name"
    '```json\n{"city": "Paris"}\n```',  # a fence of other JSON
    "```python\nprint('hi')\n```",  # code in a fence
    "<b>bold</b> text",
    "",
])
def test_auto_leaves_text_that_does_not_open_with_a_trigger_alone(text: str) -> None:
    assert matches(AUTO, text)
    assert not starts_calls(text) and read_calls(text) == []


@pytest.mark.parametrize("text", [
    '{"name": "say_hello", "arguments": {}}',  # a name not offered (seen from a real Qwen2.5 in auto mode)
    '{"name": "seventeen_times_twenty_three", "arguments": {}}',
    '<tool_call>\n{"name": "get_news", "arguments": {"city": "Paris"}}\n</tool_call>',
    '{"name": "get_weather", "arguments": {"city": 3}}',  # a number for a string
    '{"name": "get_weather", "arguments": {"days": 2}}',  # a required argument missing
    '{"name": "get_weather", "arguments": {"city": "Paris", "mood": "good"}}',  # an argument not declared
    # the schema itself passed as arguments (seen from a real Qwen2.5)
    '{"name": "get_weather", "arguments": {"type": "object", "properties": {"city": {"type": "string"}}}}',
    '<tool_call>I will look it up.',  # the tag, then no call
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}',  # the fence never closed
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}',  # the tag never closed
    QWEN + " Done.",  # text after the calls
])
def test_once_triggered_only_a_declared_name_with_arguments_on_its_schema_completes(text: str) -> None:
    assert not matches(AUTO, text) and not matches(REQUIRED, text)


def test_the_grammar_refuses_an_unknown_name_at_its_first_wrong_character() -> None:
    matcher = llguidance.LLMatcher(TOKENIZER, compile_tools(AUTO), log_level=0)
    ids = VOCABULARY(b'{"name": "get_')
    assert matcher.try_consume_tokens(ids) == len(ids)
    allowed = {VOCABULARY.tokens[i] for i, ok in enumerate(matcher.compute_logit_bias()) if ok}
    assert allowed == {b"w", b"t"}  # get_weather, get_time: nothing else


def test_parallel_calls_follow_one_another_in_one_form_only_when_asked() -> None:
    """A further call follows the last with nothing between, as the generic format writes them."""
    time_call = '{"name": "get_time", "arguments": {"zone": "CET"}}'
    assert matches(AUTO, BARE + time_call) and matches(AUTO, QWEN + call_text("get_time", '{"zone":"CET"}'))
    # whitespace after a call ends the answer: a model that writes a newline there is not held to call again
    assert matches(AUTO, BARE + "\n") and not matches(AUTO, BARE + "\n" + time_call)
    single = ToolConstraint(AUTO.tools, required=False, parallel=False)
    assert matches(single, BARE) and matches(single, BARE + "\n") and not matches(single, BARE + time_call)


def test_whitespace_is_bounded_around_a_call_and_inside_it() -> None:
    assert not matches(AUTO, '{"name":   "get_weather", "arguments": {"city": "Paris"}}')  # one space at most
    assert not matches(REQUIRED, "\n" * 9 + BARE)  # at most 8 before the call


class SpecialVocabulary:
    """The byte vocabulary with Llama 3.x's `<|python_tag|>` as a special token (id 97)."""

    eos_token_id = 0
    bos_token_id = None
    special_token_ids = (0, 97)

    def __init__(self) -> None:
        self.tokens = [*VOCABULARY.tokens, PYTHON_TAG.encode()]

    def __call__(self, text: bytes) -> list[int]:
        return VOCABULARY(text)


def test_llama_s_python_tag_opens_a_call_where_the_vocabulary_has_it() -> None:
    assert forms_for(frozenset({PYTHON_TAG, "<|eot_id|>"})) == (*DEFAULT_FORMS, CallForm.PYTHON_TAG)
    assert forms_for(frozenset({"<|im_end|>"})) == DEFAULT_FORMS
    vocabulary = SpecialVocabulary()
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocabulary))
    llama = ToolConstraint(AUTO.tools, required=False, forms=forms_for(frozenset({PYTHON_TAG})))

    def accepted(text: str) -> bool:
        matcher = llguidance.LLMatcher(tokenizer, compile_tools(llama), log_level=0)
        ids = [97, *vocabulary(text.encode())]
        return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()

    body = LLAMA_TAG.removeprefix(PYTHON_TAG)
    assert accepted(body)
    assert not accepted('{"name": "say_hello", "parameters": {}}')
    assert read_calls(LLAMA_TAG) == [PARIS] and starts_calls(LLAMA_TAG)


@pytest.mark.parametrize("text", [QWEN, BARE, FENCED, LLAMA_BARE, LLAMA_TAG])
def test_every_form_reads_back_and_a_growing_call_only_grows(text: str) -> None:
    assert read_calls(text) == [PARIS]
    previous: list[ToolCall] = []
    for end in range(len(text) + 1):
        calls = read_calls(text[:end])
        assert opens_calls(text[:end]), text[:end]  # never shown as text while it is written
        for old, new in zip(previous, calls, strict=False):
            assert new.name == old.name and new.arguments.startswith(old.arguments), text[:end]
            assert new.closed or not old.closed
        assert len(calls) >= len(previous)
        previous = calls
    assert not read_calls(text[:-1])[0].closed


def test_stream_fragments_of_a_bare_pair_assemble_into_both_calls() -> None:
    answer = BARE + "\n" + '{"name": "get_time", "arguments": {"zone": "CET"}}'
    deltas = ToolCallDeltas()
    assembled: dict[int, dict[str, str]] = {}
    for end in [*range(0, len(answer), 5), len(answer)]:
        for fragment in deltas.feed(answer[:end]):
            call = assembled.setdefault(fragment["index"], {"name": "", "arguments": ""})
            call["name"] += fragment["function"].get("name", "")
            call["arguments"] += fragment["function"]["arguments"]
    assert [(c["name"], json.loads(c["arguments"])) for c in assembled.values()] == [
        ("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"zone": "CET"})]


@pytest.mark.parametrize(("text", "may", "is_call"), [
    ("", True, False), ("  ", True, False), ("{", True, False), ('{ "na', True, False), ("<tool_", True, False),
    ("``", True, False), ("```json\n", True, False), ("<tool_call>", True, True), ('{"name"', True, True),
    ("Sure", False, False), ('{"a"', False, False), ("<b>", False, False), ("```python\nx", False, False),
])
def test_text_that_may_still_become_a_call_is_held_and_other_text_is_not(text: str, may: bool, is_call: bool) -> None:
    assert opens_calls(text) is may and starts_calls(text) is is_call


def test_the_voice_loop_runs_a_call_in_a_models_own_form_and_speaks_text() -> None:
    functions = [Function("get_time", "The time in a zone", TIME)]
    loop = ToolLoop([], functions, GenerationOptions())
    decision = loop.answered('```json\n{"name": "get_time", "arguments": {"zone": "CET"}}\n```')
    assert decision == RunTools((ToolCall("get_time", '{"zone": "CET"}', True),))
    loop.results(decision.calls, ["16:05"])
    assert loop.added[0].content == call_text("get_time", '{"zone":"CET"}')  # kept in the generic format
    assert loop.answered('{"time": "16:05"} is what I found.') == Speak()
    assert loop.answered("{") == Speak()  # a finished answer that never became a call is text
