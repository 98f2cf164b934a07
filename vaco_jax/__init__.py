"""vaco_jax: fully jitted asynchronous on-policy RL (VACO and baselines) on MuJoCo-MJX."""

from vaco_jax.config import Config, ConfigError, HParams
from vaco_jax.trainer import Trainer, TrainState, make_train, stack_hparams

__all__ = ["Config", "ConfigError", "HParams", "Trainer", "TrainState", "make_train",
           "stack_hparams"]
