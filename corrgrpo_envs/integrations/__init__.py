"""Our envs in other libraries' trainers.

* :mod:`corrgrpo_envs.integrations.trl`: an env's K reward components as K reward
  functions (plus weights) and its prompts as a dataset, for TRL's ``GRPOTrainer``.

Nothing here imports the other library at import time.
"""
