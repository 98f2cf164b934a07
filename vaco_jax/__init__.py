"""vaco_jax: fully jitted asynchronous on-policy RL (VACO and baselines) on MuJoCo-MJX."""

from vaco_jax.config import Config, HParams
from vaco_jax.errors import CheckpointError, ConfigError, DivergenceError, SweepError
from vaco_jax.options import Options
from vaco_jax.trainer import Trainer, TrainState, make_train, stack_hparams

__all__ = ["CheckpointError", "Config", "ConfigError", "DivergenceError", "HParams", "Options",
           "SweepError", "Trainer", "TrainState", "make_train",
           "stack_hparams"]
