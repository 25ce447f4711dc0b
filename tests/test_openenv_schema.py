"""Reading what an OpenEnv server sends, alone: each malformed part is refused with one message
saying what it is, and well-formed ones read as their values (pure functions, no server)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from corrgrpo_envs.integrations.openenv_remote import (
    TOKEN_ENV,
    RemoteEnvError,
    _BadAnswer,
    _oneline,
    _reason,
    _refused,
    _refused_status,
    _RefusedError,
    auth_headers,
    parse_urls,
)
from corrgrpo_envs.integrations.openenv_schema import (
    FLOAT32_MAX,
    _bounds,
    _checked,
    _components_in,
    _metadata,
    _number,
    _observation_text,
    _spec,
    _task_ids,
    _text_field,
    mcp_tool_call,
)


# ------------------------------------------------------------------ addresses and token
def test_server_addresses_read_as_http_base_urls():
    assert parse_urls("openenv://a:1, b:2/,") == ["http://a:1", "http://b:2"]
    assert parse_urls(["ws://c:3", "http://d:4"]) == ["http://c:3", "http://d:4"]
    with pytest.raises(ValueError, match=r"^not an OpenEnv server address: 'https://e:5' \(use openenv://HOST:PORT\)$"):
        parse_urls("https://e:5")
    with pytest.raises(ValueError, match="^no OpenEnv server in ' , '$"):
        parse_urls(" , ")


def test_the_token_comes_from_the_argument_else_the_environment(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert auth_headers() is None
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert auth_headers() == {"Authorization": "Bearer from-env"}
    assert auth_headers("given") == {"Authorization": "Bearer given"}
    with pytest.raises(ValueError, match="holds a line break"):
        auth_headers("a\r\nX-Injected: 1")


def test_a_refusal_says_whether_a_token_was_sent_and_is_found_behind_a_handshake_error():
    assert isinstance(_refused("http://a:1", 401, False), _RefusedError)
    assert "no token was given" in str(_refused("http://a:1", 401, False))
    assert "the token given was refused" in str(_refused("http://a:1", 403, True))
    cause = RuntimeError("handshake")
    cause.response = SimpleNamespace(status_code=403)
    wrapped = ConnectionError("could not connect")
    wrapped.__cause__ = cause
    assert _refused_status(wrapped) == 403
    assert _refused_status(ConnectionError("reset by peer")) is None


def test_a_fault_reads_as_one_line():
    assert _oneline("a\nb\x00c\x7f") == "a b c"
    assert _oneline("x" * 400, 10) == "x" * 10 + "..."
    too_big = Exception()
    too_big.sent = SimpleNamespace(code=1009)  # websockets' close frame: message too big
    assert _reason(too_big, 2048) == "an answer larger than env.max_observation_bytes (2048 bytes)"
    assert _reason(_BadAnswer("garbage\nhere"), 2048) == "garbage here"
    assert _reason(ConnectionResetError(), 2048) == "ConnectionResetError"
    assert _reason(OSError("no route"), 2048) == "OSError: no route"


# ------------------------------------------------------------------ numbers and specs
def test_a_number_float32_holds_passes_and_anything_else_says_why():
    assert _number(3, "w") == 3.0 and _number(-FLOAT32_MAX, "w") == -FLOAT32_MAX
    assert _number(math.inf, "low", allow_infinite=True) == math.inf
    for value, message in ((math.nan, "^w is nan$"), (math.inf, "^w is inf$"), (True, "^w is True, not a number$"),
                           ("1", "^w is '1', not a number$"),
                           (1e39, r"^w = 1e\+39 is beyond float32's range \(±3.4e\+38\); the env stores float32$"),
                           (1 << 2000, r"^w = an integer of 2001 bits is beyond float32's range")):
        with pytest.raises(ValueError, match=message):
            _number(value, "w")


def test_bounds_are_one_number_per_component_low_at_most_high():
    assert _bounds(["a", "b"], [0, -math.inf], [1, math.inf], "env") == ([0.0, -math.inf], [1.0, math.inf])
    with pytest.raises(ValueError, match=r"^env: reward_high has 1 values for the 2 components \['a', 'b'\]$"):
        _bounds(["a", "b"], [0, 0], [1], "env")
    with pytest.raises(ValueError, match="^env: component 'a' has reward_low 2 above reward_high 1$"):
        _bounds(["a"], [2], [1], "env")
    with pytest.raises(ValueError, match="^env: reward_low of 'a' is nan$"):
        _bounds(["a"], [math.nan], [1], "env")


def test_a_published_spec_is_a_list_of_named_components_with_defaults():
    assert _spec([{"name": "a", "low": 0, "high": 1, "weight": 2}, {"name": "b"}], "s") == [
        ("a", 0, 1, 2), ("b", -math.inf, math.inf, 1.0)]
    for malformed in ({"name": "a"}, [{"low": 0}], [{"name": 1}], ["a"], None):
        with pytest.raises(ValueError, match=r"^s: reward_components is not a list of \{name, low, high, weight\}$"):
            _spec(malformed, "s")


def test_a_task_listing_reads_as_string_ids():
    assert _task_ids({"tasks": [{"id": "t1"}, 2, "t3"]}) == ["t1", "2", "t3"]
    with pytest.raises(_BadAnswer, match="^a task listing without a list of tasks$"):
        _task_ids({"tasks": "t1"})
    with pytest.raises(_BadAnswer, match="^a task listing with a task True$"):
        _task_ids({"tasks": [True]})
    with pytest.raises(_BadAnswer, match=r"^a task listing with a task \{'name': 'x'\}$"):
        _task_ids({"tasks": [{"name": "x"}]})


# ------------------------------------------------------------------ resets and steps
def _result(observation=None, metadata=None, done=False):
    return SimpleNamespace(observation={"text": "hi"} if observation is None else observation,
                           metadata=metadata, done=done, reward=None)


def test_metadata_is_read_from_the_result_or_its_observation():
    assert _metadata(_result(metadata={"a": 1})) == {"a": 1}
    assert _metadata(_result(observation={"metadata": {"b": 2}})) == {"b": 2}
    assert _metadata(_result()) == {}
    with pytest.raises(_BadAnswer, match=r"^metadata that is not an object \(list\)$"):
        _metadata(_result(metadata=[1]))


def test_a_result_with_openenvs_types_passes_and_any_other_is_refused():
    good = _result(observation={"messages": [{"role": "user", "content": "hi"}], "tools": []})
    assert _checked(good) is good
    for bad, message in ((_result(observation="hi"), r"^an observation that is not an object \(str\)$"),
                         (_result(done="yes"), "^done = 'yes', not a boolean$"),
                         (_result(metadata="m"), r"^metadata that is not an object \(str\)$"),
                         (_result(observation={"messages": [{"role": 3}]}), "^messages that are not a conversation$")):
        with pytest.raises(_BadAnswer, match=message):
            _checked(bad)


def test_a_steps_named_components_come_first_from_reward_components():
    both = {"reward_components": {"a": 1.0}, "rubric_scores": {"b": 0.5}}
    assert _components_in(both) == ("metadata['reward_components']", {"a": 1.0})
    assert _components_in({"reward_components": {}, "rubric_scores": {"b": 0.5}}) == (
        "metadata['rubric_scores']", {"b": 0.5})
    assert _components_in({"reward_components": {}}) is None  # an empty map names nothing


# ------------------------------------------------------------- text and actions
def test_the_text_goes_into_the_actions_one_string_field():
    schema = {"properties": {"message": {"type": "string"}, "metadata": {"type": "object"}},
              "required": ["message", "metadata"]}
    assert _text_field(schema, "http://a:1") == "message"
    assert _text_field({"properties": {"text": {"type": "string"}}}, "http://a:1") == "text"
    two = {"properties": {"a": {"type": "string"}, "b": {"type": "string"}}}
    with pytest.raises(RemoteEnvError, match=r"^OpenEnv server http://a:1: cannot tell which action field takes "
                                             r"the text \(string fields: \['a', 'b'\]\); set action_field"):
        _text_field(two, "http://a:1")
    with pytest.raises(RemoteEnvError, match=r"\(string fields: none\)"):
        _text_field({"properties": {"n": {"type": "integer"}}}, "http://a:1")


def test_an_observation_reads_as_one_user_message():
    assert _observation_text({"text": "hi", "score": 2}, "text") == "hi"
    assert _observation_text({"text": "hi", "reward": 1, "done": False}, None) == "hi"
    assert _observation_text({"metadata": {"prompt": "p"}}, None) == "p"
    assert _observation_text({"a": "x", "b": [1, 2]}, None) == "a: x\nb: [1, 2]"


def test_a_tool_call_in_the_text_becomes_an_mcp_action():
    expected = {"type": "call_tool", "tool_name": "add", "arguments": {"x": 1}}
    assert mcp_tool_call('Sure. <tool_call>\n{"name": "add", "arguments": {"x": 1}}\n</tool_call>') == expected
    assert mcp_tool_call('{"name": "add", "parameters": {"x": 1}}') == expected
    assert mcp_tool_call('<tool_call>{"name": "add", "arguments": [1]}</tool_call>') is None
    assert mcp_tool_call("no call here") is None
