# in a clone of the repository, on Linux with Python >= 3.10 (no GPU needed)
bash scripts/setup.sh              # .venv: torch (the CPU build without a GPU), the project, its pins
source .venv/bin/activate          # puts the corrgrpo command on PATH
