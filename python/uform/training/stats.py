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

    def record(self, step: int, learning_rate: float, losses, truncated: int, dropped: int) -> None:
        """Write a step's report: its number, its rate, its losses (the world step's), the items it cut and the
        segments dropped since the last report."""
        self.step, self.learning_rate, self.loss = step, learning_rate, losses.total
        self.contrastive_loss, self.masked_text_loss = losses.contrastive, losses.masked
        self.masked_image_loss = losses.reconstruction.get("image", 0.0)
        self.masked_video_loss = losses.reconstruction.get("video", 0.0)
        self.masked_audio_loss = losses.reconstruction.get("audio", 0.0)
        self.late_interaction_loss, self.choices_loss = losses.late_interaction, losses.choices
        self.truncated, self.dropped = truncated, dropped

    def reset(self) -> None:
        """Zeroes every field, as a failed step leaves them."""
        for f in fields(self):
            setattr(self, f.name, f.default)
