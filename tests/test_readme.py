"""The README's tour names real commands and configs, and its links lead to files that exist.

The README's longer examples live in the documentation's tutorials (``docs/tutorials/``,
run by ``tests/test_docs_examples.py``) and in docs/trl.md and docs/verl.md (run by their
integration tests, which also run the README's TRL example).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _tour() -> list[list[str]]:
    text = README.read_text(encoding="utf-8")
    block = text.split("## A tour", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line.split("#", 1)[0]) for line in block.splitlines() if line.startswith("corrgrpo ")]


def test_the_tour_is_ten_lines_of_real_commands_and_configs():
    from corrgrpo.trainer.cli import COMMANDS
    from corrgrpo.trainer.config import CONFIG_DIR

    tour = _tour()
    assert len(tour) <= 10, len(tour)
    for argv in tour:
        assert argv[1] in COMMANDS, argv
        for word in argv[2:]:
            if word.endswith(".yaml"):
                assert (Path(CONFIG_DIR) / word).exists(), word


#: pages the site writes when it builds (mkdocs_hooks/reference_pages.py), from the code itself
GENERATED = {"docs/reference/cli.md", "docs/reference/config.md"}


def test_every_link_of_the_readme_leads_to_a_file():
    text = README.read_text(encoding="utf-8")
    targets = {t.split("#", 1)[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if not t.startswith("http")}
    missing = sorted(t for t in targets - GENERATED if t and not (ROOT / t).exists())
    assert not missing, missing


def test_why_corrgrpo_is_short():
    why = README.read_text(encoding="utf-8").split("## Why CorrGRPO", 1)[1].split("\n## ", 1)[0]
    assert len(why.split()) <= 150, len(why.split())
