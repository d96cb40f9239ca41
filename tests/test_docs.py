"""The documentation holds: every relative link of the README, the guide, the equation page and the results pages
leads to a file (and, into a markdown page, to one of its headings or anchors), every file and section that the
docstrings and comments of the code point to exists (forms: see `pointers`), and every command the README and
the guide show is one its program accepts (the flags of an algorithm file or a tool, the lab's experiments)."""

import ast
import glob
import importlib
import io
import os
import re
import shlex
import tokenize

import pytest

from conftest import ROOT

PAGES = ["README.md", "common/GUIDE.md", "common/EQUATIONS.md", *sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "common", "results", "**", "*.md"), recursive=True))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def headings(path: str) -> list[str]:
    """The headings of a markdown page, as written (a `# comment` inside a code block is none)."""
    text = re.sub(r"```.*?```", "", open(path, encoding="utf-8").read(), flags=re.S)
    return [heading.strip() for heading in re.findall(r"^#+ (.+)$", text, flags=re.M)]


def anchors(path: str) -> set[str]:
    """The anchors of a markdown page: GitHub's slugs of its headings, and explicit <a id="..."> tags."""
    text = open(path, encoding="utf-8").read()
    slugs = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in headings(path):
        slug = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")
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


# ---------------------------------------------------------------------------------------------
# Pointers: the files and sections that the code's docstrings and comments (and the pages' prose) name

CODE = sorted(os.path.relpath(p, ROOT) for pattern in ("*.py", "common/**/*.py", "tests/**/*.py")
              for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))
REPO_FOLDERS = ("common", "tests", ".ci")  # a path that starts with one of these is a path into the repo
EXT = r"\.(?:py|md|jsonl|json|png)"
FOLDER_PATH = re.compile(rf"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+{EXT})(?:#([\w-]+))?")
BARE_NAME = re.compile(r"(?<![\w./-])(--[\w-]+ +)?([\w-]+\.(?:py|md))(?:#([\w-]+))?\b")
PAGE = r"(README(?:\.md)?|(?:[\w.-]+/)*[\w.-]+\.md)"
TITLE = re.compile(PAGE + r"""(?:'s(?:\s+(?:table|section))?|,)\s+"([^"]+)\"""")


def code_texts(path: str) -> list[tuple[int, str]]:
    """(first line, text) of each docstring (any bare string statement: Args fields have them too) and each run of
    comment lines of a .py file, comment lines joined without their `#`."""
    source = open(os.path.join(ROOT, path), encoding="utf-8").read()
    docstrings = {node.lineno for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                  and isinstance(node.value.value, str)}
    texts, comments = [], []  # comments: [first line, last line, text] of each run of comment lines
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        row = token.start[0]
        if token.type == tokenize.STRING and row in docstrings:
            texts.append((row, token.string))
        elif token.type == tokenize.COMMENT and comments and comments[-1][1] == row - 1:
            comments[-1][1:] = [row, comments[-1][2] + "\n" + token.string.lstrip("# ")]
        elif token.type == tokenize.COMMENT:
            comments.append([row, row, token.string.lstrip("# ")])
    return texts + [(first, text) for first, _, text in comments]


def pointers(text: str, bare: bool = True) -> list[tuple[int, str, str, str, str]]:
    """(line offset, pointer as written, file, anchor, section title) of each pointer in a text. The forms:

    - a path from the repo root into one of its folders, of a .py/.md/.json/.jsonl/.png file: `common/runs.py`,
      `tests/test_group_crossfile.py`, `common/results/lab/length-bias.png` (`path/to/file.jsonl`, `runs/...` and
      paths with placeholders such as `<experiment>.md` are examples, not pointers);
    - a bare .py or .md name: `ppo.py`, `README.md` (at the root, beside the file that names it, or a file of that
      name anywhere in the repo), except a flag's value (`--task my_task.py` names a file the user brings);
    - either followed by an anchor of a markdown page: `common/EQUATIONS.md#sec-ppo`, `README.md#quick-start`;
    - a page and a quoted heading of it: `README's "Quick start"`, `common/results/classic.md's table "Flags per
      environment"`, `the README's section "Tests"`, `(README, "Quick start")`. A heading named without quotes
      ("the README's testing section") is prose, not checked.
    """
    found = []

    def line(match):
        return text.count("\n", 0, match.start())

    for m in FOLDER_PATH.finditer(text):
        if m.group(1).split("/")[0] in REPO_FOLDERS:
            found.append((line(m), m.group(0), m.group(1), m.group(2), None))
    for m in BARE_NAME.finditer(text) if bare else []:
        if not m.group(1):
            found.append((line(m), m.group(0), m.group(2), m.group(3), None))
    for m in TITLE.finditer(text):
        page = m.group(1) if m.group(1).endswith(".md") else "README.md"
        found.append((line(m), m.group(0), page, None, " ".join(m.group(2).split())))
    return found


