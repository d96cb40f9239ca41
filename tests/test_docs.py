"""The documentation holds: every relative link of the README, the guide, the equation page and the results pages
leads to a file (and, into a markdown page, to one of its headings or anchors), and every command the README and
the guide show is one its program accepts (the flags of an algorithm file or a tool, the lab's experiments)."""

import glob
import importlib
import os
import re
import shlex

import pytest

from conftest import ROOT

PAGES = ["README.md", "common/GUIDE.md", "common/EQUATIONS.md", *sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "common", "results", "**", "*.md"), recursive=True))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path: str) -> set[str]:
    """The anchors of a markdown page: GitHub's slugs of its headings, and explicit <a id="..."> tags."""
    text = open(path, encoding="utf-8").read()
    slugs = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        slugs.add(slug)
    return slugs


def links(page: str) -> list[str]:
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    return [target for target in LINK.findall(text) if not target.startswith(("http://", "https://", "mailto:"))]


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page):
    folder = os.path.dirname(os.path.join(ROOT, page))
    for target in links(page):
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(folder, path)) if path else os.path.join(ROOT, page)
        assert os.path.exists(full), f"{page}: the link ({target}) leads nowhere"
        if anchor and full.endswith(".md"):
            assert anchor in anchors(full), f"{page}: ({target}): no heading or anchor '{anchor}' in {path or page}"


def commands(page: str) -> list[list[str]]:
    """The command lines of a page's bash blocks, continuations joined, comments dropped, as words."""
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                found.append(words)
    return found


def check(words: list[str]) -> None:
    """Parse a command's arguments with the program's own parser (nothing runs)."""
    import tyro

    from common import llm

    if words[0] == "torchrun":
        words = ["python", *words[next(i for i, w in enumerate(words) if w.endswith(".py")):]]
    if words[0] in ("pip", "tensorboard", "diff", "git", "hf", "ruff") or words[:3] == ["python", "-m", "pytest"]:
        return
    assert words[0] in ("python", "python3"), words
    args = words[2:] if words[1] == "-m" else words[1:]
    args = args[: args.index("...")] if "..." in args else args  # an example that goes on: its flags so far
    if words[1] == "-m":
        module, args = args[0], args[1:]
        if module == "common.lab":
            from common.lab import lab, passk

            if args[0] == "sharpen-or-teach":
                return passk.main.__code__ and None  # its flags are checked by its own test (tests/test_lab.py)
            assert args[0] in [*lab.EXPERIMENTS, lab.TOY, "all"], words
            return
        tool = importlib.import_module(module)
        if hasattr(tool, "parse_args"):
            tool.parse_args(args)
        return
    script = args[0]
    name = os.path.basename(script).removesuffix(".py")
    file = importlib.import_module(name)
    parsed = tyro.cli(file.Args, args=args[1:], config=(tyro.conf.DisallowNone,) if hasattr(file, "llm") else ())
    if hasattr(file, "llm"):  # a group file: its defaults and its one-line checks, as its main block runs them
        llm.resolve_defaults(parsed)


@pytest.mark.parametrize("page", ["README.md", "common/GUIDE.md"])
def test_every_command_shown_is_one_its_program_accepts(page, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    shown = commands(page)
    assert len(shown) >= 5, page
    for words in shown:
        try:
            check(words)
        except SystemExit as e:  # argparse and tyro say no with SystemExit
            pytest.fail(f"{page}: `{shlex.join(words)}` is refused: {e}")
