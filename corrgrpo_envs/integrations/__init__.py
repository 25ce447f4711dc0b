"""Our envs in other libraries' trainers.

* :mod:`corrgrpo_envs.integrations.trl`: an env's K reward components as K reward
  functions (plus weights) and its prompts as a dataset, for TRL's ``GRPOTrainer``.

Nothing here imports the other library at import time.
"""

__all__ = ["OPENENV_SCHEME"]

#: The scheme of an env served by OpenEnv servers (``env.id: openenv://HOST:PORT``), the one
#: definition: the env registry and the OpenEnv client both import it from here.
OPENENV_SCHEME = "openenv://"
