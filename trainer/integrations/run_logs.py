"""Other trainers' run logs as the records of our ``metrics.jsonl`` (for ``corrgrpo advise``).

- **TRL**: ``trainer_state.json`` (its ``log_history``), in the output folder or its newest
  ``checkpoint-N`` folder, or the file itself; or, where the run saved no state (TRL writes
  ``trainer_state.json`` only with a checkpoint or ``trainer.save_state()``), the TensorBoard
  event files that ``report_to="tensorboard"`` writes under ``runs/`` (each scalar under
  ``train/``), whichever holds more steps. ``CorrGRPOTrainer`` logs our diagnostics there
  under ``corrgrpo/``; TRL's own ``grad_norm`` and ``frac_reward_zero_std`` (the share of groups
  whose weighted sum does not vary, used when ``corrgrpo/zero_variance_fraction`` is absent) are
  read too.
- **verl**: the JSON-lines file of verl's file logger (``trainer.logger=[file]``), one
  ``{"step": N, "data": {name: value}}`` per step: our diagnostics under ``corrgrpo/`` and
  verl's ``actor/grad_norm``.

Our own runs name their estimator in ``config.json``; ``CorrGRPOTrainer`` and our verl estimators
log it as the scalar ``corrgrpo/estimator_used/<name>`` (1.0), since TRL's and verl's loggers take
numbers only; a log without that key leaves :attr:`RunLog.estimator` None.

A record gets our names (the prefix dropped), and the per-pair correlations
``reward_correlation/<a>/<b>`` become the matrix ``reward_correlation``. Logs are read
as untrusted input: a file over :data:`MAX_LOG_BYTES`, a malformed file or one of neither form
is refused in one line naming it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

__all__ = ["ESTIMATOR_KEY", "MAX_LOG_BYTES", "RunLog", "logged_estimator", "read_run"]

#: Larger logs are refused (a month of steps logs a few MB).
MAX_LOG_BYTES = 256 * 2**20
PREFIX = "corrgrpo/"
#: the metric naming the estimator of a TRL or verl run: ``corrgrpo/estimator_used/<name>`` = 1.0
ESTIMATOR_KEY = "estimator_used/"
TRL_STATE = "trainer_state.json"
METRICS = "metrics.jsonl"
RUN_CONFIG = "config.json"
#: TensorBoard's event files (TRL: ``OUTPUT/runs/<date>_<host>/events.out.tfevents.*``)
EVENTS = "events.out.tfevents.*"
#: how to get a TRL log that advise reads, for a folder that holds none
TRL_HOW = (
    f"TRL writes {TRL_STATE} into each checkpoint-N/ it saves (save_steps below the run's steps) and into "
    f"the output folder on trainer.save_state() after trainer.train(), and TensorBoard event files under "
    f"runs/ with report_to='tensorboard'"
)
#: the other trainers' own names -> ours
OWN_NAMES = {"grad_norm": "grad_norm", "actor/grad_norm": "grad_norm"}


class RunLog:
    """A run's records in our names, with where they came from (``corrgrpo``, ``trl``, ``verl``)
    and the estimator it trained with (None where its logs do not say)."""

    def __init__(self, path: Path, kind: str, records: list[dict[str, Any]], has_diagnostics: bool,
                 estimator: str | None = None):
        self.path, self.kind, self.records, self.has_diagnostics = path, kind, records, has_diagnostics
        self.estimator = estimator if estimator is not None else logged_estimator(records)


def logged_estimator(records: list[dict[str, Any]]) -> str | None:
    """The estimator named by the latest record that logs ``estimator_used/<name>`` (None if none does)."""
    for record in reversed(records):
        names = [key[len(ESTIMATOR_KEY):] for key in record if key.startswith(ESTIMATOR_KEY)]
        if names:
            return names[0]
    return None


def _read_text(path: Path) -> str:
    _check_size(path)
    return path.read_text(encoding="utf-8", errors="replace")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _ours(metrics: dict[str, Any]) -> dict[str, Any]:
    """One step's metrics in our names: ``corrgrpo/`` dropped, the pair correlations as a matrix."""
    out: dict[str, Any] = {}
    pairs: dict[tuple[str, str], float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            continue
        if key.startswith(PREFIX):
            name = key[len(PREFIX):]
            match = re.fullmatch(r"reward_correlation/([^/]+)/([^/]+)", name)
            if match and _number(value):
                pairs[(match.group(1), match.group(2))] = float(value)
            elif _number(value) or (name == "reward_correlation" and isinstance(value, list)):
                out[name] = value
        elif key in OWN_NAMES and _number(value):
            out[OWN_NAMES[key]] = float(value)
    if "zero_variance_fraction" not in out and _number(metrics.get("frac_reward_zero_std")):
        out["zero_variance_fraction"] = float(metrics["frac_reward_zero_std"])
    names = sorted({k[7:-5] for k in out if k.startswith("reward/") and k.endswith("/mean")} - {"weighted"})
    if pairs and "reward_correlation" not in out:
        order = [n for n in _logged_order(metrics) if n in names] or names
        index = {n: i for i, n in enumerate(order)}
        matrix: list[list[float | None]] = [[None] * len(order) for _ in order]
        for i, name in enumerate(order):  # the diagonal: 1 where the component varies somewhere
            active = out.get(f"active_fraction/{name}")
            matrix[i][i] = 1.0 if active is None or active > 0 else 0.0
        for (a, b), value in pairs.items():
            if a in index and b in index:
                matrix[index[a]][index[b]] = matrix[index[b]][index[a]] = value
        out["reward_correlation"] = matrix
        out["reward_names"] = order
    elif names:
        out["reward_names"] = [n for n in _logged_order(metrics) if n in names] or names
    return out


def _logged_order(metrics: dict[str, Any]) -> list[str]:
    """Component names in the order the log lists them (our loggers write them in reward order)."""
    seen: list[str] = []
    for key in metrics:
        match = re.fullmatch(rf"{re.escape(PREFIX)}reward/([^/]+)/mean", str(key))
        if match and match.group(1) != "weighted" and match.group(1) not in seen:
            seen.append(match.group(1))
    return seen


def _trl_state(path: Path) -> Path | None:
    if path.is_file() and path.name == TRL_STATE:
        return path
    if (path / TRL_STATE).is_file():
        return path / TRL_STATE
    checkpoints = [(int(p.name.split("-")[1]), p) for p in path.glob("checkpoint-*")
                   if re.fullmatch(r"checkpoint-\d+", p.name) and (p / TRL_STATE).is_file()]
    return max(checkpoints)[1] / TRL_STATE if checkpoints else None


def _trl_events(path: Path) -> list[Path]:
    """TensorBoard event files of a TRL output folder (``runs/*/``), of its ``runs/`` folder, or in
    ``path`` itself (a ``logging_dir``), oldest first."""
    if not path.is_dir():
        return []
    found = [*path.glob(EVENTS), *path.glob(f"*/{EVENTS}"), *path.glob(f"runs/*/{EVENTS}")]
    return sorted((p for p in found if p.is_file()), key=lambda p: (p.stat().st_mtime, str(p)))


def _read_trl_events(files: list[Path]) -> RunLog:
    """TRL's TensorBoard scalars (``train/<name>``, the step TRL logged them at) as records.

    A resumed run writes a new file: the files are merged by step, a later file winning.
    """
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:  # a core dependency: only a broken install lacks it
        raise ValueError(f"{files[0]}: reading TensorBoard events needs the tensorboard package") from None
    by_step: dict[int, dict[str, Any]] = {}
    for file in files:
        _check_size(file)
        events = EventAccumulator(str(file), size_guidance={"scalars": 0})
        try:
            events.Reload()
        except Exception as exc:  # a corrupt file: TensorBoard's reader raises its own types
            raise ValueError(f"{file}: not a TensorBoard event file ({exc})") from None
        for tag in events.Tags().get("scalars", []):
            if not tag.startswith("train/"):  # eval/ and test/: not training steps
                continue
            for event in events.Scalars(tag):
                by_step.setdefault(int(event.step), {})[tag[len("train/"):]] = float(event.value)
    records, diagnostics = [], False
    for step in sorted(by_step):
        metrics = by_step[step]
        record = _ours(metrics)
        diagnostics |= any(k.startswith(PREFIX) for k in metrics)
        if record:
            record["step"] = step
            records.append(record)
    if not by_step:  # TensorBoard's reader skips what it cannot parse: say so rather than judge nothing
        raise ValueError(f"{files[-1]}: no training scalars (train/...) in {len(files)} TensorBoard event file(s)")
    return RunLog(files[-1].parent, "trl", records, diagnostics)


def _check_size(path: Path) -> None:
    size = path.stat().st_size
    if size > MAX_LOG_BYTES:
        raise ValueError(f"{path}: {size} bytes is over the {MAX_LOG_BYTES}-byte limit for a run log")


def _estimator(run: Path) -> str | None:
    """The estimator in our run folder's ``config.json`` (None if it is missing or unreadable)."""
    try:
        algorithm = json.loads(_read_text(run / RUN_CONFIG)).get("algorithm")
    except (OSError, ValueError, AttributeError):
        return None
    estimator = algorithm.get("estimator") if isinstance(algorithm, dict) else None
    return estimator if isinstance(estimator, str) else None


def _read_trl(state: Path) -> RunLog:
    try:
        history = json.loads(_read_text(state)).get("log_history")
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"{state}: not a TRL trainer_state.json ({exc})") from None
    if not isinstance(history, list):
        raise ValueError(f"{state}: no log_history list")
    records, diagnostics = [], False
    for entry in history:
        # training steps only: evaluation entries are prefixed eval_, the last entry sums the run up
        if not isinstance(entry, dict) or "train_runtime" in entry or any(str(k).startswith("eval_") for k in entry):
            continue
        record = _ours(entry)
        diagnostics |= any(str(k).startswith(PREFIX) for k in entry)
        if record:
            record["step"] = entry.get("step")
            records.append(record)
    return RunLog(state, "trl", records, diagnostics)


