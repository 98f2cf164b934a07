# vaco_jax first: it sets the level of XLA's C++ log lines before jax is imported.
import vaco_jax  # noqa: F401
