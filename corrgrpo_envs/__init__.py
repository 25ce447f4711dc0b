"""corrgrpo_envs: Gymnasium-style environments with named vector rewards.

Importing the package registers every built-in domain::

    import corrgrpo_envs
    env = corrgrpo_envs.make("corrgrpo/ScaleDominance-v0")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("abc 123")
    reward            # float32 array, one entry per env.unwrapped.reward_names

``make`` also takes a YAML config or an entry point ``"package.module:attribute"``
(an env class or factory that was never registered). The contract a domain
implements is :class:`MultiRewardEnv`'s (``docs/envs.md``).
"""

from corrgrpo_envs.checker import check_env
from corrgrpo_envs.core import MultiRewardEnv, StepOutcome
from corrgrpo_envs.registry import make, register, registered_ids
from corrgrpo_envs.tasks import DatasetRegistry, Task, TaskSource

__all__ = [
    "MultiRewardEnv",
    "StepOutcome",
    "Task",
    "TaskSource",
    "DatasetRegistry",
    "make",
    "register",
    "registered_ids",
    "check_env",
]

# Entry points are strings so that a domain's dependencies load only when it is made; each
# domain's settings class (its keyword arguments, checked on make and in run configs) too.
register(
    "corrgrpo/ScaleDominance-v0",
    "corrgrpo_envs.toy.env:ScaleDominanceEnv",
    settings="corrgrpo_envs.toy.settings:ToySettings",
    description="toy: rewards of very different scales and correlations, learnable in minutes",
)
register(
    "corrgrpo/Regime-v0",
    "corrgrpo_envs.toy.regimes:RegimeEnv",
    settings="corrgrpo_envs.toy.settings:RegimeSettings",
    description="toy: reward sets where estimators differ (scale, redundancy, trade-off, sparsity, mixed)",
)
register(
    "corrgrpo/Code-v0",
    "corrgrpo_envs.code.env:CodeEnv",
    settings="corrgrpo_envs.code.settings:CodeSettings",
    description="code generation judged in a sandbox (HumanEval, LeetCodeDataset, JSONL)",
)
register(
    "corrgrpo/ToolCall-v0",
    "corrgrpo_envs.toolcall.env:ToolCallEnv",
    settings="corrgrpo_envs.toolcall.settings:ToolCallSettings",
    description="tool calling (RLLA-4K, API-Bank, BFCL, built-in generator)",
)
register(
    "corrgrpo/AgentDojo-v0",
    "corrgrpo_envs.agentdojo.env:AgentDojoEnv",
    settings="corrgrpo_envs.agentdojo.settings:AgentDojoSettings",
    description="AgentDojo: utility versus security under prompt injection (extra: agentdojo)",
)
