"""The mojolearn import name: its ``SmallByteLanguageModelTrainer`` API, served by uform's engine."""

from uform.lm import corpus as lm_corpus
from uform.lm import LanguageModelConfig, LanguageModelTrainer, SmallByteLanguageModelTrainer

__all__ = ["LanguageModelConfig", "LanguageModelTrainer", "SmallByteLanguageModelTrainer", "lm_corpus"]
