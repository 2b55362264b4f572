"""Tool calls as text and as a grammar (model/chat/tools.py, model/decoding/grammar.py `compile_tools`), without a
model: the generic prompt format, reading calls back from a growing answer, the stream's fragments, and the grammar
engine (llguidance over a byte vocabulary) accepting a valid call and refusing a wrong name or argument type."""

from __future__ import annotations

import json

import llguidance
import pytest

from model.adapters.sampler_backend import SamplerBackend
from model.chat import ChatMessage
from model.chat.engine import DiffusionChatModel
from model.chat.tools import (
    INSTRUCTION,
    Function,
    ToolCall,
    call_text,
    opens_calls,
    read_calls,
    renders_tools,
    split_offer,
    structured_chat,
    system_with_tools,
    tool_object,
    tools_text,
)
from model.decoding.grammar import GrammarError, compile_tools
from model.decoding.options import ToolConstraint
from model.decoding.sampler import SamplerConfig
from model.errors import ModelError
from model.server.answer import ToolCallDeltas
from model.server.config import ServerConfig
from model.server.inputs import ApiError, chat_messages, tools_of
from model.server.protocol import ChatCompletionRequest
from scripts.report_lib.tiny_models import ScriptedDenoiser, byte_tokenizer

WEATHER = json.dumps({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                      "required": ["city"], "additionalProperties": False}, separators=(",", ":"))
TIME = '{"type":"object","properties":{"zone":{"type":"string"}},"required":["zone"]}'


class ByteVocabulary:
    """Printable ASCII and newline, one token per byte, EOS 0: in the shape `llguidance.TokenizerWrapper` wraps."""

    eos_token_id = 0
    bos_token_id = None
    special_token_ids = (0,)

    def __init__(self) -> None:
        self.tokens = [b"<eos>", *(bytes([c]) for c in range(32, 127)), b"\n"]

    def __call__(self, text: bytes) -> list[int]:
        return [self.tokens.index(bytes([byte])) for byte in text]


VOCABULARY = ByteVocabulary()
TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(VOCABULARY))


def matches(constraint: ToolConstraint, text: str) -> bool:
    """The grammar takes all of `text` and may end there."""
    matcher = llguidance.LLMatcher(TOKENIZER, compile_tools(constraint), log_level=0)
    ids = VOCABULARY(text.encode())
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


def test_the_prompt_lists_the_functions_as_compact_json() -> None:
    text = tools_text([Function("get_weather", "The weather in a city", WEATHER)])
    first, second = text.split("\n")
    assert "<tool_call>" in first and "role tool" in first
    assert json.loads(second) == {"name": "get_weather", "description": "The weather in a city",
                                  "parameters": json.loads(WEATHER)}
    assert " " not in second.replace("The weather in a city", "")


def test_calls_are_written_in_the_generic_format() -> None:
    assert call_text("get_weather", '{"city": "Paris"}') == (
        '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>')


def test_calls_are_read_back_and_a_growing_call_only_grows() -> None:
    answer = call_text("get_weather", '{"city":"Paris"}') + call_text("get_time", '{"zone":"CET"}')
    assert opens_calls(answer) and not opens_calls("It is sunny.")
    assert read_calls(answer) == [ToolCall("get_weather", '{"city":"Paris"}', True),
                                  ToolCall("get_time", '{"zone":"CET"}', True)]
    previous: list[ToolCall] = []
    for end in range(len(answer) + 1):
        calls = read_calls(answer[:end])
        for old, new in zip(previous, calls, strict=False):
            assert new.name == old.name and new.arguments.startswith(old.arguments), answer[:end]
        assert len(calls) >= len(previous)
        previous = calls
    assert read_calls(answer[: answer.index("}}")])[0] == ToolCall("get_weather", '{"city":"Paris"', False)


def test_stream_fragments_assemble_into_the_calls() -> None:
    answer = call_text("get_weather", '{"city":"Paris","days":2}') + call_text("get_time", '{"zone":"CET"}')
    deltas = ToolCallDeltas()
    assembled: dict[int, dict[str, str]] = {}
    for end in range(0, len(answer) + 1, 3):
        for fragment in deltas.feed(answer[:end]):
            call = assembled.setdefault(fragment["index"], {"id": "", "name": "", "arguments": ""})
            call["id"] += fragment.get("id", "")
            call["name"] += fragment["function"].get("name", "")
            call["arguments"] += fragment["function"]["arguments"]
    for fragment in deltas.feed(answer):
        assembled[fragment["index"]]["arguments"] += fragment["function"]["arguments"]
    assert [(c["name"], c["arguments"]) for c in assembled.values()] == [
        ("get_weather", '{"city":"Paris","days":2}'), ("get_time", '{"zone":"CET"}')]
    assert all(c["id"].startswith("call_") for c in assembled.values()) and len(set(deltas.ids)) == 2


