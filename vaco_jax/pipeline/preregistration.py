"""Pre-registered families, Holm, verdicts and the ancestry check live in
`vaco_jax.analysis.families`; this name stays for the code that imports it from here (each rule is
defined once, there)."""

from vaco_jax.analysis import families as _families
from vaco_jax.analysis.families import ALPHA, STATUS, WORDS, descends_from, family, verdict  # noqa: F401


def status(commits, registration: str, descends=None) -> tuple[str, str]:
    """`analysis.families.status`, with this module's `descends_from` as the default ancestry
    check (looked up when called, so that replacing it here replaces it for the callers here)."""
    return _families.status(commits, registration,
                            descends or (lambda commit, ancestor: descends_from(commit, ancestor)))
