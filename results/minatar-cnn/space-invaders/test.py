"""The pre-registered test of PREREGISTRATION.md on this directory's runs: the CNN's mean final
return minus the MLP's, with a 95% Welch t interval (scipy), and the exploratory numbers. The
study is a spec (`vaco_jax.study.specs`); this prints what `vaco-report --study minatar-space-invaders` does.

    python results/minatar-cnn/space-invaders/test.py
"""

from vaco_jax.study import specs

if __name__ == "__main__":
    print(specs.two_arms(specs.TWO_ARMS["minatar-space-invaders"]))