REQUIRED = ToolConstraint((("get_weather", WEATHER), ("get_time", TIME)), required=True)


def test_the_grammar_accepts_a_valid_call() -> None:
    assert matches(REQUIRED, call_text("get_weather", '{"city":"Paris","days":3}'))
    assert matches(REQUIRED, call_text("get_time", '{"zone":"CET"}'))


@pytest.mark.parametrize("text", [
    '<tool_call>{"name":"get_news","arguments":{"city":"Paris"}}</tool_call>',  # a name not offered
    '<tool_call>{"name":"get_weather","arguments":{"city":3}}</tool_call>',  # a number for a string
    '<tool_call>{"name":"get_weather","arguments":{"city":"Paris","days":"two"}}</tool_call>',
    '<tool_call>{"name":"get_weather","arguments":{"days":2}}</tool_call>',  # a required argument missing
    "It is sunny.",  # free text where a call is required
])
def test_the_required_grammar_refuses_what_is_not_a_valid_call(text: str) -> None:
    assert not matches(REQUIRED, text)


def test_auto_allows_free_text_or_calls_but_not_a_broken_call() -> None:
    auto = ToolConstraint((("get_weather", WEATHER),), required=False)
    assert matches(auto, "It is sunny in Paris.\nEnjoy!")
    assert matches(auto, call_text("get_weather", '{"city":"Paris"}'))
    assert not matches(auto, '<tool_call>{"name":"get_time","arguments":{}}</tool_call>')


def test_parallel_calls_only_when_asked() -> None:
    two = call_text("get_weather", '{"city":"Paris"}') + call_text("get_time", '{"zone":"CET"}')
    assert matches(REQUIRED, two)
    single = ToolConstraint(REQUIRED.tools, required=True, parallel=False)
    assert matches(single, two[: two.index("</tool_call>") + len("</tool_call>")])
    assert not matches(single, two)


def test_a_malformed_parameters_schema_names_the_function() -> None:
    bad = ToolConstraint((("get_weather", '{"type":"object","properties":{"city":{"type":"strin"}}}'),), True)
    with pytest.raises(GrammarError, match="get_weather"):
        compile_tools(bad)


