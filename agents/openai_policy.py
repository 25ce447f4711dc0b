"""Policies over OpenAI-compatible servers (vLLM, SGLang, hosted APIs).

:class:`OpenAIPolicy` sends conversations to chat completions: the result is text;
token ids and logprobs are filled in only when the server returns them (``logprobs``
in the OpenAI schema; ``prompt_token_ids`` and ``token_ids`` in vLLM's, requested
with ``extra_body={"return_token_ids": True}``).

:class:`CompletionsTokenPolicy` is token-exact: it renders prompts with the local
tokenizer (as every :class:`~corrgrpo.agents.token_policy.TokenPolicy`), sends the token ids
to vLLM's completions endpoint (``prompt`` as ids, ``logprobs``, ``return_token_ids``,
``return_tokens_as_token_ids``) and spreads the requests over one or more servers;
the episodes get exactly the sampled ids and their log-probabilities.

Both run requests concurrently (at most ``concurrency`` in flight per server) with a
timeout and retries with exponential backoff on timeouts, connection errors, 429 and
5xx; errors name the server's URL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from corrgrpo.agents.episode import Episode
from corrgrpo.agents.policy import Action, Policy, SamplingParams, check_batch
from corrgrpo.agents.token_policy import TokenPolicy
from corrgrpo.agents.toolcalls import render_hermes

__all__ = ["CompletionsTokenPolicy", "OpenAIPolicy", "OpenAIRequestError", "post_with_retries", "run_coroutine"]

_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIRequestError(RuntimeError):
    """A request failed for good (a client error, or every retry failed).

    ``url`` is the endpoint of the last attempt (the server to look at).
    """

    def __init__(self, message: str, url: str | None = None):
        super().__init__(message)
        self.url = url


def _check_client_args(concurrency: int, timeout: float, retries: int) -> None:
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0, got {timeout}")


async def post_with_retries(
    client: httpx.AsyncClient,
    targets: Sequence[tuple[str, asyncio.Semaphore]],
    body: Mapping[str, Any],
    parse: Callable[[Mapping[str, Any]], Any],
    *,
    retries: int,
    backoff: float,
) -> Any:
    """POST ``body`` and ``parse`` the JSON reply, retrying retryable failures.

    Attempt ``k`` goes to ``targets[k % len(targets)]`` (an endpoint URL and the gate that
    limits its requests in flight), so with several servers a retry moves to the next one.
    Timeouts, connection errors, 408/409/425/429/5xx and unparsable replies are retried
    after ``backoff * 2**(k-1)`` seconds; other HTTP errors raise at once.
    """
    last_error, url = "", targets[0][0]
    for attempt in range(retries + 1):
        if attempt:
            await asyncio.sleep(backoff * 2 ** (attempt - 1))
        url, gate = targets[attempt % len(targets)]
        async with gate:
            try:
                response = await client.post(url, json=dict(body))
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
                continue
        if response.status_code in _RETRY_STATUS:
            last_error = f"HTTP {response.status_code}: {response.text[:200]}"
            continue
        if response.status_code >= 400:
            raise OpenAIRequestError(f"HTTP {response.status_code} from {url}: {response.text[:500]}", url)
        try:
            return parse(response.json())
        except ValueError as exc:  # invalid JSON, or a reply that does not parse
            last_error = f"invalid reply: {exc}"
    raise OpenAIRequestError(f"{url} failed after {retries + 1} attempts: {last_error}", url)


def run_coroutine(factory: Callable[[], Any]) -> Any:
    """Run the coroutine ``factory()`` to completion from sync code, even inside a running loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # called from async code: a private loop
        return pool.submit(lambda: asyncio.run(factory())).result()


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
        _check_client_args(concurrency, timeout, retries)
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
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
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

    async def aact(self, observations: Sequence[dict], sampling: SamplingParams | None = None) -> list[Action]:
        """Like :meth:`act`, inside a running event loop."""
        sampling = sampling or SamplingParams()
        check_batch(observations, None)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        gate = asyncio.Semaphore(self.concurrency)
        limits = httpx.Limits(max_connections=self.concurrency)
        targets = [(self.url, gate)]
        async with httpx.AsyncClient(timeout=self.timeout, headers=headers, limits=limits) as client:
            return list(
                await asyncio.gather(*(
                    post_with_retries(client, targets, self.request_body(o, sampling), self.parse_response,
                                      retries=self.retries, backoff=self.backoff)
                    for o in observations
                ))
            )

    def act(
        self,
        observations: Sequence[dict],
        sampling: SamplingParams | None = None,
        episodes: Sequence[Episode] | None = None,
        **kwargs: Any,
    ) -> list[Action]:
        check_batch(observations, episodes)
        actions = run_coroutine(lambda: self.aact(observations, sampling))
        if episodes is not None:
            for episode, obs, action in zip(episodes, observations, actions):
                episode.turns.append(action)
                episode.messages = list(obs["messages"]) + [{"role": "assistant", "content": action.text}]
        return actions


