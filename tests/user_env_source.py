"""The source of a user's env module, written to a temporary folder by the tests that import
it as a user would (an entry point, a registration by ``module:attr``)."""

USER_ENV = """
from corrgrpo_envs.core import MultiRewardEnv, StepOutcome
from corrgrpo_envs.tasks import Task, TaskSource

class UserEnv(MultiRewardEnv):
    def __init__(self, n=3, max_turns=1, **kwargs):
        super().__init__(TaskSource([Task(f"u{i}") for i in range(n)]), ("a",), (0,), (1,), **kwargs)
        self.max_turns = max_turns

    def _observe_task(self, task):
        return {"messages": [{"role": "user", "content": task.id}], "tools": []}

    def _act(self, action):
        return StepOutcome(rewards={"a": 1.0})

NOT_CALLABLE = 3
"""
