"""corrgrpo: multi-reward RL for language-model agents.

The trainer, the agents and the example configs are imported through this package
(``corrgrpo.trainer``, ``corrgrpo.agents``, ``corrgrpo.env_configs``), so that an installed
project claims no generic top-level name: a user's own ``trainer.py`` or ``agents.py`` beside
their script shadows nothing of ours. In a source checkout these are links to the repository's
top-level folders of the same names; the wheel holds them as ordinary subpackages. The envs,
the registry and the sandbox keep their own distinctive top-level names (``corrgrpo_envs``,
``corrgrpo_registry``, ``corrgrpo_sandbox``).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("corrgrpo")
except PackageNotFoundError:  # a checkout on sys.path without an install
    __version__ = "0+unknown"
