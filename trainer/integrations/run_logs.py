"""Other trainers' run logs as the records of our ``metrics.jsonl`` (for ``corrgrpo advise``).

- **TRL**: ``trainer_state.json`` (its ``log_history``), in the output folder or its newest
  ``checkpoint-N`` folder, or the file itself. ``CorrGRPOTrainer`` logs our diagnostics there
  under ``corrgrpo/``; TRL's own ``grad_norm`` and ``frac_reward_zero_std`` (the share of groups
  whose weighted sum does not vary, used when ``corrgrpo/zero_variance_fraction`` is absent) are
  read too.
- **verl**: the JSON-lines file of verl's file logger (``trainer.logger=[file]``), one
  ``{"step": N, "data": {name: value}}`` per step: our diagnostics under ``corrgrpo/`` and
  verl's ``actor/grad_norm``.

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

__all__ = ["MAX_LOG_BYTES", "RunLog", "read_run"]

#: Larger logs are refused (a month of steps logs a few MB).
MAX_LOG_BYTES = 256 * 2**20
PREFIX = "corrgrpo/"
TRL_STATE = "trainer_state.json"
METRICS = "metrics.jsonl"
#: the other trainers' own names -> ours
OWN_NAMES = {"grad_norm": "grad_norm", "actor/grad_norm": "grad_norm"}


class RunLog:
    """A run's records in our names, with where they came from (``corrgrpo``, ``trl``, ``verl``)."""

    def __init__(self, path: Path, kind: str, records: list[dict[str, Any]], has_diagnostics: bool):
        self.path, self.kind, self.records, self.has_diagnostics = path, kind, records, has_diagnostics


def _read_text(path: Path) -> str:
    size = path.stat().st_size
    if size > MAX_LOG_BYTES:
        raise ValueError(f"{path}: {size} bytes is over the {MAX_LOG_BYTES}-byte limit for a run log")
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
    """A run folder of ours (``metrics.jsonl``), a TRL output folder or ``trainer_state.json``,
    or a verl file-logger ``.jsonl``.

    Raises:
        FileNotFoundError: ``path`` is none of these.
        ValueError: the log is too large or malformed (the message names the file).
    """
    from trainer.run_logger import read_metrics

    path = Path(path)
    if path.is_file() and path.name == METRICS:
        path = path.parent
    if path.is_dir() and (path / METRICS).is_file():
        return RunLog(path, "corrgrpo", read_metrics(path), True)
    state = _trl_state(path)
    if state is not None:
        return _read_trl(state)
    if path.is_file() and path.suffix == ".jsonl":
        return _read_verl(path)
    raise FileNotFoundError(
        f"{path}: not a run: expected a corrgrpo run folder ({METRICS}), a TRL output folder or "
        f"{TRL_STATE}, or a verl file-logger .jsonl"
    )
