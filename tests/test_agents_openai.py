"""OpenAIPolicy against a scripted OpenAI-compatible server on 127.0.0.1: retries, timeouts, concurrency."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from corrgrpo.agents import Episode, OpenAIPolicy, OpenAIRequestError, SamplingParams, parse_hermes

#: Beyond a call's configured deadlines, how long a test waits for it (a loaded 2-core machine).
SLACK_S = 5.0


class ScriptedServer:
    """Serves /v1/chat/completions; ``script`` maps the n-th request (0-based) to a behaviour."""

    def __init__(self, script=None, delay: float = 0.0):
        self.script = script or {}
        self.delay = delay
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    n = len(server.requests)
                    server.requests.append({"body": body, "auth": self.headers.get("Authorization")})
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    behaviour = server.script.get(n, "ok")
                    # the behaviour under test: a slow model server (its answers, not the
                    # test's synchronisation, take this long)
                    if behaviour == "slow":
                        time.sleep(1.0)
                    time.sleep(server.delay)
                finally:
                    # done before the answer goes out: once the client has it, it may send the
                    # next request before this thread would get back to a count after the write
                    with server.lock:
                        server.in_flight -= 1
                if isinstance(behaviour, int):
                    self.send_response(behaviour)
                    self.end_headers()
                    self.wfile.write(b'{"error": "scripted"}')
                    return
                if self.path != "/v1/chat/completions":
                    self.send_response(404)
                    self.end_headers()
                    return
                reply = server.reply(body)
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @staticmethod
    def reply(body: dict) -> dict:
        question = body["messages"][-1]["content"]
        message: dict = {"role": "assistant", "content": f"echo: {question}"}
        if body.get("tools"):
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "1", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"q": question})}}
                ],
            }
        choice = {"index": 0, "message": message, "finish_reason": "length" if body["max_tokens"] < 3 else "stop"}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": "e", "logprob": -0.5}, {"token": "cho", "logprob": -0.25}]}
        return {"id": "x", "object": "chat.completion", "choices": [choice], "usage": {"completion_tokens": 2}}

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def obs(text: str, tools=None) -> dict:
    return {"messages": [{"role": "user", "content": text}], "tools": tools or []}


def test_request_and_response_mapping():
    with ScriptedServer() as server:
        policy = OpenAIPolicy(server.url, "m", api_key="sk-test", retries=0)
        sampling = SamplingParams(temperature=0.5, top_p=0.9, max_new_tokens=7, stop=["END"], seed=4)
        episodes = [Episode(), Episode()]
        tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
        a, b = policy.act([obs("hello"), obs("weather?", tools)], sampling, episodes=episodes)
    body = server.requests[0]["body"]
    assert body["model"] == "m" and body["temperature"] == 0.5 and body["top_p"] == 0.9
    assert body["max_tokens"] == 7 and body["stop"] == ["END"] and body["seed"] == 4 and body["logprobs"] is True
    assert server.requests[0]["auth"] == "Bearer sk-test"
    assert a.text == "echo: hello" and a.logprobs == [-0.5, -0.25] and a.finish_reason == "stop"
    # structured tool calls come back as Hermes text, which the envs parse
    parsed = parse_hermes(b.text)
    assert parsed.ok and parsed.tool_calls[0].name == "lookup" and parsed.tool_calls[0].arguments == {"q": "weather?"}
    assert episodes[0].turns == [a] and episodes[0].messages[-1] == {"role": "assistant", "content": "echo: hello"}


def test_retries_server_errors_then_succeeds():
    with ScriptedServer(script={0: 500, 1: 429, 2: 503}) as server:
        policy = OpenAIPolicy(server.url, "m", retries=3, backoff=0.01)
        (action,) = policy.act([obs("x")], SamplingParams(max_new_tokens=2))
    assert len(server.requests) == 4 and action.text == "echo: x" and action.finish_reason == "length"


def test_gives_up_after_retries_and_does_not_retry_client_errors():
    with ScriptedServer(script={i: 500 for i in range(10)}) as server:
        with pytest.raises(OpenAIRequestError, match="3 attempts"):
            OpenAIPolicy(server.url, "m", retries=2, backoff=0.01).act([obs("x")])
        assert len(server.requests) == 3
    with ScriptedServer(script={0: 400}) as server:
        with pytest.raises(OpenAIRequestError, match="HTTP 400"):
            OpenAIPolicy(server.url, "m", retries=5, backoff=0.01).act([obs("x")])
        assert len(server.requests) == 1


def test_timeout_is_retried():
    timeout, retries, backoff = 0.3, 1, 0.01
    with ScriptedServer(script={0: "slow"}) as server:
        start = time.perf_counter()
        (action,) = OpenAIPolicy(server.url, "m", timeout=timeout, retries=retries, backoff=backoff).act([obs("y")])
        elapsed = time.perf_counter() - start
    # Two requests: the first was given up at its timeout (waiting for its slow answer would
    # have taken that answer, one request). The call ends by its deadlines, every attempt's
    # timeout and backoff, plus slack for a loaded machine (a hang would take minutes).
    assert action.text == "echo: y" and len(server.requests) == 2
    assert elapsed < (retries + 1) * (timeout + backoff) + SLACK_S, elapsed


def test_concurrency_limit_holds_and_order_is_kept():
    with ScriptedServer(delay=0.1) as server:
        policy = OpenAIPolicy(server.url, "m", concurrency=3)
        start = time.perf_counter()
        actions = policy.act([obs(str(i)) for i in range(9)])
        elapsed = time.perf_counter() - start
    assert [a.text for a in actions] == [f"echo: {i}" for i in range(9)]
    assert server.max_in_flight == 3
    assert elapsed >= 0.3  # 9 requests, 3 at a time, 0.1 s each (a lower bound: load only adds)


def test_act_inside_a_running_event_loop():
    import asyncio

    with ScriptedServer() as server:
        policy = OpenAIPolicy(server.url, "m")

        async def main():
            return policy.act([obs("a")]), await policy.aact([obs("b")])

        sync_actions, async_actions = asyncio.run(main())
    assert sync_actions[0].text == "echo: a" and async_actions[0].text == "echo: b"


def test_bad_arguments():
    with pytest.raises(ValueError):
        OpenAIPolicy("http://127.0.0.1:1/v1", "m", concurrency=0)
    with pytest.raises(ValueError):
        OpenAIPolicy("http://127.0.0.1:1/v1", "m", retries=-1)
    with pytest.raises(OpenAIRequestError, match="malformed"):
        OpenAIPolicy.parse_response({"choices": []})
