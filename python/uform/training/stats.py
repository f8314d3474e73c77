"""What a training step reports (``uform_trainer_step_stats_t``).

A step passed a ``TrainerStepStats`` overwrites every field; a failed step
leaves it zeroed, which is also where a new one starts. Every loss is its world
mean across the run's processes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class TrainerStepStats:
    """The report slot of ``Trainer.step``, every field zero until a step writes it."""

    step: int = 0
    """The optimizer step the call applied, counted from one across resumes."""
    learning_rate: float = 0.0
    """The learning rate it applied."""
    loss: float = 0.0
    """The total loss the step minimized."""
    contrastive_loss: float = 0.0
    """The contrastive term; zero when the objective is masked alone."""
    masked_text_loss: float = 0.0
    """The text reconstruction term, before its weight; zero when absent."""
    masked_image_loss: float = 0.0
    """The image reconstruction term, before its weight; zero when absent."""
    masked_video_loss: float = 0.0
    """The video reconstruction term, before its weight; zero when absent."""
    masked_audio_loss: float = 0.0
    """The audio reconstruction term, before its weight; zero when absent."""
    late_interaction_loss: float = 0.0
    """The late-interaction term, weighted; zero when absent."""
    choices_loss: float = 0.0
    """The choices term over the items that made a choice, before its weight; zero when absent."""
    truncated: int = 0
    """Items cut at a row's width."""
    dropped: int = 0
    """Segments dropped whole for lack of room, since the last step that read its stats."""

    def reset(self) -> None:
        """Zeroes every field, as a failed step leaves them."""
        for f in fields(self):
            setattr(self, f.name, f.default)
