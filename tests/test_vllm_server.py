"""The ``server`` rollout backend against a real ``vllm serve`` (CPU build), started by
``scripts/vllm_serve.sh`` on a tiny random-init model saved to a temporary folder.

Runs in the vLLM environment (``scripts/vllm_venv.sh``)::

    .venv-vllm/bin/python -m pytest tests/test_vllm_server.py -q

One server is shared by the module's tests; a TCP relay in front of it plays a server that
dies (connections closed) or hangs (no answer), and a second URL for spreading requests.
Skips, with the reason, where vLLM is not importable.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from corrgrpo.agents.vllm_policy import vllm_available  # noqa: E402

AVAILABLE, WHY = vllm_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY)

import httpx  # noqa: E402
import torch  # noqa: E402

from corrgrpo.agents import Episode, SamplingParams, load_model  # noqa: E402
from corrgrpo.trainer.checkpoint import latest_checkpoint  # noqa: E402
from corrgrpo.trainer.config import config_from_dict  # noqa: E402
from corrgrpo.trainer.policy_forward import pack_episodes, token_logprobs  # noqa: E402
from corrgrpo.trainer.run_logger import read_metrics  # noqa: E402
from corrgrpo.trainer.server_engine import RolloutServerError  # noqa: E402
from corrgrpo.trainer.trainer import Trainer  # noqa: E402
from tests.ports import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``scripts/vllm_serve.sh`` with one CPU server of the tiny model; yields its API root."""
    folder = tmp_path_factory.mktemp("served")
    model, tokenizer = load_model("tiny")
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    port = free_port()
    env = {**os.environ, "PYTHON": sys.executable, "PORT": str(port), "NAME": "tiny", "DEVICE": "cpu",
           "LOG_DIR": str(folder / "logs"), "KV_CACHE_BYTES": str(128 * 2**20)}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its engine core as usual
    proc = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "vllm_serve.sh"), str(folder / "model"), "1", "--", "--max-model-len", "1024"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("ready:"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + 420
        while not ready.wait(1.0):
            if proc.poll() is not None or time.monotonic() > deadline:
                log = folder / "logs" / "server-0.log"
                tail = log.read_text()[-3000:] if log.exists() else ""
                pytest.fail(f"vllm_serve.sh did not get ready (exit code {proc.poll()}): {''.join(lines)}\n{tail}")
        assert f"rollout.server.urls=[http://127.0.0.1:{port}/v1]" in lines[-1]
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


class Relay:
    """A TCP relay to the server: ``mode`` is ``forward``, ``close`` (a dead server: every
    connection is closed at once) or ``hang`` (connections accepted, never answered)."""

    def __init__(self, target_url: str):
        host_port = target_url.split("//")[1].split("/")[0]
        self.target = (host_port.split(":")[0], int(host_port.split(":")[1]))
        self.mode = "forward"
        self.forwarded = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.open: list[socket.socket] = []
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.mode == "close":
                conn.close()
            elif self.mode == "hang":
                self.open.append(conn)
            else:
                self.forwarded += 1
                upstream = socket.create_connection(self.target)
                self.open += [conn, upstream]
                for a, b in ((conn, upstream), (upstream, conn)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.stopped = True
        self.sock.close()
        for s in self.open:
            s.close()


@pytest.fixture
def relay(server):
    r = Relay(server)
    yield r
    r.close()


def config(tmp_path: Path, urls: list[str], steps: int = 2, **server_options) -> dict:
    return {
        "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 16},
        "model": {"name_or_path": "tiny"},
        "algorithm": {"estimator": "corrgrpo", "group_size": 4, "prompts_per_step": 2},
        "rollout": {"max_new_tokens": 8, "backend": "server", "torch_threads": 1,
                    "server": {"urls": urls, "model": "tiny", **server_options}},
        "optim": {"lr": 1e-2},
        "train": {"steps": steps, "split": "all", "progress": False, "tensorboard": False,
                  "save_final": False, "output_dir": str(tmp_path / "run")},
    }


def trainer_logprobs(trainer: Trainer, ids: list[int]) -> torch.Tensor:
    """The trainer's log-probability of each of ``ids[1:]`` given the ones before it."""
    with torch.no_grad():
        logp = torch.log_softmax(trainer.unwrapped(torch.tensor([ids])).logits[0].float(), -1)
    return logp[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_train_through_servers_and_push_weights(server, relay, tmp_path):
    # two URLs (the server and the relay in front of it): requests are spread over both
    trainer = Trainer(config_from_dict(config(tmp_path, [server, relay.url])))
    before = {k: v.clone() for k, v in trainer.unwrapped.state_dict().items()}
    trainer.train()
    records = read_metrics(tmp_path / "run")
    assert len(records) == 2 and all(r["episodes"] == 8 for r in records)
    for r in records:  # the servers' sampled logprobs against the trainer's, every step
        assert 0 <= r["mismatch/abs_mean"] <= r["mismatch/max"] < 1e-4
    assert relay.forwarded > 0
    assert any(not torch.equal(before[k], v) for k, v in trainer.unwrapped.state_dict().items())

    # after the last push the server serves the trained weights: a fixed sequence scores the same
    ids = list(range(5, 45))
    served = torch.tensor(trainer.policy.score(ids))
    torch.testing.assert_close(served, trainer_logprobs(trainer, ids), atol=1e-4, rtol=0)
    assert trainer.engine.served_version(server) == trainer.engine.version_tag

    # token-exact: an episode holds exactly the sampled ids, scored like the trainer does
    obs = {"messages": [{"role": "user", "content": "write a short string: 3"}], "tools": []}
    ep = Episode()
    action = trainer.policy.act([obs], SamplingParams(temperature=1.0, max_new_tokens=8, seed=5), episodes=[ep])[0]
    assert ep.token_ids == action.prompt_ids + action.completion_ids
    assert action.prompt_ids == trainer.policy.renderer.first_prompt(obs)
    packed = pack_episodes([ep], trainer.pad_id, torch.device("cpu"))
    with torch.no_grad():
        logp, _ = token_logprobs(trainer.unwrapped, packed)
    torch.testing.assert_close(logp[0][packed.loss_mask[0].bool()], torch.tensor(action.logprobs), atol=1e-4, rtol=0)
    trainer.engine.close()


def test_overlapped_generation_through_the_server(server, tmp_path):
    """rollout.overlap with the server engine: step t+1 is sampled on the server while step t
    updates; one policy version stale after the first step; the server ends on the final weights."""
    cfg = config(tmp_path, [server], steps=3)
    cfg["algorithm"]["tis_cap"] = 2.0
    cfg["rollout"]["overlap"] = True
    trainer = Trainer(config_from_dict(cfg))
    trainer.train()
    records = read_metrics(tmp_path / "run")
    assert [r["overlap/staleness"] for r in records] == [0.0, 1.0, 1.0]
    assert records[0]["mismatch/max"] < 1e-4  # the first batch comes from the trainer's weights
    for r in records[1:]:
        assert r["mismatch/abs_mean"] > 1e-4, r["mismatch/abs_mean"]  # one update older
        assert 0 < r["tis/weight_mean"] <= 2.0
    ids = list(range(5, 45))
    served = torch.tensor(trainer.policy.score(ids))
    torch.testing.assert_close(served, trainer_logprobs(trainer, ids), atol=1e-4, rtol=0)
    assert trainer.engine.served_version(server) == trainer.engine.version_tag
    trainer.engine.close()


def test_dead_server_is_waited_for_and_gets_the_current_weights(server, relay, tmp_path, caplog):
    cfg = config_from_dict(config(tmp_path, [relay.url], steps=1, retries=0, generation_retries=1,
                                  recovery_timeout=60))
    trainer = Trainer(cfg)
    # the server "restarts": it reports other weights and the relay refuses it for 2 s
    httpx.post(server.rsplit("/v1", 1)[0] + "/update_weight_version", json={"new_version": "restarted"})
    relay.mode = "close"
    threading.Timer(2.0, lambda: setattr(relay, "mode", "forward")).start()
    with caplog.at_level(logging.WARNING, logger="corrgrpo.trainer.server_engine"):
        trainer.train()
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert f"rollout server {relay.url.rsplit('/v1', 1)[0]} failed" in messages and "pushing version" in messages
    assert len(read_metrics(tmp_path / "run")) == 1
    assert trainer.engine.served_version(server) == trainer.engine.version_tag
    ids = list(range(7, 30))
    torch.testing.assert_close(torch.tensor(trainer.policy.score(ids)), trainer_logprobs(trainer, ids), atol=1e-4, rtol=0)

    # a push that finds the server down waits for it and pushes again
    relay.mode = "close"
    threading.Timer(2.0, lambda: setattr(relay, "mode", "forward")).start()
    with caplog.at_level(logging.WARNING, logger="corrgrpo.trainer.server_engine"):
        trainer.engine.sync_weights(trainer.unwrapped)
    assert "pushing weights to rollout server" in caplog.text
    assert trainer.engine.served_version(server) == trainer.engine.version_tag
    trainer.engine.close()


def test_hanging_server_stops_the_run_with_its_checkpoint_intact(server, relay, tmp_path):
    cfg = config_from_dict(config(tmp_path, [relay.url], steps=2, timeout=1.0, retries=1,
                                  generation_retries=1, recovery_timeout=1.0))
    cfg.train.save_every = 1
    trainer = Trainer(cfg)
    save = trainer.save

    def save_then_hang(step: int):
        path = save(step)
        relay.mode = "hang"  # the server stops answering after the first checkpoint
        return path

    trainer.save = save_then_hang  # type: ignore[method-assign]
    root = relay.url.rsplit("/v1", 1)[0]
    with pytest.raises(RolloutServerError, match=f"rollout server {root} failed") as info:
        trainer.train()
    assert info.value.url == root and "train.resume=auto" in str(info.value)
    run = tmp_path / "run"
    assert latest_checkpoint(run) == run / "checkpoint-1" and not (run / "checkpoint-2").exists()
    assert len(read_metrics(run)) == 1
    trainer.engine.close()

    # the checkpoint is whole: the run resumes from it on a live server and finishes
    resumed = config(tmp_path, [server], steps=2)
    resumed["train"]["resume"] = "auto"
    again = Trainer(config_from_dict(resumed))
    assert again.start_step == 1
    again.train()
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    again.engine.close()
