"""TRL's GRPOTrainer trains on a corrgrpo env served over OpenEnv, through TRL's environment_factory.

Runs ``examples/trl_openenv.py``'s training against a real ``corrgrpo serve`` server:
in this interpreter when ``trl`` imports, else in ``.venv-trl`` (``bash
scripts/trl_venv.sh``; then ``.venv-trl/bin/pip install --no-deps -e .``, the ``openenv``
extra's packages and ``--no-deps openenv==0.10.0``), and skips when neither has it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed (pip install -e '.[openenv]')")

from tests.openenv_servers import corrgrpo_serve  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"
NAMES = ("digits", "has_a", "word_with_a")


def _train(url: str, out: Path) -> dict:
    from examples import trl_openenv

    model, tokenizer = trl_openenv.tiny_model_and_tokenizer()
    trainer = trl_openenv.train(url, model, tokenizer, out / "trl", steps=2)
    logs = [h for h in trainer.state.log_history if "rewards/digits/mean" in h]
    return {"logs": logs, "global_step": trainer.state.global_step}


def test_grpo_trainer_trains_on_a_served_env_with_one_reward_function_per_component(tmp_path):
    server = corrgrpo_serve("corrgrpo/ScaleDominance-v0", "num_tasks=16", tmp=tmp_path).start()
    try:
        if importlib.util.find_spec("trl") is not None:
            result = _train(server.url, tmp_path)
        elif not TRL_PYTHON.exists():
            pytest.skip("TRL is not installed here and .venv-trl is missing (bash scripts/trl_venv.sh builds it)")
        else:
            out = tmp_path / "result.json"
            code = (
                "import json, sys; from pathlib import Path;"
                "from tests import test_trl_openenv as t;"  # python -c in the checkout: it is on sys.path
                f"Path({str(out)!r}).write_text(json.dumps(t._train({server.url!r}, Path({str(tmp_path)!r}))))"
            )
            env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                   "TRL_EXPERIMENTAL_SILENCE": "1"}
            proc = subprocess.run([str(TRL_PYTHON), "-c", code], cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=600)
            missing = [m for m in ("corrgrpo_envs", "openenv", "fastapi", "gymnasium", "pytest", "requests")
                       if f"No module named '{m}'" in proc.stderr]
            if proc.returncode != 0 and missing:
                pytest.skip(f".venv-trl lacks {missing[0]}: install this project and the openenv extra into it "
                            "(see docs/openenv.md)")
            assert proc.returncode == 0, proc.stderr[-4000:]
            result = json.loads(out.read_text())
    finally:
        server.stop()
    assert result["global_step"] == 2 and len(result["logs"]) == 2
    for log in result["logs"]:
        means = [log[f"rewards/{n}/mean"] for n in NAMES]
        assert 0.0 <= means[0] <= 32.0 and 0.0 <= means[1] <= 1.0 and 0.0 <= means[2] <= means[1]
        # TRL's reward is the weighted sum of the components the server sent, with its weights (all 1)
        assert log["reward"] == pytest.approx(float(np.sum(means)), rel=1e-4, abs=1e-5)
