"""The ``server`` rollout engine: rollouts from ``vllm serve`` processes on other GPUs or machines.

Generation goes through vLLM's OpenAI-compatible completions endpoint with token-id
prompts (:class:`corrgrpo.agents.openai_policy.CompletionsTokenPolicy`), so episodes get exactly
the sampled ids and their log-probabilities; requests are spread over the servers.

After every optimizer step the trainer pushes its weights with vLLM's own endpoints
(servers started with ``VLLM_SERVER_DEV_MODE=1``, see ``scripts/vllm_serve.sh``): it
writes them as safetensors into a folder every server can read and, per server, pauses
generation (``/pause?mode=wait``), reloads the weights in place
(``/collective_rpc`` -> the workers' ``reload_weights(weights_path=...)``), drops the
prefix cache computed with the old weights (``/reset_prefix_cache``), records the
version (``/update_weight_version``) and resumes (``/resume``). The version tells a
restarted server (which serves the weights it was started with) from an up-to-date
one: after a failure the engine waits for the servers' ``/health``, pushes the current
weights to every server whose ``/weight_info`` differs, and generates the turn again
(``rollout.server.generation_retries`` times); then the run stops with an error naming
the server, its last checkpoint untouched.

With ``rollout.server.weight_sync=nccl`` (GPUs) the reload step is vLLM's NCCL weight
transfer instead: one NCCL group per server (the trainer's rank 0 and the server's
workers), opened with vLLM's ``NCCLTrainerWeightTransferEngine`` through the server's
``/init_weight_transfer_engine``, and each push broadcasts the tensors
(``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import torch

from corrgrpo.agents.openai_policy import CompletionsTokenPolicy, OpenAIRequestError
from corrgrpo.agents.policy import Action, SamplingParams
from corrgrpo.agents.token_policy import record_turns
from corrgrpo.trainer.engines import RolloutEngine

__all__ = ["RolloutServerError", "ServerEngine", "server_root"]

logger = logging.getLogger(__name__)

#: the environment variable holding the servers' ``--api-key`` (vLLM's own name for it)
API_KEY_ENV = "VLLM_API_KEY"


class RolloutServerError(RuntimeError):
    """A rollout server failed for good; ``url`` names it."""

    def __init__(self, message: str, url: str):
        super().__init__(message)
        self.url = url


def server_root(api_url: str) -> str:
    """The server's root (where ``/health`` and the weight endpoints are) from its API root."""
    url = api_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _distributed() -> tuple[int, int]:
    """This process's rank and the number of trainer processes."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _write_safetensors(state: dict[str, torch.Tensor], folder: Path) -> None:
    """``state`` as ``folder/model.safetensors``, written beside and renamed into place."""
    from safetensors.torch import save_file

    tensors, seen = {}, set()
    for name, tensor in state.items():
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if tensor.numel() and key in seen:
            continue  # a tied weight (lm_head = embed_tokens): the model loader re-ties it
        seen.add(key)
        tensors[name] = tensor.detach().to("cpu").contiguous()
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_file(tensors, str(partial / "model.safetensors"))
    partial.rename(folder)


def _weight_source(engine: ServerEngine) -> Any:
    """vLLM's ``WeightSource`` over the engine's latest full state dict, sent from this GPU
    (vLLM's classes are imported only for ``weight_sync=nccl``)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class StateDictSource(WeightSource):
        def metadata(self) -> list[Any]:
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in engine._state.items()]

        def __iter__(self) -> Any:
            device = torch.device("cuda", torch.cuda.current_device())
            for name, tensor in engine._state.items():
                yield name, tensor.to(device, non_blocking=True)

    return StateDictSource()


