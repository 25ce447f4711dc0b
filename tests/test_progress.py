"""The progress line's step time is the mean of the run's steps, not the last step's."""

from __future__ import annotations

from corrgrpo.trainer.progress import TrainProgress
from corrgrpo.trainer.sft import _SFTProgress


def _shown(progress: TrainProgress) -> str:
    return progress._progress.tasks[0].fields["info"]


def test_the_train_progress_shows_the_mean_seconds_per_step():
    progress = TrainProgress(total=4, enabled=False)
    assert progress.seconds_per_step == 0.0
    for step, seconds in enumerate([10.0, 1.0, 1.0], start=1):
        progress.update(step, {"reward/weighted/mean": 0.5, "reward/a/mean": 0.25, "time/step": seconds})
    assert progress.seconds_per_step == 4.0
    assert _shown(progress) == "R=0.500 4.00s/step a=0.25"  # the last step alone: 1.00
    progress.update(4, {"reward/weighted/mean": 0.5})  # a record without a time leaves the mean
    assert progress.seconds_per_step == 4.0


def test_a_resumed_run_averages_only_its_own_steps():
    progress = TrainProgress(total=10, enabled=False, start=6)
    progress.update(7, {"reward/weighted/mean": 1.0, "c_q/median": 0.9, "time/step": 3.0})
    assert _shown(progress) == "R=1.000 c_q=0.90 3.00s/step"


def test_the_sft_progress_shows_the_mean_seconds_per_step():
    progress = _SFTProgress(total=3, enabled=False)
    progress.update(1, {"loss": 2.0, "time/step": 0.5})
    progress.update(2, {"loss": 1.5, "token_accuracy": 0.25, "time/step": 1.5})
    assert _shown(progress) == "loss=1.5000 acc=0.250 1.00s/step"
