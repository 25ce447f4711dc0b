"""A policy over any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, hosted APIs).

Requests run concurrently (at most ``concurrency`` in flight) with a timeout and
retries with exponential backoff on timeouts, connection errors, 429 and 5xx.
The result is text; token ids and logprobs are filled in only when the server
returns them (``logprobs`` in the OpenAI schema; ``prompt_token_ids`` and
``token_ids`` in vLLM's, requested with ``extra_body={"return_token_ids": True}``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from agents.episode import Episode
from agents.policy import Action, Policy, SamplingParams, check_batch
from agents.toolcalls import render_hermes

__all__ = ["OpenAIPolicy", "OpenAIRequestError"]

_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIRequestError(RuntimeError):
    """A request failed for good (a client error, or every retry failed)."""


def _tool_calls_text(message: Mapping[str, Any]) -> str:
    """Structured ``tool_calls`` of a server's reply as Hermes text, which the envs parse."""
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call)
        args = fn.get("arguments") or {}
        if isinstance(args, str):  # the OpenAI schema sends arguments JSON-encoded
            try:
                args = json.loads(args)
            except ValueError:
                pass  # keep the raw text: the env reports the malformed call
        calls.append({"name": fn.get("name", ""), "arguments": args})
    return render_hermes(calls) if calls else ""


class OpenAIPolicy(Policy):
    """Chat completions from an OpenAI-compatible server.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model's name.
        api_key: sent as a bearer token when given.
        concurrency: most requests in flight.
        timeout: seconds per request attempt.
        retries: extra attempts after a retryable failure.
        backoff: first retry delay in seconds (doubles each attempt).
        logprobs: ask for the sampled tokens' logprobs.
        extra_body: more fields for every request (e.g. ``{"return_token_ids": True}`` for vLLM).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        concurrency: int = 8,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        logprobs: bool = True,
        extra_body: Mapping[str, Any] | None = None,
    ):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.concurrency = concurrency
        self.timeout = float(timeout)
        self.retries = retries
        self.backoff = backoff
        self.logprobs = logprobs
        self.extra_body = dict(extra_body or {})

    def request_body(self, obs: dict, sampling: SamplingParams) -> dict[str, Any]:
        """The JSON body for one observation."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(m) for m in obs["messages"]],
            "temperature": float(sampling.temperature),
            "top_p": float(sampling.top_p),
            "max_tokens": int(sampling.max_new_tokens),
        }
        if obs.get("tools"):
            body["tools"] = list(obs["tools"])
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            body["seed"] = int(sampling.seed)
        if self.logprobs:
            body["logprobs"] = True
        body.update(self.extra_body)
        return body

    @staticmethod
    def parse_response(data: Mapping[str, Any]) -> Action:
        """An :class:`Action` from a chat-completions response."""
        try:
            choice = data["choices"][0]
            message = choice.get("message") or {}
        except (KeyError, IndexError, TypeError) as exc:
            raise OpenAIRequestError(f"malformed chat-completions response: {str(data)[:200]}") from exc
        text = message.get("content") or ""
        calls = _tool_calls_text(message)
        if calls:
            text = f"{text}\n{calls}" if text else calls
        logprobs = [float(t["logprob"]) for t in ((choice.get("logprobs") or {}).get("content") or [])]
        completion_ids = [int(t) for t in choice.get("token_ids") or []]
        prompt_ids = [int(t) for t in data.get("prompt_token_ids") or []]
        return Action(
            text=text,
            prompt_ids=prompt_ids,
            completion_ids=completion_ids,
            logprobs=logprobs,
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
            info={"finish_reason": choice.get("finish_reason"), "usage": data.get("usage")},
        )

    async def _post(self, client: httpx.AsyncClient, gate: asyncio.Semaphore, body: dict) -> Action:
        last_error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            async with gate:
                try:
                    response = await client.post(self.url, json=body)
                except (httpx.TimeoutException, httpx.TransportError) as exc:
                    last_error = f"{type(exc).__name__}: {exc}"
                    continue
            if response.status_code in _RETRY_STATUS:
                last_error = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            if response.status_code >= 400:
                raise OpenAIRequestError(f"HTTP {response.status_code} from {self.url}: {response.text[:500]}")
            try:
                return self.parse_response(response.json())
            except ValueError as exc:
                last_error = f"invalid JSON: {exc}"
        raise OpenAIRequestError(f"{self.url} failed after {self.retries + 1} attempts: {last_error}")

    async def aact(self, observations: Sequence[dict], sampling: SamplingParams | None = None) -> list[Action]:
        """Like :meth:`act`, inside a running event loop."""
        sampling = sampling or SamplingParams()
        check_batch(observations, None)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        gate = asyncio.Semaphore(self.concurrency)
        limits = httpx.Limits(max_connections=self.concurrency)
        async with httpx.AsyncClient(timeout=self.timeout, headers=headers, limits=limits) as client:
            return list(
                await asyncio.gather(*(self._post(client, gate, self.request_body(o, sampling)) for o in observations))
            )

    def act(
        self,
        observations: Sequence[dict],
        sampling: SamplingParams | None = None,
        episodes: Sequence[Episode] | None = None,
        **kwargs: Any,
    ) -> list[Action]:
        check_batch(observations, episodes)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            actions = asyncio.run(self.aact(observations, sampling))
        else:  # called from async code: run the batch on a private loop in a thread
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                actions = pool.submit(asyncio.run, self.aact(observations, sampling)).result()
        if episodes is not None:
            for episode, obs, action in zip(episodes, observations, actions):
                episode.turns.append(action)
                episode.messages = list(obs["messages"]) + [{"role": "assistant", "content": action.text}]
        return actions
