"""Every relative link of the README, docs/ and the results archive reaches a file, and every #anchor
a heading of it; no sentence is too long to hold; no page retypes an estimate with its interval."""

import pathlib
import re

import pytest

from vaco_jax.study import specs

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES = [*DOCS, ROOT / "results" / "archive" / "README.md"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str):
    """The lines outside fenced code blocks (a `# comment` in a bash block is not a heading)."""
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield line


def anchors(path: pathlib.Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats -1, -2."""
    seen: dict[str, int] = {}
    ids = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))   # a link: its text
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        ids.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return ids


def test_anchors_follow_githubs_rules():
    page = ROOT / "results" / "archive" / "README.md"
    assert {"hopper-at-1m-env-steps-c--1-and-c--16",
            "dm-control-suite-the-cartpole-tasks-cpu-dmc"} <= anchors(page)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page):
    broken = []
    for line in prose_lines(page.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):      # https:, mailto:, ...
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists():
                broken.append(f"{target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{target} (no heading with that anchor)")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


# --- sentences a reader can hold ------------------------------------------------------------------
LONGEST_SENTENCE = 60                     # words; aim under 40
ABBREVIATION = re.compile(r"\b(e\.g|i\.e|et al|vs|cf)\.$", re.IGNORECASE)
SENTENCE_END = re.compile(r"(?<=[.!?])[)*_]*\s+(?=[\"'(*`_\[A-Z0-9])")


def paragraphs(text: str):
    """The prose of a page, a paragraph or list item at a time: code blocks, tables, headings,
    images and HTML comments left out."""
    lines: list[str] = []
    for line in [*prose_lines(text), ""]:
        item = line.strip().removeprefix("> ").strip()
        skip = not item or item.startswith(("|", "#", "![", "<!--")) or FENCE.match(line)
        if lines and (skip or re.match(r"([*+-]|\d+\.)\s", item)):
            yield " ".join(lines)
            lines = []
        if not skip:
            lines.append(re.sub(r"^([*+-]|\d+\.)\s+", "", item) if not lines else item)


def sentences(text: str):
    for paragraph in paragraphs(text):
        paragraph = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", paragraph)     # a link: its text
        # A full stop inside `code` ends no sentence.
        paragraph = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(".", "\x00"), paragraph)
        sentence = ""
        for part in SENTENCE_END.split(paragraph):
            sentence = f"{sentence} {part}".strip()
            if not ABBREVIATION.search(sentence):
                yield sentence.replace("\x00", ".")
                sentence = ""
        if sentence:
            yield sentence.replace("\x00", ".")


def words(sentence: str) -> int:
    return sum(1 for token in sentence.split() if re.search(r"\w", token))


def test_sentences_split_at_full_stops_but_not_inside_code_or_abbreviations():
    text = ("# A heading. Not prose.\n\nOne two three. Four, e.g. five `a. B` six.\n"
            "| a table. Not prose. |\n\n* An item\n* Another. And more.\n```\ncode. Not prose.\n```\n")
    assert list(sentences(text)) == ["One two three.", "Four, e.g. five `a. B` six.", "An item",
                                     "Another.", "And more."]
    assert words("A [link](x) — and `code` 0.5.") == 5


@pytest.mark.parametrize("page", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_no_sentence_is_longer_than_a_reader_can_hold(page):
    long = [f"{words(s)} words: {s}" for s in sentences(page.read_text(encoding="utf-8"))
            if words(s) > LONGEST_SENTENCE]
    assert not long, f"{page.relative_to(ROOT)}: " + "\n".join(long)


# An estimate with its interval ("0.58 [0.56, 0.59]", "0.828 ± 0.005") is a result: the README and
# the docs link to (or `vaco-report --all` writes) the generated file that holds it.
INTERVAL = re.compile(r"\d\.\d+\*{0,2} (?:±|\[[−+-]?\d)")
MEASURED_HERE = {"docs/performance.md"}   # speed ratios of named machines, each with its benchmark run


def typed_estimates(text: str) -> list[str]:
    """The prose lines that hold an estimate with its interval: outside code (fenced or inline) and
    outside the README's block that `vaco-report --all` writes."""
    begin, end = specs.README_BEGIN, specs.README_END
    if begin in text and end in text:
        text = text[:text.index(begin)] + text[text.index(end) + len(end):]
    prose = re.sub(r"`[^`]*`", "", "\n".join(prose_lines(text)))   # inline code may wrap a line
    return [line for line in prose.splitlines() if INTERVAL.search(line)]


def test_an_estimate_with_its_interval_is_found_in_prose_and_tables_but_not_in_code_or_results():
    text = (f"Kept 0.58 [0.56, 0.59].\n| vaco | **0.828 ± 0.005** |\nprinted `1.0 ± 0.0`\n"
            f"```\n0.5 [0.1, 0.9]\n```\n{specs.README_BEGIN}\n| 0.3 [0.1, 0.4] |\n"
            f"{specs.README_END}\nlr 3e-4 [default], k = 0 [sync]\n")
    assert typed_estimates(text) == ["Kept 0.58 [0.56, 0.59].", "| vaco | **0.828 ± 0.005** |"]


@pytest.mark.parametrize("page", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_no_page_retypes_an_estimate_with_its_interval(page):
    if str(page.relative_to(ROOT)) in MEASURED_HERE:
        pytest.skip("speed measurements of named machines, not committed results")
    typed = typed_estimates(page.read_text(encoding="utf-8"))
    assert not typed, f"{page.relative_to(ROOT)} retypes: " + "\n".join(typed)
