"""A two-reward env: is the answer polite, and is it brief? Importing it registers myorg/Polite-v0."""

import corrgrpo_envs
from corrgrpo_envs import MultiRewardEnv, StepOutcome, Task, TaskSource

NAMES = ["Ada", "Alan", "Grace", "Edsger"]


class PoliteEnv(MultiRewardEnv):
    def __init__(self, split: str = "all", **kwargs):
        tasks = TaskSource([Task(f"greet-{i}", {"name": n}) for i, n in enumerate(NAMES)])
        super().__init__(tasks.split(split), reward_names=("polite", "brief"),
                         reward_low=(0, 0), reward_high=(1, 1), reward_weights=(1.0, 0.5), **kwargs)

    def _observe_task(self, task):
        return {"messages": [{"role": "user", "content": f"Say hello to {task['name']}."}],
                "tools": []}

    def _act(self, action):
        # brief is graded (1 up to 40 characters, 0 from 120): a model that never writes a
        # short answer still scores more for a shorter one, so there is something to learn
        return StepOutcome(rewards={"polite": float("hello" in action.lower()),
                                    "brief": min(1.0, max(0.0, (120 - len(action)) / 80))})

    def reference_action(self, task_id):  # optional: a good answer, for eval and SFT
        return [f"Hello, {self.tasks.get(task_id)['name']}!"]


corrgrpo_envs.register("myorg/Polite-v0", PoliteEnv)