def resolve(name: str, beside: str) -> str | None:
    """The repo file a pointer names: a path from the root, or a bare name at the root, beside `beside` or anywhere
    in the repo's folders."""
    if "/" in name:
        return name if os.path.isfile(os.path.join(ROOT, name)) else None
    for folder in ("", os.path.dirname(beside)):
        if os.path.isfile(os.path.join(ROOT, folder, name)):
            return os.path.join(folder, name)
    anywhere = [p for folder in REPO_FOLDERS for p in glob.glob(os.path.join(ROOT, folder, "**", name), recursive=True)]
    return os.path.relpath(anywhere[0], ROOT) if anywhere else None


def plain(heading: str) -> str:
    """A heading as a reader quotes it: no markdown marks, one space between words, any case."""
    return " ".join(re.sub(r"[`*_]", "", heading).split()).casefold()


def broken(path: str, first_line: int, text: str, bare: bool = True) -> list[str]:
    """'file:line: `pointer`: what is wrong' for each pointer of a text that leads nowhere."""
    problems = []
    for offset, written, name, anchor, title in pointers(text, bare):
        where = f"{path}:{first_line + offset}: `{' '.join(written.split())}`"
        target = resolve(name, path)
        if target is None:
            problems.append(f"{where}: no file {name} in the repo")
        elif anchor and target.endswith(".md") and anchor not in anchors(os.path.join(ROOT, target)):
            problems.append(f"{where}: {target} has no heading or anchor '{anchor}'")
        elif title and plain(title) not in {plain(h) for h in headings(os.path.join(ROOT, target))}:
            problems.append(f"{where}: {target} has no heading \"{title}\"")
    return problems


def test_pointer_forms():
    text = ("see common/EQUATIONS.md#sec-ppo and ppo.py; the README's \"Quick start\", (README, \"Tests\")\n"
            "common/results/classic.md's table \"Flags per\n    environment\"; --task my_task.py; path/to/file.jsonl,\n"
            "runs/x/model/config.json, <experiment>.md, common/lab/lab.py, the README's testing section")
    assert [(offset, name, anchor, title) for offset, _, name, anchor, title in pointers(text)] == [
        (0, "common/EQUATIONS.md", "sec-ppo", None), (1, "common/results/classic.md", None, None),
        (3, "common/lab/lab.py", None, None), (0, "ppo.py", None, None),
        (0, "README.md", None, "Quick start"), (0, "README.md", None, "Tests"),
        (1, "common/results/classic.md", None, "Flags per environment")]
    assert broken("x.py", 1, text) == []
    assert broken("x.py", 10, "one\ncommon/results/clasic.md and README.md#quick-stat, README's \"Quickstart\"") == [
        "x.py:11: `common/results/clasic.md`: no file common/results/clasic.md in the repo",
        "x.py:11: `README.md#quick-stat`: README.md has no heading or anchor 'quick-stat'",
        "x.py:11: `README's \"Quickstart\"`: README.md has no heading \"Quickstart\""]


@pytest.mark.parametrize("path", CODE)
def test_every_pointer_in_the_code_leads_somewhere(path):
    problems = [p for row, text in code_texts(path) for p in broken(path, row, text)]
    if problems:
        pytest.fail("pointers that lead nowhere:\n" + "\n".join(problems), pytrace=False)


@pytest.mark.parametrize("page", PAGES)
def test_every_pointer_in_the_pages_prose_leads_somewhere(page):
    # links are checked above, relative to their page; the prose names files from the repo root
    text = re.sub(r"\]\([^)\s]+\)", "]", open(os.path.join(ROOT, page), encoding="utf-8").read())
    problems = broken(page, 1, text, bare=False)  # a bare name in a page is relative to it: a link's business
    if problems:
        pytest.fail("pointers that lead nowhere:\n" + "\n".join(problems), pytrace=False)


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

    from common import policy

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
    parsed = tyro.cli(file.Args, args=args[1:], config=(tyro.conf.DisallowNone,) if hasattr(file, "policy") else ())
    if hasattr(file, "policy"):  # a group file: its defaults and its one-line checks, as its main block runs them
        policy.resolve_defaults(parsed, beta=file.BETA)


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