def request(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", **fields})


def test_a_conversation_with_tools_is_written_in_the_generic_format() -> None:
    body = request(
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": json.loads(WEATHER)}}])
    offered, constraint = tools_of(body)
    assert constraint == ToolConstraint((("get_weather", WEATHER),), required=False, parallel=True)
    messages = chat_messages(body, ServerConfig(), offered)
    assert messages == (ChatMessage("system", "Be brief.\n\n" + tools_text(offered)),
                        ChatMessage("user", "Weather in Paris?"),
                        ChatMessage("assistant", call_text("get_weather", '{"city":"Paris"}')),
                        ChatMessage("tool", "18 C"))


def test_tool_choice_none_offers_nothing_and_a_name_narrows_the_grammar() -> None:
    tools = [{"type": "function", "function": {"name": name, "parameters": json.loads(TIME)}}
             for name in ("get_time", "get_date")]
    messages = [{"role": "user", "content": "Hi"}]
    assert tools_of(request(messages=messages, tools=tools, tool_choice="none")) == ((), None)
    _, named = tools_of(request(messages=messages, tools=tools, parallel_tool_calls=False,
                                tool_choice={"type": "function", "function": {"name": "get_date"}}))
    assert named is not None and [name for name, _ in named.tools] == ["get_date"]
    assert named.required and not named.parallel
    with pytest.raises(ApiError) as caught:
        chat_messages(request(messages=[*messages, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]),
                      ServerConfig(), ())
    assert caught.value.param == "messages.1.tool_call_id"


def test_the_offer_is_read_back_from_the_system_message() -> None:
    functions = (Function("get_weather", "The weather in a city", WEATHER), Function("get_time", "", TIME))
    assert split_offer(system_with_tools("Be brief.", functions)) == ("Be brief.", functions)
    assert split_offer(system_with_tools(None, functions)) == (None, functions)
    assert split_offer("Be brief.") == ("Be brief.", ())


def test_a_chat_in_the_generic_format_reads_back_as_openai_messages() -> None:
    functions = (Function("get_weather", "The weather in a city", WEATHER),)
    chat = [ChatMessage("system", system_with_tools("Be brief.", functions)), ChatMessage("user", "Paris and Rome?"),
            ChatMessage("assistant", call_text("get_weather", '{"city": "Paris"}') + call_text("get_weather",
                                                                                               '{"city":"Rome"}')),
            ChatMessage("tool", "18 C"), ChatMessage("tool", "24 C"), ChatMessage("assistant", "Warm.")]
    wire, offered = structured_chat(chat)
    assert offered == functions
    assert wire[0] == {"role": "system", "content": "Be brief."}
    calls = wire[2]["tool_calls"]
    assert wire[2]["content"] is None and [c["function"]["arguments"] for c in calls] == ['{"city":"Paris"}',
                                                                                          '{"city":"Rome"}']
    assert [m["tool_call_id"] for m in wire[3:5]] == [c["id"] for c in calls] and len({c["id"] for c in calls}) == 2
    assert wire[5] == {"role": "assistant", "content": "Warm."}
    assert structured_chat(chat)[0] == wire  # the same ids for the same chat
    with pytest.raises(ModelError, match="answers no"):
        structured_chat([ChatMessage("user", "Hi"), ChatMessage("tool", "18 C")])


# Qwen2.5's chat template, abridged (its default system text dropped): the functions inside <tools></tools> in the
# system message, a call as <tool_call> with spaced JSON, results in a user turn's <tool_response>.
QWEN_STYLE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    "For each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant{% if message.content %}\n{{ message.content }}"
    "{% endif %}{%- for tool_call in message.tool_calls %}{%- set tool_call = tool_call.function %}"
    '\n<tool_call>\n{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
# SmolLM2's: no tools variable, so the generic format stays in the messages
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
          " + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def chat_model_with_template(template: str) -> DiffusionChatModel:
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = template
    config = SamplerConfig(4, 4)
    return DiffusionChatModel("tiny", tokenizer, SamplerBackend("tiny", ScriptedDenoiser([1]), config), config)


def prompt_text(model: DiffusionChatModel, messages: list[ChatMessage], system: str | None = None) -> str:
    return model.tokenizer.decode(model.prompt_ids(messages, system))


def test_a_template_that_renders_tools_gets_the_offer_calls_and_results_as_its_own() -> None:
    assert renders_tools(QWEN_STYLE) and not renders_tools(CHATML) and not renders_tools(None)
    functions = [Function("get_weather", "The weather in a city", WEATHER)]
    chat = [ChatMessage("user", "Weather in Paris?"), ChatMessage("assistant", call_text("get_weather",
                                                                                        '{"city":"Paris"}')),
            ChatMessage("tool", "18 C")]
    text = prompt_text(chat_model_with_template(QWEN_STYLE), chat, system_with_tools("Be brief.", functions))
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n<tools>")
    assert f"<tools>{json.dumps(tool_object(functions[0]))}" in text  # the template's own JSON (spaced), not ours
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n18 C\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant")
    assert INSTRUCTION not in text  # the generic offer is gone: the template wrote its own
    plain = prompt_text(chat_model_with_template(QWEN_STYLE), [ChatMessage("user", "Hi")])
    assert plain == "<|im_start|>user\nHi<|im_end|><|im_start|>assistant"  # no tools offered, none rendered


def test_a_template_without_tools_keeps_the_generic_format() -> None:
    functions = [Function("get_weather", "The weather in a city", WEATHER)]
    chat = [ChatMessage("user", "Weather?"), ChatMessage("assistant", call_text("get_weather", '{"city":"Rome"}')),
            ChatMessage("tool", "24 C")]
    text = prompt_text(chat_model_with_template(CHATML), chat, system_with_tools(None, functions))
    assert text.startswith(f"<|im_start|>system\n{INSTRUCTION}\n")
    assert '<|im_start|>assistant\n<tool_call>{"name":"get_weather","arguments":{"city":"Rome"}}</tool_call>' in text
    assert "<|im_start|>tool\n24 C<|im_end|>" in text
