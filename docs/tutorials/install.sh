# in a clone of the repository, on Linux with Python >= 3.10 (no GPU needed)
bash scripts/setup.sh              # .venv: the CPU build of torch, then the project and its pins
source .venv/bin/activate          # puts the corrgrpo command on PATH