def _read_verl(path: Path) -> RunLog:
    records, diagnostics = [], False
    lines = _read_text(path).splitlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError as exc:
            if lineno == len(lines):  # a run that is still writing: its last line may be torn
                break
            raise ValueError(f"{path}:{lineno}: not a JSON line ({exc})") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("data"), dict):
            raise ValueError(f"{path}:{lineno}: not a verl file-logger line ({{\"step\": N, \"data\": {{...}}}})")
        record = _ours(entry["data"])
        diagnostics |= any(str(k).startswith(PREFIX) for k in entry["data"])
        if record:
            record["step"] = entry.get("step")
            records.append(record)
    return RunLog(path, "verl", records, diagnostics)


def read_run(path: str | Path) -> RunLog:
    """A run folder of ours (``metrics.jsonl``), a TRL output folder (``trainer_state.json`` or
    TensorBoard events) or ``trainer_state.json``, or a verl file-logger ``.jsonl``.

    Raises:
        FileNotFoundError: ``path`` is none of these.
        ValueError: the log is too large or malformed (the message names the file).
    """
    from corrgrpo.trainer.run_logger import read_metrics

    path = Path(path)
    if path.is_file() and path.name == METRICS:
        path = path.parent
    if path.is_dir() and (path / METRICS).is_file():
        return RunLog(path, "corrgrpo", read_metrics(path), True, _estimator(path))
    state, events = _trl_state(path), _trl_events(path)
    if state is not None or events:
        logs = [_read_trl(state)] if state is not None else []
        if events:
            try:
                logs.append(_read_trl_events(events))
            except ValueError:
                if not logs:  # unreadable events beside a trainer_state.json: the state stands
                    raise
        return max(logs, key=lambda log: len(log.records))  # the first (trainer_state.json) on a tie
    if path.is_file() and path.suffix == ".jsonl":
        return _read_verl(path)
    if path.is_dir() and ((path / "training_args.bin").is_file() or any(path.glob("checkpoint-*"))):
        raise FileNotFoundError(f"{path}: a TRL output folder without a log advise reads: {TRL_HOW}")
    raise FileNotFoundError(
        f"{path}: not a run: expected a corrgrpo run folder ({METRICS}), a TRL output folder "
        f"({TRL_STATE} or TensorBoard events under runs/) or {TRL_STATE}, or a verl file-logger .jsonl; "
        f"{TRL_HOW}"
    )
