"""A fault soak: a run over three OpenEnv servers while an injector breaks them, for minutes.

Three ``corrgrpo serve`` apps of the toy env (each able to lie on command, see
``tests/openenv_soak_app.py``) sit behind byte-level proxies (``tests/fault_proxy.py``).
An injector thread, seeded, keeps breaking one or two of them at a time: it kills and
restarts server processes, stops them (SIGSTOP: sockets open, nothing answers), makes
their proxies stall, trickle, send garbage or cut connections, and makes the servers send
NaN, infinite, float32-overflowing or renamed components and oversize observations.

What must hold, step after step: every step comes back within a deadline (never a hang)
with the rewards the in-process env gives for the same actions (bit for bit, so nothing
non-finite or invented is ever trained on, and no episode is lost or counted twice), or
the run stops with one clear :class:`RemoteEnvError`; the replay log names the failovers.
``corrgrpo train`` over the same servers under the same injector either finishes its
steps or exits non-zero with one ``error:`` line, within its deadline.

``CORRGRPO_SOAK_S`` sets the vector soak's length: 60 s in the suite (about 15 injected
faults or more, each server broken several times), ``CORRGRPO_SOAK_S=900`` for a long soak
before a release.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed (pip install -e '.[openenv]')")

from corrgrpo_envs.integrations.openenv_client import RemoteEnvError  # noqa: E402
from corrgrpo_envs.vector import GroupedVectorEnv  # noqa: E402
from tests.fault_proxy import FaultProxy  # noqa: E402
from tests.openenv_servers import ROOT, Server, free_port  # noqa: E402

pytestmark = pytest.mark.slow

TOY = "corrgrpo/ScaleDominance-v0"
TASKS = ["prompt-0001", "prompt-0002", "prompt-0003", "prompt-0004"]
ACTIONS = ["a 1", "bb 22", "cat 333", "a", "12", "banana 1", "zz 9", "aa"]
NETWORK_FAULTS = ("stall", "trickle", "garbage", "refuse")
LIES = ("nan", "inf", "huge", "renamed", "oversize")
PROCESS_FAULTS = ("kill", "pause")
SOAK_S = float(os.environ.get("CORRGRPO_SOAK_S", "60"))
STEP_DEADLINE_S = 60.0


class SoakServer:
    """One lying-capable server process behind its fault proxy."""

    def __init__(self, tmp: Path, index: int):
        self.control = tmp / f"control-{index}"
        self.control.write_text("")
        port = free_port()
        argv = [sys.executable, "-m", "uvicorn", "tests.openenv_soak_app:app", "--factory",
                "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
        self.server = Server(argv, port, tmp / f"soak-{index}.log", env={"SOAK_CONTROL": str(self.control)})
        self.proxy: FaultProxy | None = None
        self.fault = ""

    def start(self) -> None:
        self.server.start()
        self.proxy = FaultProxy(self.server.port, trickle_s=1.0, seed=self.server.port)

    def break_(self, fault: str) -> None:
        assert self.proxy is not None
        self.fault = fault
        if fault == "kill":
            self.server.kill()
        elif fault == "pause":
            self.server.pause()
        elif fault in NETWORK_FAULTS:
            self.proxy.set_mode(fault)
        else:
            self.control.write_text(fault)

    def heal(self) -> None:
        assert self.proxy is not None
        fault, self.fault = self.fault, ""
        if fault == "kill":
            self.server.start()
        elif fault == "pause":
            self.server.resume()
        elif fault in NETWORK_FAULTS:
            self.proxy.set_mode("pass")
        else:
            self.control.write_text("")

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        self.server.stop()


class Injector(threading.Thread):
    """Breaks at most ``max_broken`` servers at a time, each for 2-6 s, every 1-3 s; logs what it did."""

    def __init__(self, servers: list[SoakServer], seed: int, max_broken: int = 2,
                 faults: tuple[str, ...] = NETWORK_FAULTS + LIES + PROCESS_FAULTS):
        super().__init__(name="fault-injector", daemon=True)
        self.servers, self.max_broken, self.faults = servers, max_broken, faults
        self.random = random.Random(seed)
        self.stopping = threading.Event()
        self.events: list[tuple[float, str, int, str]] = []
        self.counts: dict[str, int] = {}
        self.t0 = time.monotonic()

    def _log(self, what: str, index: int, fault: str) -> None:
        self.events.append((round(time.monotonic() - self.t0, 1), what, index, fault))

    def run(self) -> None:
        heal_at: dict[int, float] = {}
        while not self.stopping.wait(self.random.uniform(1.0, 3.0)):
            now = time.monotonic()
            for i, when in list(heal_at.items()):
                if when <= now:
                    self._log("heal", i, self.servers[i].fault)
                    self.servers[i].heal()
                    del heal_at[i]
            healthy = [i for i in range(len(self.servers)) if i not in heal_at]
            if len(heal_at) < self.max_broken and healthy:
                i = self.random.choice(healthy)
                fault = self.random.choice(self.faults)
                self.servers[i].break_(fault)
                self.counts[fault] = self.counts.get(fault, 0) + 1
                self._log("break", i, fault)
                heal_at[i] = now + self.random.uniform(2.0, 6.0)
        for i in heal_at:
            self._log("heal", i, self.servers[i].fault)
            self.servers[i].heal()


def _expected() -> np.ndarray:
    with GroupedVectorEnv(TOY, num_groups=4, group_size=2, split="all") as venv:
        venv.reset(task_ids=TASKS)
        return venv.step(ACTIONS)[1]


def _within(deadline: float, fn, what: str):
    """``fn()`` in a thread; a call that has not returned after ``deadline`` seconds is a hang."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(deadline)
    if worker.is_alive():
        pytest.fail(f"{what} did not return within {deadline:.0f} s (a hang)")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