class ServerEngine(RolloutEngine):
    """Rollouts from one or more ``vllm serve`` processes; weights pushed after every step.

    ``rollout.server`` holds the servers' API roots, timeouts, retries and the weights
    folder (see :class:`corrgrpo.trainer.config.RolloutServerConfig`). The API key, if the servers
    need one, is read from ``$VLLM_API_KEY`` so that it is not saved with the run's config.
    """

    def __init__(self, model: Any, tokenizer: Any, cfg: Any):
        super().__init__(model, tokenizer, cfg)
        s = self.settings = cfg.rollout.server
        self.urls = [u.rstrip("/") for u in s.urls]
        self.rank, world = _distributed()
        if world > 1 and not s.weights_dir and s.weight_sync == "disk":
            raise ValueError(
                "rollout.server.weights_dir: with several trainer processes give a folder every "
                "process and server can read (the default temporary folder is per process)"
            )
        api_key = os.environ.get(API_KEY_ENV)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        deadline = time.monotonic() + s.startup_timeout
        for url in self.urls:
            self._wait_healthy(url, deadline, "startup_timeout")
        name = s.model or self._served_model(self.urls[0])
        self._policy = CompletionsTokenPolicy(
            self.urls, name, tokenizer, api_key=api_key, concurrency=s.concurrency,
            timeout=s.timeout, retries=s.retries,
        )
        self._own_dir = s.weights_dir is None
        self.weights_dir = Path(s.weights_dir or tempfile.mkdtemp(prefix="corrgrpo-server-weights-"))
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        self.version = 0
        self.last_push_seconds = 0.0
        self._state: dict[str, torch.Tensor] = {}
        self._nccl: dict[str, Any] = {}  # server -> vLLM's trainer-side NCCL engine
        self._nccl_groups = 0
        self.sync_weights(model)  # the servers may have started from other weights

    @property
    def policy(self) -> CompletionsTokenPolicy:
        return self._policy

    # ---------------------------------------------------------------- http
    def _request(self, url: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call to a server's root endpoint ``path``; errors name the server and the call."""
        target = server_root(url) + path
        try:
            response = httpx.request(method, target, headers=self._headers, timeout=self.settings.timeout, **kwargs)
        except httpx.HTTPError as exc:
            raise RolloutServerError(f"rollout server {url}: {method} {path} failed: {type(exc).__name__}: {exc}",
                                     url) from exc
        if response.status_code == 404 and path != "/health":
            raise RolloutServerError(
                f"rollout server {url} has no {path} endpoint: start it with VLLM_SERVER_DEV_MODE=1 "
                "(scripts/vllm_serve.sh does)", url,
            )
        if response.status_code >= 400:
            raise RolloutServerError(
                f"rollout server {url}: {method} {path} answered HTTP {response.status_code}: "
                f"{response.text[:500]}", url,
            )
        return response

    def _healthy(self, url: str) -> bool:
        try:
            timeout = min(5.0, self.settings.timeout)
            return httpx.get(server_root(url) + "/health", headers=self._headers, timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def _wait_healthy(self, url: str, deadline: float, key: str) -> None:
        while not self._healthy(url):
            if time.monotonic() > deadline:
                raise RolloutServerError(
                    f"rollout server {url} did not answer {server_root(url)}/health within "
                    f"rollout.server.{key}={getattr(self.settings, key):g} s", url,
                )
            time.sleep(0.5)

    def _served_model(self, url: str) -> str:
        data = self._request(url, "GET", "/v1/models").json()
        try:
            return str(data["data"][0]["id"])
        except (KeyError, IndexError, TypeError) as exc:
            raise RolloutServerError(f"rollout server {url} lists no model at /v1/models: {data}", url) from exc

    # ------------------------------------------------------------- weights
    @property
    def version_tag(self) -> str:
        """The weight version the servers should report (``/weight_info``)."""
        return f"corrgrpo-{self.weights_dir.name}-v{self.version}"

    def _folder(self, version: int) -> Path:
        return self.weights_dir / f"v{version}"

    def _folder_on_server(self, version: int) -> str:
        base = self.settings.server_weights_dir
        return str(Path(base) / f"v{version}") if base else str(self._folder(version).resolve())

    def served_version(self, url: str) -> str | None:
        """The weight version ``url`` reports."""
        return self._request(url, "GET", "/weight_info").json().get("weight_version")

    def _nccl_engine(self, url: str, reconnect: bool = False) -> Any:
        """vLLM's trainer-side NCCL engine for ``url`` (a new group after a server restart)."""
        if url in self._nccl and not reconnect:
            return self._nccl[url]
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        workers = int(self._request(url, "GET", "/get_world_size", params={"include_dp": "true"}).json()["world_size"])
        info = NCCLTrainerInitInfo(
            master_address=self.settings.nccl_address,
            master_port=self.settings.nccl_port + self._nccl_groups,  # a fresh port per group opened
            world_size=1 + workers,
            rank=0,
        )
        self._nccl_groups += 1
        client = HTTPVLLMWeightSyncClient(server_root(url), timeout=self.settings.timeout)
        self._nccl[url] = WeightTransferTrainerFactory.trainer_init(info, client=client, source=_weight_source(self))
        return self._nccl[url]

    def _push(self, url: str, restarted: bool = False) -> None:
        """Load the current weights into ``url``'s model, in place, between requests."""
        self._request(url, "POST", "/pause", params={"mode": "wait"})
        try:
            if self.settings.weight_sync == "nccl":
                self._nccl_engine(url, reconnect=restarted).send_weights()
            else:
                body = {"method": "reload_weights", "kwargs": {"weights_path": self._folder_on_server(self.version)}}
                self._request(url, "POST", "/collective_rpc", json=body)
            self._request(url, "POST", "/reset_prefix_cache")  # its KV blocks hold the old weights' keys
            self._request(url, "POST", "/update_weight_version", json={"new_version": self.version_tag})
        finally:
            self._request(url, "POST", "/resume")

    def _push_or_recover(self, url: str) -> None:
        """Push to ``url``; if that fails (and ``generation_retries`` allows), wait for the server
        to answer again and push once more; a server left behind stops the run."""
        try:
            self._push(url)
            return
        except RolloutServerError as exc:
            failure = exc
        if self.settings.generation_retries > 0:
            logger.warning("pushing weights to rollout server %s failed (%s); waiting for it", url, failure)
            try:
                self._wait_healthy(url, time.monotonic() + self.settings.recovery_timeout, "recovery_timeout")
                self._push(url, restarted=True)
                return
            except RolloutServerError as exc:
                failure = exc
        raise RolloutServerError(
            f"rollout server {server_root(url)} did not take the weights of version {self.version}: {failure}; "
            "the run stops with its last checkpoint intact: resume with train.resume=auto once the servers "
            "answer", server_root(url),
        ) from failure

    def sync_weights(self, model: Any) -> None:
        """Write the weights (rank 0) and reload them on every server; collective under FSDP."""
        from corrgrpo.trainer.fsdp import full_state_dict

        state = full_state_dict(model, rank0_only=True)  # a collective under FSDP
        self.version += 1
        if self.rank == 0:
            started = time.perf_counter()
            if self.settings.weight_sync == "nccl":
                self._state = state  # what the NCCL engines broadcast (_weight_source)
            else:
                _write_safetensors(state, self._folder(self.version))
            for url in self.urls:
                self._push_or_recover(url)
            shutil.rmtree(self._folder(self.version - 1), ignore_errors=True)
            self.last_push_seconds = time.perf_counter() - started
        if _distributed()[1] > 1:
            torch.distributed.barrier()  # every process samples only once the servers have them

    def _recover(self) -> None:
        """Wait for every server to answer; push the current weights to those that lag."""
        deadline = time.monotonic() + self.settings.recovery_timeout
        for url in self.urls:
            self._wait_healthy(url, deadline, "recovery_timeout")
            if self.served_version(url) != self.version_tag:
                if self.settings.weight_sync == "nccl" and self.rank != 0:
                    raise RolloutServerError(
                        f"rollout server {url} restarted; with rollout.server.weight_sync=nccl only trainer "
                        "rank 0 can push its weights: resume the run (train.resume=auto)", url,
                    )
                logger.warning("rollout server %s serves other weights (restarted?): pushing version %d",
                               url, self.version)
                self._push(url, restarted=True)

    # ------------------------------------------------------------ generate
    def _server_of(self, endpoint: str | None) -> str:
        """The root of the server an endpoint URL belongs to."""
        for url in self.urls:
            if endpoint and endpoint.startswith(url):
                return server_root(url)
        return server_root(endpoint or self.urls[0])

    def _generate(self, prompts: Sequence[list[int]], sampling: SamplingParams) -> list[Action]:
        attempts = self.settings.generation_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return self._policy.generate(prompts, sampling)
            except OpenAIRequestError as exc:
                failure: Exception = exc
                url = self._server_of(exc.url)
            if attempt < attempts:
                logger.warning("rollout server %s failed (%s); waiting for the servers, then generating "
                               "again (%d/%d)", url, failure, attempt, attempts - 1)
                try:
                    self._recover()
                    continue
                except RolloutServerError as exc:
                    failure, url = exc, server_root(exc.url)
            raise RolloutServerError(
                f"rollout server {url} failed: {failure} (generated {attempt} time(s), "
                f"rollout.server.generation_retries={attempts - 1}); the run stops before this step's "
                "update with its last checkpoint intact: resume with train.resume=auto once the servers "
                "answer", url,
            ) from failure
        raise AssertionError("unreachable")

    def generate(
        self,
        observations: Sequence[dict],
        sampling: SamplingParams,
        episodes: Sequence[Any] | None = None,
    ) -> list[Action]:
        """One turn per observation; a turn whose requests failed is generated again after
        the servers recover (same prompts and seeds, so the same samples)."""
        prompts = self._policy.prompt_ids(observations, episodes)  # extends the episodes' context once
        actions = self._generate(prompts, sampling) if prompts else []
        record_turns(episodes, actions)
        return actions

    def close(self) -> None:
        for nccl in self._nccl.values():
            nccl.shutdown()
        if self._own_dir and self.rank == 0:
            shutil.rmtree(self.weights_dir, ignore_errors=True)
