"""MkDocs hook: the reference pages written from the code at build time, so they cannot drift.

* ``reference/cli.md``: every ``corrgrpo`` command's ``--help``, from the same argparse parsers
  the command builds (:data:`corrgrpo.trainer.cli.COMMANDS`), sub-commands included;
* ``reference/config.md``: every setting of ``corrgrpo train`` and ``corrgrpo sft`` (and every
  loss option and every built-in env's ``env:`` key), from the settings' own dataclasses, types,
  ranges and attribute docstrings
  (:func:`corrgrpo_registry.settings.describe`, what ``--help`` prints).

The text is made by :func:`cli_markdown` and :func:`config_markdown`, which the tests call too.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]

#: generated page -> the function that writes it
PAGES = {"reference/cli.md": "cli_markdown", "reference/config.md": "config_markdown"}

# help text is wrapped at this width whatever terminal builds the site
HELP_COLUMNS = "100"


def on_files(files: Files, config: Any) -> Files:
    if str(ROOT) not in sys.path:  # the packages documented, as in a checkout
        sys.path.insert(0, str(ROOT))
    for uri, writer in PAGES.items():
        files.append(File.generated(config, uri, content=globals()[writer]()))
    return files


# ----------------------------------------------------------------------------- the CLI
def _command_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """``(command line, parser)`` of every command and sub-command, in the CLI's order."""
    from corrgrpo.trainer.cli import COMMANDS

    out: list[tuple[str, argparse.ArgumentParser]] = []
    for name, (module_path, help_text) in COMMANDS.items():
        parser = argparse.ArgumentParser(prog=f"corrgrpo {name}", description=help_text)
        importlib.import_module(module_path).add_arguments(parser)
        out.append((f"corrgrpo {name}", parser))
        out.extend(_sub_parsers(parser))
    return out


def _sub_parsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:  # argparse keeps sub-commands only here
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases map to one parser
                out.append((sub.prog, sub))
                out.extend(_sub_parsers(sub))
    return out


def cli_markdown() -> str:
    """The CLI reference page: each command's ``--help`` without the settings list (that is
    the configuration reference)."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        parsers = _command_parsers()
        lines = [
            "# Command line",
            "",
            "Every `corrgrpo` command, as `--help` prints it. `train` and `sft` take a config file "
            "and `section.key=value` overrides; their settings are listed in the "
            "[configuration reference](config.md).",
            "",
        ]
        for command, parser in parsers:
            parser.epilog = None  # train and sft: the settings, on the configuration page
            lines += [f"## `{command}`", "", "```text", parser.format_help().rstrip(), "```", ""]
        return "\n".join(lines)
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


# -------------------------------------------------------------------- configuration
def _markdown_text(description: str) -> str:
    """A docstring's reST-style ``code`` and roles as Markdown."""
    text = re.sub(r":(?:class|func|meth|mod|data|attr):`~?([^`]+)`", r"`\1`", description)
    return text.replace("``", "`")


def _entries(settings: list[Any], sections: bool = True) -> list[str]:
    """A definition list of ``settings``, under a heading per top-level section."""
    lines: list[str] = []
    section = None
    for s in settings:
        head = s.key.split(".")[0] if "." in s.key else ""
        if sections and head != section:
            section = head
            lines += [f"### `{head}`" if head else "### top level", ""]
        default = json.dumps(s.default, default=str)
        kind = f"{s.type}; allowed: {s.allowed}" if s.allowed else s.type
        lines += [f"`{s.key}`", f":   {_markdown_text(kind)}; default `{default}`"]
        if s.description:
            lines += ["", f"    {_markdown_text(s.description)}"]
        lines.append("")
    return lines


def _estimator_options() -> list[str]:
    """Each built-in estimator's options, from its signature (``options_class``)."""
    from corrgrpo.trainer.estimators import available_estimators, get_estimator
    from corrgrpo.trainer.estimators.registry import options_class
    from corrgrpo_registry.settings import describe

    lines: list[str] = []
    for name in available_estimators():
        cls = options_class(get_estimator(name))
        settings = describe(cls(), "algorithm.estimator_options") if cls.__dataclass_fields__ else []
        lines += [f"### `{name}`", ""]
        lines += _entries(settings, sections=False) if settings else ["No options.", ""]
    return lines


def config_markdown() -> str:
    """The configuration reference page, from the settings' dataclasses."""
    from corrgrpo.trainer.config import MOVED_KEYS, Config
    from corrgrpo.trainer.losses import LossConfig
    from corrgrpo.trainer.sft import SFTConfig
    from corrgrpo_envs.registry import env_settings
    from corrgrpo_registry.settings import describe

    lines = [
        "# Configuration",
        "",
        "Every setting of a run config, from the settings' own declarations (the same text as "
        "`corrgrpo train --help` and `corrgrpo sft --help`). A config file is YAML with these "
        "sections; each key may also be given on the command line as `section.key=value` "
        "(the value is YAML: `train.report_to=[tensorboard,wandb]`). Every key is optional.",
        "",
        "## `corrgrpo train`",
        "",
        *_entries(describe(Config())),
        "## Loss options (`algorithm.loss_options`)",
        "",
        "Each loss reads the options it needs; `algorithm.loss_options: {clip_high: 0.28}`.",
        "",
        *_entries(describe(LossConfig(), "algorithm.loss_options"), sections=False),
        "## Estimator options (`algorithm.estimator_options`)",
        "",
        "An estimator's options are its keyword-only parameters; another key is an error naming "
        "it. `algorithm.estimator_options: {eps: 1e-4}`.",
        "",
        *_estimator_options(),
        "## `corrgrpo sft`",
        "",
        *_entries(describe(SFTConfig())),
        "## Env settings (`env:`)",
        "",
        "The keys of the `env:` section of each built-in env besides `id` and `import`, from its "
        "settings class (`corrgrpo_envs/<domain>/settings.py`), checked like every other key. "
        "The trainer sets `split` (`train.split`), `max_turns` (`rollout.max_turns`) and "
        "`reward_weights` (`algorithm.reward_weights`) itself; they are not written under `env:`.",
        "",
    ]
    for env_id, settings in env_settings().items():
        lines += [f"### `{env_id}`", ""]
        lines += _entries([s for s in settings if s.key not in MOVED_KEYS], sections=False)
    return "\n".join(lines)