@pytest.fixture
def soak_servers(tmp_path):
    servers = [SoakServer(tmp_path, i) for i in range(3)]
    try:
        for s in servers:
            s.server.launch()
        for s in servers:
            s.start()
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.mark.timeout(int(SOAK_S) + 300)
def test_a_grouped_run_over_three_servers_survives_a_minute_of_injected_faults(soak_servers, caplog):
    expected = _expected()
    urls = [s.proxy.url for s in soak_servers]  # type: ignore[union-attr]
    venv = GroupedVectorEnv(urls, num_groups=4, group_size=2, workers=4, split="all",
                            timeout_s=3.0, connect_timeout_s=3.0, down_s=1.0, retries=4)
    injector = Injector(soak_servers, seed=0)
    steps = failovers = 0
    stopped: RemoteEnvError | None = None
    start = time.monotonic()
    injector.start()
    try:
        with caplog.at_level(logging.WARNING, logger="corrgrpo_envs.integrations.openenv_client"):
            while time.monotonic() - start < SOAK_S:
                try:
                    _within(STEP_DEADLINE_S, lambda: venv.reset(task_ids=TASKS), "reset")
                    _, rewards, terminated, truncated, infos = _within(
                        STEP_DEADLINE_S, lambda: venv.step(ACTIONS), "step")
                except RemoteEnvError as exc:
                    stopped = exc
                    break
                # every episode answered once, by a healthy server: the in-process rewards, bit for bit
                assert rewards.shape == expected.shape
                assert np.isfinite(rewards).all()
                np.testing.assert_array_equal(rewards, expected)
                assert terminated.all() and not truncated.any()
                steps += 1
            failovers = sum("replaying the episode" in r.message or "failed during" in r.message
                            for r in caplog.records)
    finally:
        injector.stopping.set()
        injector.join(30)
        _within(30, venv.close, "close")
    report = {"steps": steps, "seconds": round(time.monotonic() - start), "failovers": failovers,
              "faults": injector.counts, "stopped": str(stopped) if stopped else None}
    print("soak:", json.dumps(report))
    if stopped is not None:
        # a run may stop, with one clear error that names what failed, never with a partial batch
        message = str(stopped)
        assert "\n" not in message and "OpenEnv server" in message, message
        assert steps > 0, report
    else:
        assert steps >= 10, report
        assert sum(injector.counts.values()) >= SOAK_S / 4, report
        assert failovers > 0, report


@pytest.mark.timeout(600)
def test_training_over_three_faulty_servers_finishes_or_stops_with_one_error(soak_servers, tmp_path):
    urls = [s.proxy.url for s in soak_servers]  # type: ignore[union-attr]
    out = tmp_path / "run"
    overrides = [
        f"env.id={json.dumps(urls)}", "env.timeout_s=3", "env.connect_timeout_s=3", "env.down_s=1",
        "env.retries=4", "train.steps=6", f"train.output_dir={out}", "train.progress=false",
        "train.tensorboard=false", "train.save_final=false", "algorithm.prompts_per_step=2",
        "algorithm.group_size=4", "rollout.max_new_tokens=8", "rollout.torch_threads=1",
    ]
    injector = Injector(soak_servers, seed=1)
    injector.start()
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "corrgrpo.trainer.cli", "train", "env_configs/quickstart.yaml", *overrides],
            cwd=ROOT, capture_output=True, text=True, timeout=420,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
        )
    finally:
        injector.stopping.set()
        injector.join(30)
    elapsed = time.monotonic() - started
    print("train under faults:", json.dumps({"rc": proc.returncode, "seconds": round(elapsed),
                                             "faults": injector.counts}))
    if proc.returncode == 0:
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        assert [r["step"] for r in rows][-1] == 6 or len(rows) == 6, rows
        for row in rows:
            assert all(np.isfinite(v) for v in row.values() if isinstance(v, float)), row
    else:
        errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]
        assert len(errors) == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
