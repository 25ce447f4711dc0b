"""The plan program: the reference solution under its check, every call recorded.

Joined after the sandbox's codec and :mod:`.check_env`, then called once by the host's last
line (:func:`corrgrpo_envs.code.verdicts.plan_program`). It prints one line, the marker then
JSON ``{"inputs": [...], "passed": bool}``: each call's ``(args, kwargs)`` in the codec's plain
form, and whether the reference passed its own check.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:  # the same program text holds these
    from corrgrpo_envs.code.inside.check_env import _corrgrpo_check_builtins
    from corrgrpo_sandbox.inside.plain import _plain_encode


def _corrgrpo_plan(reference, check, entry, classes, marker):
    import io
    import json
    import sys

    out = sys.stdout
    sys.stdout = io.StringIO()  # what the reference and the check print is not the plan
    namespace = {"__name__": "__main__"}
    exec(compile(reference, "<reference>", "exec"), namespace)
    check_namespace = {"__name__": "__main__", "__builtins__": _corrgrpo_check_builtins()}
    exec(compile(check, "<check>", "exec"), check_namespace)
    target = eval(entry, namespace)
    inputs = []

    def recorder(*args, **kwargs):
        inputs.append(json.dumps(_plain_encode((args, kwargs), classes), separators=(",", ":")))
        return target(*args, **kwargs)

    if entry.isidentifier():
        check_namespace[entry] = recorder  # a check that calls the entry by name calls the candidate
    passed = True
    try:
        check_namespace["check"](recorder)
    except AssertionError:
        passed = False
    sys.stdout = out
    print(marker + json.dumps({"inputs": inputs, "passed": passed}))
