"""The code domain's text rewards: block choice, syntax, compile, AST similarity, efficiency."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from corrgrpo_envs.code import rewards as R


def test_names_and_weights_follow_the_paper():
    assert R.REWARD_NAMES == ("format", "syntax", "compile", "runtime", "correct", "ast_similarity", "efficiency")
    assert R.DEFAULT_WEIGHTS == (0.05, 0.05, 0.05, 0.25, 0.60, 0.30, 0.20)


def test_fenced_blocks_accept_python_py_and_bare_only():
    text = "```python\na=1\n```\n```py\nb=2\n```\n```\nc=3\n```\n```cpp\nint x;\n```\n```python\nunclosed"
    assert [b.code for b in R.fenced_blocks(text)] == ["a=1\n", "b=2\n", "c=3\n"]


def test_choose_block_prefers_the_longest_block_with_the_entry():
    text = (
        "```python\nclass Solution:\n    def f(self): return 1\n```\n"
        "```python\n# a much longer block without the class ...........................\nx = 1\n```\n"
        "```python\nclass Solution:\n    def f(self):\n        return 2\n```"
    )
    code, has_entry = R.choose_block(text, "Solution().f")
    assert has_entry and "return 2" in code
    code, has_entry = R.choose_block("```python\nx = 1\n```", "Solution().f")
    assert code == "x = 1\n" and not has_entry
    assert R.choose_block("no code here", "f") == (None, False)
    assert R.choose_block("```python\ndef f(x):\n    return x\n```", "f")[1]
    assert not R.choose_block("```python\ndef ff(x):\n    return x\n```", "f")[1]


def test_syntax_and_compile():
    assert R.syntax_ok("x = 1")
    assert not R.syntax_ok("   \n")
    assert not R.syntax_ok("def f(:")
    assert R.compiles(R.judged_program("def g():\n    pass", "def f(x):\n    return x", "def check(c):\n    assert c(1) == 1", "f"))
    assert not R.compiles("def f(:\n")
    assert not R.compiles("return 1")  # parses as code but not as a module


def test_ast_similarity_ignores_identifiers():
    a = "def f(x):\n    return x + 1\n"
    b = "def g(y):\n    return y + 2\n"
    c = "class A:\n    pass\n"
    assert R.ast_similarity(a, b) == 1.0
    assert 0.0 < R.ast_similarity(a, c) < 0.5
    assert R.ast_similarity("def f(:", a) == 0.0
    seq = R.ast_type_sequence("x = 1")
    assert seq == ["Module", "Assign", "Name", "Store", "/Store", "/Name", "Constant", "/Constant", "/Assign", "/Module"]


def test_ast_sequence_of_deep_nesting_does_not_overflow():
    deep = "x = " + "[" * 90 + "]" * 90
    assert R.ast_type_sequence(deep) is not None


@given(st.lists(st.sampled_from(["x = 1", "y = f(x)", "if a:\n    b = 2", "for i in r:\n    pass", "def h():\n    return 3"]), max_size=6),
       st.lists(st.sampled_from(["x = 1", "y = f(x)", "while a:\n    b = 2", "class K:\n    pass"]), max_size=6))
def test_ast_similarity_is_bounded_and_symmetric_in_range(a, b):
    sa, sb = "\n".join(a), "\n".join(b)
    s = R.ast_similarity(sa, sb)
    assert 0.0 <= s <= 1.0
    assert R.ast_similarity(sa, sa) == 1.0


@given(st.booleans(), st.floats(0, 100), st.one_of(st.none(), st.floats(0, 100)))
def test_efficiency_bounds(correct, t_cand, t_ref):
    e = R.efficiency(correct, t_cand, t_ref)
    assert 0.0 <= e <= 1.0
    if not correct or t_ref is None or t_ref == 0:
        assert e == 0.0


def test_efficiency_values():
    assert R.efficiency(True, 0.5, 1.0) == 0.5
    assert R.efficiency(True, 2.0, 1.0) == 0.0
    assert R.efficiency(False, 0.1, 1.0) == 0.0


def test_parse_python_retries_the_interpreters_spurious_depth_mismatch(monkeypatch):
    import ast

    real_parse, calls = ast.parse, []

    def flaky(source):
        calls.append(source)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=18, after=10)")
        return real_parse(source)

    monkeypatch.setattr(R.ast, "parse", flaky)
    assert isinstance(R.parse_python("x = 1"), ast.Module) and len(calls) == 2
    assert R.syntax_ok("def f():\n    return 1\n")

    def broken(source):
        raise SystemError("some other interpreter error")

    monkeypatch.setattr(R.ast, "parse", broken)
    try:
        R.parse_python("x = 1")
    except SystemError as error:
        assert "other" in str(error)
    else:
        raise AssertionError("a SystemError that is not the depth mismatch must propagate")


def test_parse_python_from_many_threads_under_gc_pressure():
    """The env scores answers on a thread pool. Bare ``ast.parse`` on CPython 3.11 raises a
    spurious depth-mismatch SystemError here a few times in a hundred (gh-106905)."""
    import gc
    import sys
    import threading
    from pathlib import Path

    source = Path(R.__file__).read_text()
    errors: list[str] = []

    class Finalized:
        def __del__(self):
            [i for i in range(10)]  # Python code run by the collector: lets another thread in

    def work() -> None:
        for _ in range(60):
            for _ in range(30):
                a, b = Finalized(), Finalized()
                a.other, b.other = b, a
            try:
                assert R.ast_type_sequence(source)
            except SystemError as error:
                errors.append(str(error))

    old_threshold, old_interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(50, 2, 2)
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.set_threshold(*old_threshold)
        sys.setswitchinterval(old_interval)
    assert errors == []
