"""The documentation site builds with ``mkdocs build --strict`` (a broken link, anchor, include
or API reference fails it), and its generated pages and link rewriting say what they should.

Without MkDocs (the ``docs`` extra) these tests skip, except under CI (``CI=true``), where the
extra is installed and a missing MkDocs is a failure.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ci import in_ci

ROOT = Path(__file__).resolve().parents[1]

if importlib.util.find_spec("mkdocs") is None:
    if in_ci():
        raise RuntimeError("mkdocs is not installed under CI: scripts/test.sh installs the docs extra")
    pytest.skip("mkdocs is not installed (pip install -e '.[docs]')", allow_module_level=True)

sys.path.insert(0, str(ROOT / "mkdocs_hooks"))
import reference_pages  # noqa: E402
import repo_links  # noqa: E402


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_site_builds_strictly(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=580,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for page in ("index.html", "reference/cli/index.html", "reference/config/index.html",
                 "reference/api/index.html", "benchmarks/index.html", "getting-started/quickstart/index.html"):
        assert (site / page).is_file(), page
    # the getting-started pages show the tutorial files' text, not the include line
    your_env = (site / "getting-started" / "your-env" / "index.html").read_text(encoding="utf-8")
    assert "--8&lt;--" not in your_env
    assert "PoliteEnv" in your_env and "_observe_task" in your_env  # (highlighted: split into spans)
    # mkdocstrings rendered the plug-in API from the docstrings
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "register_estimator" in api and "LossInputs" in api and "MultiRewardEnv" in api


def test_the_configuration_page_lists_every_setting():
    from corrgrpo.trainer.config import Config
    from corrgrpo.trainer.losses import LossConfig
    from corrgrpo.trainer.sft import SFTConfig
    from corrgrpo_registry.settings import describe

    page = reference_pages.config_markdown()
    keys = [s.key for s in describe(Config()) + describe(SFTConfig())]
    keys += [f"algorithm.loss_options.{s.key}" for s in describe(LossConfig())]
    assert len(keys) > 100
    missing = [k for k in keys if f"`{k}`\n:   " not in page]
    assert missing == []
    assert "`model.dtype`\n:   one of 'float32', 'bfloat16', 'float16'; default `\"float32\"`" in page
    assert "``" not in page  # reST double backticks became Markdown code


def test_the_cli_page_has_every_command_and_sub_command():
    from corrgrpo.trainer.cli import COMMANDS

    page = reference_pages.cli_markdown()
    for name in COMMANDS:
        assert f"## `corrgrpo {name}`" in page
        assert f"usage: corrgrpo {name}" in page
    assert "## `corrgrpo envs list`" in page and "## `corrgrpo envs check`" in page
    assert "settings (every one optional" not in page  # the settings are the configuration page's


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository with docs/, a site page outside it and a source file."""
    (tmp_path / "docs" / "guide").mkdir(parents=True)
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "speed.py").write_text("")
    (tmp_path / "BENCHMARKS.md").write_text("# B\n")
    (tmp_path / "docs" / "trainer.md").write_text("# T\n")
    monkeypatch.setattr(repo_links, "_state", {"root": tmp_path, "docs": tmp_path / "docs"})
    return tmp_path


def test_links_to_site_pages_outside_docs_point_to_their_page(repo):
    text = "see [the numbers](../../BENCHMARKS.md#generation) and ![fig](../figures/a.png)"
    out = repo_links.rewrite_links(text, repo / "docs" / "guide" / "page.md", "guide/page.md")
    assert out == "see [the numbers](../benchmarks.md#generation) and ![fig](../figures/a.png)"


def test_links_from_a_page_outside_docs_are_read_against_the_repository(repo):
    out = repo_links.rewrite_links("[trainer](docs/trainer.md#config)", repo / "BENCHMARKS.md",
                                   "benchmarks.md")
    assert out == "[trainer](trainer.md#config)"


def test_links_to_source_files_become_their_path_and_broken_links_stay(repo):
    page = repo / "docs" / "trainer.md"
    assert repo_links.rewrite_links("[the bench](../bench/speed.py)", page, "trainer.md") == \
        "the bench (`bench/speed.py`)"
    assert repo_links.rewrite_links("[`bench/speed.py`](../bench/speed.py)", page, "trainer.md") == \
        "`bench/speed.py`"
    broken = "[gone](../bench/nothing.py) [web](https://example.org/x.md) [here](#config)"
    assert repo_links.rewrite_links(broken, page, "trainer.md") == broken


def test_links_inside_fenced_code_are_left_alone(repo):
    text = "```md\n[the bench](../bench/speed.py)\n```\n[the bench](../bench/speed.py)\n"
    out = repo_links.rewrite_links(text, repo / "docs" / "trainer.md", "trainer.md")
    assert out == "```md\n[the bench](../bench/speed.py)\n```\nthe bench (`bench/speed.py`)\n"


def test_the_configuration_page_lists_every_env_setting_but_the_trainers():
    from corrgrpo_envs.registry import env_settings

    page = reference_pages.config_markdown()
    settings = env_settings()
    assert set(settings) == {"corrgrpo/AgentDojo-v0", "corrgrpo/Code-v0", "corrgrpo/Regime-v0",
                             "corrgrpo/ScaleDominance-v0",
                             "corrgrpo/ToolCall-v0", "openenv://HOST:PORT"}
    for env_id, entries in settings.items():
        section = page.split(f"### `{env_id}`\n", 1)[1].split("\n### ", 1)[0]
        for s in entries:
            owned = s.key in ("env.split", "env.max_turns", "env.reward_weights")
            assert (f"`{s.key}`\n:   " in section) != owned, (env_id, s.key)
    assert "`env.num_tasks`\n:   integer; allowed: >= 1; default `64`" in page
