"""HTML main-content selection and boilerplate pruning: landmarks found in one pass
(<main>, <article>s, <title>, metas, JSON-LD), the content root, and the noise filter that
drops scripts, hidden elements and page chrome (navigation, cookie banners, sidebars,
footers) unless they hold most of the text.

Every walk over the tree is iterative (explicit stacks), so deep nesting does not raise
RecursionError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from bs4 import BeautifulSoup, NavigableString, Tag
from bs4.element import Comment, Declaration, Doctype, ProcessingInstruction

ALWAYS_SKIP = frozenset(
    "script style noscript template svg math iframe object embed canvas button select option "
    "textarea input head title meta link dialog map area audio video source track".split()
)
_CHROME_TAGS = frozenset({"nav", "aside", "footer", "form", "header"})
_NOISE_PREFIXES = ("cookie", "consent", "gdpr", "nav", "menu", "footer", "sidebar", "breadcrumb", "advert")
_NOISE_TOKENS = frozenset(
    "banner noprint editsection catlinks printfooter skip toc share social ads popup modal".split()
)
SKIPPED_STRINGS = (Comment, Declaration, Doctype, ProcessingInstruction)
_TOKEN_SPLIT = re.compile(r"[\s_\-]+")


def _noise_by_attributes(tag: Tag) -> bool:
    names = " ".join([str(tag.get("id") or ""), *(tag.get("class") or [])]).lower()
    for token in _TOKEN_SPLIT.split(names):
        if token in _NOISE_TOKENS or token.startswith(_NOISE_PREFIXES):
            return True
    return False


def _hidden(tag: Tag) -> bool:
    if tag.has_attr("hidden") or tag.get("aria-hidden") == "true":
        return True
    style = str(tag.get("style") or "").replace(" ", "").lower()
    return "display:none" in style or "visibility:hidden" in style


def _subtree_facts(root: Tag) -> dict[int, tuple[int, bool]]:
    """Per tag id: (text length of its subtree, whether it holds an h1-h3); one iterative pass."""
    facts: dict[int, tuple[int, bool]] = {}
    stack: list[tuple[Tag, list[int], list[bool]]] = [(root, [0], [False])]
    iters = [iter(root.children)]
    while stack:
        tag, length, heading = stack[-1]
        child = next(iters[-1], None)
        if child is None:
            stack.pop()
            iters.pop()
            facts[id(tag)] = (length[0], heading[0] or tag.name in ("h1", "h2", "h3"))
            if stack:
                stack[-1][1][0] += length[0]
                stack[-1][2][0] = stack[-1][2][0] or facts[id(tag)][1]
        elif isinstance(child, Tag):
            if child.name not in ALWAYS_SKIP:
                stack.append((child, [0], [False]))
                iters.append(iter(child.children))
        elif isinstance(child, NavigableString) and not isinstance(child, SKIPPED_STRINGS):
            length[0] += len(child.strip())
    return facts


class NoiseFilter:
    """Decides which elements under a content root are noise (never read)."""

    def __init__(self, root: Tag) -> None:
        self.root = root
        self.facts = _subtree_facts(root)
        self.total_text = self.facts.get(id(root), (0, False))[0]

    def is_noise(self, tag: Tag) -> bool:
        if tag.name in ALWAYS_SKIP or _hidden(tag):
            return True
        if tag is self.root or tag.name in ("main", "article", "body", "html"):
            return False
        if tag.name not in _CHROME_TAGS and not _noise_by_attributes(tag):
            return False
        length, has_heading = self.facts.get(id(tag), (0, False))
        if tag.name == "header" and has_heading and not _noise_by_attributes(tag):
            return False
        return length <= 0.5 * self.total_text or self.total_text == 0


@dataclass
class Landmarks:
    """Elements found in one pass over the tree (instead of a find_all per question)."""

    html: Tag | None = None
    title: Tag | None = None
    main: Tag | None = None
    articles: list[Tag] = field(default_factory=list)
    metas: dict[str, str] = field(default_factory=dict)  # name/property/itemprop -> content
    json_ld: list[str] = field(default_factory=list)


def find_landmarks(soup: BeautifulSoup) -> Landmarks:
    found = Landmarks()
    for tag in soup.descendants:
        if not isinstance(tag, Tag):
            continue
        name = tag.name
        if name == "meta" and tag.get("content"):
            key = str(tag.get("name") or tag.get("property") or tag.get("itemprop") or "").lower()
            found.metas.setdefault(key, str(tag["content"]).strip())
        elif name == "script" and tag.get("type") == "application/ld+json":
            found.json_ld.append(tag.string or "")
        elif name == "article":
            found.articles.append(tag)
        elif found.main is None and (name == "main" or tag.get("role") == "main"):
            found.main = tag
        elif name == "title" and found.title is None:
            found.title = tag
        elif name == "html" and found.html is None:
            found.html = tag
    return found


def content_root(soup: BeautifulSoup, marks: Landmarks) -> Tag:
    """<main>, else the largest <article>, else <body>, else the whole document."""
    if marks.main is not None:
        return marks.main
    if marks.articles:
        return max(marks.articles, key=lambda a: len(a.get_text()))
    return soup.body if isinstance(soup.body, Tag) else soup
