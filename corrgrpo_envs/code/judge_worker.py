"""A judge worker's entry: ``python judge_worker.py <folder holding corrgrpo_envs> <sys.path as JSON>``.

Run as a script by :class:`corrgrpo_envs.code.judge_pool.JudgePool`, never imported. The worker
gets the host's ``sys.path`` (a check imports what it would have imported in the host), and
empty package modules stand in for ``corrgrpo_envs``, ``corrgrpo_envs.code`` and
``corrgrpo_sandbox``, so importing the judge runs none of their ``__init__`` files (they pull
in gymnasium and numpy: half a second per worker).
"""

import json
import sys
import types


def main() -> None:
    root = sys.argv[1]
    sys.path[:] = json.loads(sys.argv[2])
    for name, folder in (("corrgrpo_envs", "/corrgrpo_envs"),
                         ("corrgrpo_envs.code", "/corrgrpo_envs/code"),
                         ("corrgrpo_sandbox", "/corrgrpo_sandbox")):
        module = types.ModuleType(name)
        module.__path__ = [root + folder]
        sys.modules[name] = module
    from corrgrpo_envs.code.judge_pool import serve

    serve()


if __name__ == "__main__":
    main()
