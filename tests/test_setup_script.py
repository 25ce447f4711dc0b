"""scripts/setup.sh's choice of torch build (scripts/torch_index.sh): the CPU build unless an
NVIDIA GPU answers ``nvidia-smi -L``, ``TORCH_VARIANT`` and ``TORCH_INDEX`` to choose otherwise,
and the default index when the chosen one does not answer (a machine with only a local mirror)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "torch_index.sh"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
BASH = shutil.which("bash")


def _choose(tmp_path: Path, nvidia_smi: str | None = None, **env: str) -> tuple[int, list[str], str]:
    """Run the script on a PATH that holds only a fake ``nvidia-smi`` (``None``: none at all);
    returns its exit status, the pip options it printed and its note."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if nvidia_smi is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!{BASH}\n{nvidia_smi}\n")
        fake.chmod(0o755)
    done = subprocess.run([BASH, str(SCRIPT)], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bin_dir), "PYTHON": sys.executable, "HOME": os.environ.get("HOME", "/"),
                               **env})
    return done.returncode, done.stdout.split(), done.stderr.strip()


def test_a_machine_with_a_gpu_gets_the_default_index_build(tmp_path):
    code, options, note = _choose(tmp_path, 'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"')
    assert (code, options, note) == (0, [], "torch: the cuda build from the default index")


@pytest.mark.parametrize("nvidia_smi", [None, 'echo "NVIDIA-SMI has failed: no NVIDIA driver" >&2; exit 9'])
def test_a_machine_without_a_gpu_gets_the_cpu_build(tmp_path, nvidia_smi):
    index = tmp_path / "mirror"
    index.mkdir()
    code, options, note = _choose(tmp_path, nvidia_smi, TORCH_INDEX=index.as_uri())
    assert (code, options, note) == (0, ["--extra-index-url", index.as_uri()],
                                     f"torch: the cpu build from {index.as_uri()}")
    # the PyTorch CPU index by default: its options where it answers, else a note naming it
    code, options, note = _choose(tmp_path, nvidia_smi)
    assert code == 0 and (options == ["--extra-index-url", CPU_INDEX] or (options == [] and note == (
        f"torch: {CPU_INDEX} does not answer: the default index's build instead (on Linux the CUDA one; "
        "set TORCH_INDEX to a mirror of it to get the cpu build)")))


def test_the_variant_and_index_can_be_chosen(tmp_path):
    gpu = 'echo "GPU 0: NVIDIA H100"'
    index = tmp_path / "mirror"
    index.mkdir()
    assert _choose(tmp_path, gpu, TORCH_VARIANT="cpu", TORCH_INDEX=index.as_uri())[1] == [
        "--extra-index-url", index.as_uri()]
    assert _choose(tmp_path, None, TORCH_VARIANT="cuda") == (0, [], "torch: the cuda build from the default index")
    cuda = tmp_path / "cu128"
    cuda.mkdir()
    assert _choose(tmp_path, None, TORCH_VARIANT="cuda", TORCH_INDEX=cuda.as_uri())[1] == [
        "--extra-index-url", cuda.as_uri()]
    missing = (tmp_path / "nowhere").as_uri()
    code, options, note = _choose(tmp_path, None, TORCH_INDEX=missing)
    assert (code, options) == (0, []) and note.startswith(f"torch: {missing} does not answer")
    assert _choose(tmp_path, None, TORCH_VARIANT="gpu") == (2, [], "error: TORCH_VARIANT=gpu: expected auto, cpu or cuda")


@pytest.mark.parametrize("gpu", [True, False])
def test_setup_installs_torch_with_the_chosen_options(tmp_path, gpu):
    """setup.sh in a copy of the checkout whose ``.venv/bin/python`` writes down its pip commands."""
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    for name in ("setup.sh", "torch_index.sh"):
        shutil.copy(ROOT / "scripts" / name, clone / "scripts" / name)
    python = clone / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    log = tmp_path / "pip.log"
    # the reachability check (a script on stdin) runs for real; every other call is pip's
    python.write_text(f'#!{BASH}\n[ "$1" = - ] && exec {sys.executable} "$@"\necho "$*" >> {log}\n')
    python.chmod(0o755)
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(f"#!{BASH}\n" + ('echo "GPU 0: NVIDIA H100"' if gpu else "exit 9") + "\n")
    fake.chmod(0o755)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_")}  # not the caller's choice
    env.update(PATH=f"{fake.parent}{os.pathsep}{os.environ['PATH']}", EXTRAS="dev")
    if not gpu:
        env["TORCH_INDEX"] = mirror.as_uri()
    subprocess.run([BASH, str(clone / "scripts" / "setup.sh")], check=True, env=env, capture_output=True,
                   timeout=60)
    torch = f"--extra-index-url {mirror.as_uri()} torch==2.13.0" if not gpu else "torch==2.13.0"
    assert log.read_text().splitlines() == [
        "-m pip install -q --upgrade pip",
        f"-m pip install -q {torch}",
        "-m pip install -q -c constraints.txt -e .[dev]",
    ]