def _completion_action(prompt: Sequence[int], data: Mapping[str, Any]) -> Action:
    """A token-exact :class:`Action` from a vLLM completions reply to a token-id prompt."""
    try:
        choice = data["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        logprobs_block = choice["logprobs"] or {}
        logprobs = [float(x) for x in logprobs_block["token_logprobs"]]
        tokens = list(logprobs_block.get("tokens") or [])
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ValueError(
            "completions reply without token_ids and logprobs (a vLLM server answers with them to "
            f"return_token_ids and logprobs): {str(data)[:200]}"
        ) from exc
    if len(logprobs) != len(ids):
        raise ValueError(f"{len(logprobs)} logprobs for {len(ids)} sampled tokens")
    # ``return_tokens_as_token_ids`` names each logprob's token as "token_id:<id>": the
    # logprobs belong to exactly the ids returned, in order
    named = [int(t.rpartition(":")[2]) for t in tokens if isinstance(t, str) and t.startswith("token_id:")]
    if tokens and named != ids:
        raise ValueError("the logprobs' tokens differ from the returned token_ids")
    echoed = choice.get("prompt_token_ids")
    if echoed is not None and [int(t) for t in echoed] != list(prompt):
        raise ValueError("the server changed the prompt's token ids")
    reason = choice.get("finish_reason")
    return Action(
        text=choice.get("text") or "",
        prompt_ids=list(prompt),
        completion_ids=ids,
        logprobs=logprobs,
        finish_reason="length" if reason == "length" else "stop",
        info={"stop_reason": choice.get("stop_reason")},
    )


def _prompt_logprobs(ids: Sequence[int], data: Mapping[str, Any]) -> list[float]:
    """The log-probability of each of ``ids[1:]`` given the ones before it, from a reply."""
    try:
        entries = data["choices"][0]["prompt_logprobs"]
        return [float(entry[str(int(t))]["logprob"]) for entry, t in zip(entries[1:], ids[1:], strict=True)]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ValueError(f"completions reply without prompt_logprobs: {str(data)[:200]}") from exc


class CompletionsTokenPolicy(TokenPolicy):
    """Token-exact sampling from one or more vLLM servers' completions endpoints.

    Prompts are rendered with ``tokenizer`` (the one the servers' model uses) and sent as
    token ids; the reply's ``token_ids`` and per-token ``logprobs`` go into the
    :class:`Action` unchanged (checked against ``return_tokens_as_token_ids``). Request
    ``i`` of a batch goes to server ``i % len(base_urls)`` and carries seed
    ``sampling.seed + i``, so a batch repeats exactly whichever servers answer; a retry
    moves to the next server. Start the servers with ``--logprobs-mode raw_logprobs`` so the
    logprobs are those of the raw logits, like every other policy's (see
    ``scripts/vllm_serve.sh``).

    Args:
        base_urls: the API roots, e.g. ``["http://10.0.0.2:8000/v1", "http://10.0.0.3:8000/v1"]``.
        model: the served model's name.
        tokenizer: a transformers tokenizer with a chat template.
        api_key: sent as a bearer token when given.
        concurrency: most requests in flight per server.
        timeout: seconds per request attempt.
        retries: extra attempts after a retryable failure (on the next server).
        backoff: first retry delay in seconds (doubles each attempt).
        extra_body: more fields for every request.
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        model: str,
        tokenizer: Any,
        api_key: str | None = None,
        concurrency: int = 8,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        extra_body: Mapping[str, Any] | None = None,
    ):
        super().__init__(tokenizer)
        if isinstance(base_urls, str):
            base_urls = [base_urls]
        if not base_urls:
            raise ValueError("base_urls: give at least one server")
        _check_client_args(concurrency, timeout, retries)
        self.base_urls = [u.rstrip("/") for u in base_urls]
        self.model = model
        self.api_key = api_key
        self.concurrency = concurrency
        self.timeout = float(timeout)
        self.retries = retries
        self.backoff = backoff
        self.extra_body = dict(extra_body or {})

    def request_body(self, prompt: Sequence[int], sampling: SamplingParams, seed: int | None) -> dict[str, Any]:
        """The JSON body that samples one completion of ``prompt`` (ids)."""
        greedy = sampling.temperature == 0.0
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": [int(t) for t in prompt],
            "max_tokens": int(sampling.max_new_tokens),
            "temperature": 0.0 if greedy else float(sampling.temperature),
            "top_p": 1.0 if greedy else float(sampling.top_p),
            "top_k": -1 if greedy else 0,  # no top-k whatever the server's defaults
            "n": 1,
            "logprobs": 0,  # the sampled token's logprob only
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "add_special_tokens": False,  # the ids are the whole context
            "skip_special_tokens": True,
        }
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if seed is not None:
            body["seed"] = int(seed)
        body.update(self.extra_body)
        return body

    def _client(self) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        limits = httpx.Limits(max_connections=self.concurrency * len(self.base_urls))
        return httpx.AsyncClient(timeout=self.timeout, headers=headers, limits=limits)

    async def _post_all(
        self, bodies: Sequence[dict[str, Any]], parses: Sequence[Callable[[Any], Any]],
        base_urls: Sequence[str] | None = None,
    ) -> list[Any]:
        """Body ``i`` to server ``i % n`` (retries on the next ones), replies parsed."""
        urls = list(base_urls or self.base_urls)
        endpoints = [(u + "/completions", asyncio.Semaphore(self.concurrency)) for u in urls]
        async with self._client() as client:
            return list(await asyncio.gather(*(
                post_with_retries(
                    client, endpoints[i % len(endpoints):] + endpoints[: i % len(endpoints)], body, parse,
                    retries=self.retries, backoff=self.backoff,
                )
                for i, (body, parse) in enumerate(zip(bodies, parses))
            )))

    def generate(self, prompts: Sequence[list[int]], sampling: SamplingParams) -> list[Action]:
        bodies = [
            self.request_body(p, sampling, None if sampling.seed is None else sampling.seed + i)
            for i, p in enumerate(prompts)
        ]
        parses = [lambda data, p=p: _completion_action(p, data) for p in prompts]
        return run_coroutine(lambda: self._post_all(bodies, parses))

    def score(self, token_ids: Sequence[int], server: int = 0) -> list[float]:
        """Log-probabilities of ``token_ids[1:]``, each given the ones before, under the
        weights that server ``server`` serves now (vLLM's ``prompt_logprobs``)."""
        ids = [int(t) for t in token_ids]
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 0, "add_special_tokens": False}
        parse = [lambda data: _prompt_logprobs(ids, data)]
        return run_coroutine(lambda: self._post_all([body], parse, [self.base_urls[server]]))[0]
