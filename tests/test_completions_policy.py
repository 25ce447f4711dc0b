"""CompletionsTokenPolicy (the ``server`` rollout backend's client) against scripted vLLM-style
completions servers on 127.0.0.1: request fields, token-exact replies, spreading, failover.

The same client against a real ``vllm serve`` is in ``tests/test_vllm_server.py``.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from corrgrpo.agents import (
    CompletionsTokenPolicy,
    Episode,
    OpenAIRequestError,
    SamplingParams,
    load_model,
)


class CompletionsServer:
    """Answers /v1/completions like vLLM: three sampled ids after the prompt's last one."""

    def __init__(self, lie: bool = False):
        self.bodies: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.bodies.append(body)
                last = body["prompt"][-1]
                ids = [last + 1, last + 2, last + 3]
                tokens = [f"token_id:{t + (1 if lie else 0)}" for t in ids]
                choice = {"index": 0, "text": "abc", "finish_reason": "length", "token_ids": ids,
                          "prompt_token_ids": body["prompt"],
                          "logprobs": {"token_logprobs": [-0.5, -1.0, -1.5], "tokens": tokens}}
                data = json.dumps({"choices": [choice]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def tokenizer():
    return load_model("tiny")[1]


def test_token_ids_in_and_out_spread_over_servers(tokenizer):
    with CompletionsServer() as a, CompletionsServer() as b:
        policy = CompletionsTokenPolicy([a.url, b.url], "m", tokenizer, retries=0)
        obs = [{"messages": [{"role": "user", "content": f"hi {i}"}], "tools": []} for i in range(4)]
        episodes = [Episode() for _ in obs]
        actions = policy.act(obs, SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=3, seed=10),
                             episodes=episodes)
    assert len(a.bodies) == len(b.bodies) == 2  # request i went to server i % 2
    body = next(b for b in a.bodies if b["seed"] == 10)  # request 0 (arrival order is not fixed)
    assert body["prompt"] == policy.renderer.first_prompt(obs[0])
    assert body["logprobs"] == 0 and body["return_token_ids"] and body["return_tokens_as_token_ids"]
    assert body["add_special_tokens"] is False and body["temperature"] == 0.7 and body["max_tokens"] == 3
    assert sorted(x["seed"] for x in a.bodies + b.bodies) == [10, 11, 12, 13]
    for ep, action in zip(episodes, actions):
        last = action.prompt_ids[-1]
        assert action.completion_ids == [last + 1, last + 2, last + 3] and action.logprobs == [-0.5, -1.0, -1.5]
        assert action.finish_reason == "length"
        assert ep.token_ids == action.prompt_ids + action.completion_ids and ep.loss_mask[-3:] == [1, 1, 1]


def test_logprobs_of_other_tokens_are_an_error_naming_the_server(tokenizer):
    with CompletionsServer(lie=True) as server:
        policy = CompletionsTokenPolicy([server.url], "m", tokenizer, retries=1, backoff=0.01)
        with pytest.raises(OpenAIRequestError, match="differ from the returned token_ids") as info:
            policy.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3))
    assert info.value.url == server.url + "/completions" and server.url in str(info.value)


def test_a_dead_server_fails_over_to_the_next(tokenizer):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"  # nothing listens there
    with CompletionsServer() as live:
        policy = CompletionsTokenPolicy([dead, live.url], "m", tokenizer, retries=1, backoff=0.01)
        actions = policy.generate([[5], [6]], SamplingParams(max_new_tokens=3))
        assert [a.completion_ids for a in actions] == [[6, 7, 8], [7, 8, 9]] and len(live.bodies) == 2
        with pytest.raises(OpenAIRequestError, match=f"{dead}/completions failed after 1 attempts"):
            CompletionsTokenPolicy([dead], "m", tokenizer, retries=0).generate([[5]], SamplingParams())
