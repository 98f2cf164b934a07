"""Platform choices made when vaco_jax is imported."""

import pytest

from vaco_jax import headless_gl_backend


@pytest.mark.parametrize("platform, environ, expected", [
    ("linux", {}, "egl"),                                   # a server or CI: no display
    ("linux", {"DISPLAY": ":0"}, None),                     # a desktop: MuJoCo's own choice (GLFW)
    ("linux", {"WAYLAND_DISPLAY": "wayland-0"}, None),
    ("linux", {"MUJOCO_GL": "osmesa"}, None),               # the user's choice is kept
    ("darwin", {}, None),                                   # macOS has no EGL (CGL, display or not)
    ("darwin", {"MUJOCO_GL": "egl"}, None),
    ("win32", {}, None),
])
def test_egl_is_chosen_only_on_linux_without_a_display(platform, environ, expected):
    assert headless_gl_backend(platform, environ, has_egl=lambda: True) == expected


def test_egl_is_not_chosen_where_libegl_is_missing():
    # Choosing EGL there would make `import mujoco` fail (PyOpenGL finds no EGL platform).
    assert headless_gl_backend("linux", {}, has_egl=lambda: False) is None
    assert headless_gl_backend("linux", {}, has_egl=lambda: True) == "egl"


def test_libegl_is_looked_for_only_when_egl_would_be_chosen():
    def refuse():
        raise AssertionError("looked for libEGL")
    assert headless_gl_backend("linux", {"DISPLAY": ":0"}, has_egl=refuse) is None
    assert headless_gl_backend("darwin", {}, has_egl=refuse) is None
