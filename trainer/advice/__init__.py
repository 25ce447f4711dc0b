"""``corrgrpo advise``: what a run's diagnostics show, and what this project's measurements say to try.

- :mod:`corrgrpo.trainer.advice.findings`: the conditions, judged on each run's logged metrics.
- :mod:`corrgrpo.trainer.advice.recommendations`: what each finding recommends (:data:`ADVICE`, the one
  table to change), with the doc section holding the measurement behind it.
- :mod:`corrgrpo.trainer.advice.report`: the text, one paragraph per advice, wrapped to the terminal.
"""

from corrgrpo.trainer.advice.findings import (
    PER_REWARD_ESTIMATORS,
    Finding,
    Report,
    RunInfo,
    Thresholds,
    advise,
    examine,
    summarise,
)
from corrgrpo.trainer.advice.recommendations import ADVICE, Advice, where_to_read

__all__ = ["ADVICE", "PER_REWARD_ESTIMATORS", "Advice", "Finding", "Report", "RunInfo", "Thresholds", "advise",
           "examine", "summarise", "where_to_read"]
