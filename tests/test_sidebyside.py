"""common/tools/sidebyside.py: the produced HTML, parsed back with html.parser, has the promised structure.

Small fixture files stand in for the algorithm files, so these tests do not depend on them.
"""
import os
import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from common.tools import sidebyside

FILLER_1 = [f"VALUE_{k} = {k}" for k in range(20)]  # long unchanged runs: must be folded
FILLER_2 = [f"OTHER_{k} = {k}" for k in range(20)]
NOTE = "SCALE = 1.0  # eq. (85): cited in another paragraph, so no label for the hunk below the blank line"

LEFT = ['"""Base file (eq. 90-97)."""', "import torch", "", ""] + FILLER_1 + [
    NOTE,
    "",
    "def policy_loss(ratio, adv, clip_eps=0.2):",
    "    # eq. (96): token-level clipped surrogate",
    "    unclipped = ratio * adv",
    "    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv",
    "    per_token = -torch.min(unclipped, clipped)",
    "    return per_token.mean()",
    "",
] + FILLER_2 + ["def old_helper():", "    return 1"]

RIGHT = ['"""Variant file (eq. (101)-(102))."""', "import torch", "", ""] + FILLER_1 + [
    NOTE,
    "",
    "def policy_loss(ratio, adv, clip_eps_low=0.2, clip_eps_high=0.28):",
    "    # eq. (96): token-level clipped surrogate",
    "    unclipped = ratio * adv",
    "    clipped = ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high) * adv",
    "    per_token = -torch.min(unclipped, clipped)",
    "    # eq. 102: token mean over the whole batch",
    "    return per_token.sum() / mask.sum()",
    "",
] + FILLER_2

# Hunks in page order and the labels each must carry.
EXPECTED_LABELS = [
    ["eq. 90-97", "eq. 101-102"],  # cited on the changed lines themselves (both sides)
    [],                            # the def line: a blank line above it ends the search (NOTE is not used)
    ["eq. 96"],                    # the clamp line: from the comment just above it
    ["eq. 102"],                   # the changed lines cite eq. 102: the comment above is not used
    [],                            # old_helper removed
]


class Node:
    def __init__(self, tag, attrs, parent=None):
        self.tag, self.attrs, self.parent, self.children = tag, dict(attrs), parent, []

    @property
    def classes(self):
        return (self.attrs.get("class") or "").split()

    def text(self):
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def find_all(self, tag, cls=None):
        for c in self.children:
            if isinstance(c, Node):
                if c.tag == tag and (cls is None or cls in c.classes):
                    yield c
                yield from c.find_all(tag, cls)


class Tree(HTMLParser):
    """A minimal DOM: enough to walk rows and cells of the page."""
    VOID = {"meta", "col", "br", "link", "img", "input"}

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.root = self.node = Node("root", {})
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        node = Node(tag, attrs, self.node)
        self.node.children.append(node)
        if tag not in self.VOID:
            self.node = node

    def handle_endtag(self, tag):
        node = self.node
        while node is not self.root and node.tag != tag:
            node = node.parent
        if node is not self.root:
            self.node = node.parent

    def handle_data(self, data):
        self.node.children.append(data)


def code_rows(tree):
    """Every code row as (left (num, text, classes) or None, right ... or None, folded?)."""
    rows = []
    for tbody in tree.root.find_all("tbody"):
        for tr in (c for c in tbody.children if isinstance(c, Node) and c.tag == "tr"):
            tds = [c for c in tr.children if isinstance(c, Node) and c.tag == "td"]
            if len(tds) != 4:
                continue  # hunk label row or fold toggle row
            sides = []
            for num, code in (tds[0:2], tds[2:4]):
                sides.append(None if "empty" in code.classes else (int(num.text()), code.text(), code.classes))
            rows.append((sides[0], sides[1], "fold" in tbody.classes))
    return rows


@pytest.fixture
def root(tmp_path):
    for name, lines in (("grpo.py", LEFT), ("dapo.py", RIGHT), ("gspo.py", LEFT[:-1])):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    return tmp_path


def render(root, out, left="grpo.py", right="dapo.py"):
    sidebyside.main([left, right, "--root", str(root), "-o", str(out)])
    return Tree(out.read_text())


def test_citations_are_found_and_normalised():
    assert sidebyside.citations("# eq. (96): token-level clipped surrogate") == ["eq. 96"]
    assert (sidebyside.citations("x  # eq. 90-91 and Eq. (117)-(119), eq. 80/81")
            == ["eq. 90-91", "eq. 117-119", "eq. 80/81"])
    assert sidebyside.citations("freq. 5, seq. 3, no equation here") == []
    assert sidebyside.citations("the form of eq. (120), 2(τ(r−1)/2), and eq. 97, 0.5") == ["eq. 120", "eq. 97"]


def test_every_changed_line_is_present_and_marked(root, tmp_path):
    rows = code_rows(render(root, tmp_path / "p.html"))
    lefts = {r[0][0]: r[0] for r in rows if r[0]}
    rights = {r[1][0]: r[1] for r in rows if r[1]}
    # Every line of both files is on the page, at its line number (folded or not).
    assert [lefts[n][1] for n in sorted(lefts)] == LEFT
    assert [rights[n][1] for n in sorted(rights)] == RIGHT
    for lines, others, side, marks in ((LEFT, RIGHT, lefts, {"chg", "del"}), (RIGHT, LEFT, rights, {"chg", "add"})):
        for n, line in enumerate(lines, 1):
            changed = line not in others  # the fixture's lines are unique, so this is "changed"
            assert bool(marks & set(side[n][2])) == changed, (n, line, side[n][2])
    # A line with no partner on the other side is a pure removal/addition next to an empty cell.
    removed = [r for r in rows if r[1] is None]
    added = [r for r in rows if r[0] is None]
    assert ({r[0][1] for r in removed} == {"def old_helper():", "    return 1"}
            and all("del" in r[0][2] for r in removed))
    assert [r[1][1] for r in added] == ["    # eq. 102: token mean over the whole batch"] and "add" in added[0][1][2]
    # Inside a changed block each line faces its new version, not merely the next line down.
    pairs = {r[0][1]: r[1][1] for r in rows if r[0] and r[1] and "chg" in r[0][2]}
    assert pairs["    return per_token.mean()"] == "    return per_token.sum() / mask.sum()"
    # Changed words are marked inside the changed line, the rest of it is not.
    page = (tmp_path / "p.html").read_text()
    assert "<del>clip_eps</del>" in page and "<ins>clip_eps_low</ins>" in page and "<ins>clip_eps_high</ins>" in page
    assert "<del>ratio</del>" not in page
    # Header counts: 4 paired lines, 1 added, 2 removed.
    _, stats, _ = sidebyside.render_pair("a", "b", LEFT, RIGHT)
    assert stats == {"changed": 4, "added": 1, "removed": 2}
    assert "4</b> lines changed, <b>1</b> added, <b>2</b> removed" in page


def test_long_unchanged_runs_are_folded_with_context(root, tmp_path):
    tree = render(root, tmp_path / "p.html")
    folds = list(tree.root.find_all("tbody", "fold"))
    hidden = []
    for tbody in folds:
        rows = [c for c in tbody.children if isinstance(c, Node) and c.tag == "tr"]
        toggle, lines = rows[0], rows[1:]
        n = int(tbody.attrs["data-lines"])
        assert "toggle" in toggle.classes and f"{n} unchanged lines" in toggle.text()
        assert len(lines) == n
        hidden.append([tr.find_all("td", "code").__next__().text() for tr in lines])
    # The two 20-line runs (plus the blank lines around them) are folded, 3 lines of context stay visible.
    assert len(folds) == 2
    assert hidden[0] == (["import torch", "", ""] + FILLER_1 + [NOTE, ""])[3:-3]
    assert hidden[1] == ([""] + FILLER_2)[3:-3]
    visible = {r[0][1] for r in code_rows(tree) if r[0] and not r[2]}
    assert {"import torch", "VALUE_19 = 19", NOTE, "OTHER_0 = 0", "OTHER_1 = 1"} <= visible
    assert "    unclipped = ratio * adv" in visible  # short unchanged runs between hunks stay unfolded


def test_hunks_are_labelled_with_the_cited_equations(root, tmp_path):
    tree = render(root, tmp_path / "p.html")
    hunks = list(tree.root.find_all("tr", "hunk"))
    labels = [[s.text() for s in h.find_all("span", "eq")] for h in hunks]
    assert labels == EXPECTED_LABELS
    assert [bool(list(h.find_all("span", "noeq"))) for h in hunks] == [not x for x in EXPECTED_LABELS]
    # The header links each touched equation to its first hunk.
    header = next(tree.root.find_all("header"))
    links = {a.text(): a.attrs["href"] for a in header.find_all("a")}
    assert links == {"eq. 90-97": "#h1", "eq. 101-102": "#h1", "eq. 96": "#h3", "eq. 102": "#h4"}
    # Each label of a hunk links to its (first) equation's entry on the equation page, written next to the page.
    hrefs = [[a.attrs["href"] for a in h.find_all("a")] for h in hunks]
    assert hrefs == [["equations.html#eq-90", "equations.html#eq-101"], [], ["equations.html#eq-96"],
                     ["equations.html#eq-102"], []]
    equations = (tmp_path / "equations.html").read_text()
    assert all(f'id="{h.split("#")[1]}"' in equations for row in hrefs for h in row)


# A sibling pair shaped like grpo.py -> dapo.py around the clip fraction: which comment speaks for which line.
ARGS_L = ["class Args:", "    clip_eps: float = 0.2", '    """clip range (eq. 96)"""',
          "    vf_coef: float = 0.5", '    """value loss coefficient (eq. 85)"""']
ARGS_R = ["class Args:", "    clip_eps_low: float = 0.2", '    """lower clip range (eq. 101)"""',
          "    clip_eps_high: float = 0.28", '    """upper clip range (eq. 101)"""',
          "    vf_coef: float = 0.5", '    """value loss coefficient (eq. 85)"""',
          "    target_kl: float = 0.01", '    """stop the epochs early above this KL"""']
LOOP = ["", "", "def update(args, ratio, loss, stats):",
        "    # 5. Gradient steps on the {} surrogate (eq. {}).",
        "    for epoch in range(4):",
        "        loss = objective(ratio)",
        "        # Each micro-batch is already divided by the whole batch's count: the sum is eq. ({}).",
        "        loss.backward()",
        "        with torch.no_grad():",
        "            clipped = {}.float()",
        "            stats.append(clipped.mean())",
        "            stats.append(ratio.{}())",
        "    return stats"]
SCOPE_L = ARGS_L + [x.format(*a) if "{}" in x else x for x, a in zip(LOOP, [()] * 3 + [
    ("clipped", "96-97"), (), (), ("97",), (), (), ("((ratio - 1).abs() > args.clip_eps)",), (), ("mean",), ()])]
SCOPE_R = ARGS_R + [x.format(*a) if "{}" in x else x for x, a in zip(LOOP, [()] * 3 + [
    ("decoupled-clip", "101-102"), (), (), ("102",), (), (),
    ("((ratio < 1 - args.clip_eps_low) | (ratio > 1 + args.clip_eps_high))",), (), ("max",), ()])]


def test_labels_come_from_the_comment_that_speaks_for_the_changed_code():
    _, _, hunks = sidebyside.render_pair("grpo.py", "dapo.py", SCOPE_L, SCOPE_R)
    assert hunks == [
        ["eq. 96", "eq. 101"],            # the changed Args fields cite on their own lines
        [],                               # target_kl: the docstring above it belongs to vf_coef, not to it
        ["eq. 96-97", "eq. 101-102"],     # the paragraph headings themselves
        ["eq. 97", "eq. 102"],            # the comment over loss.backward() itself
        # The clip fraction: the comment above speaks for loss.backward() only; the names the line swaps,
        # clip_eps -> clip_eps_low/clip_eps_high, are defined with eq. 96 and eq. 101 (it used to say eq. 102).
        ["eq. 96", "eq. 101"],
        ["eq. 96-97", "eq. 101-102"],     # ratio.mean() -> ratio.max(): nothing closer than the paragraph heading
    ]


def test_comment_scopes():
    """A comment inside a paragraph speaks for the one statement below it (continuation lines included);
    one that opens a paragraph or a block speaks for all of it, until a blank line or a dedent."""
    lines = ["x = 1", "# for y only (eq. 80)", "y = f(", "    2,", ")", "z = 3", "",
             "# heading (eq. 85)", "if z:", "    w = 4", "    # for v only (eq. 96)", "    v = 5", "    s = 8",
             "u = 6", "", "def g():", "    # opens the block (eq. 97)", "    a = 1", "    b = 2", "c = 3"]
    over, heading = zip(*sidebyside.comment_scopes(lines))
    e1, e2, e3, e4 = ["eq. 80"], ["eq. 85"], ["eq. 96"], ["eq. 97"]
    assert list(over) == [[], e1, e1, e1, e1, [], [], [], [], [], e3, e3, [], [], [], [], [], [], [], []]
    assert list(heading) == [[]] * 7 + [e2] * 7 + [[], []] + [e4] * 3 + [[]]


def test_markdown_subset():
    md = "\n".join([
        "# Title", "Intro with `a<b`, **bold**, *it* and [a link](#eq-97).", "",
        '<a id="eq-97"></a>', "### (97) Thing", "",
        "```text", "x < y  &  z", "```", "",
        "| a | b |", "|---|---|", "| `c` | d |", "",
        "- one", "  two", "- three", "",
        "1. first", "2. second", "---"])
    html = sidebyside.markdown_html(md)
    for part in ("<h1>Title</h1>", "<code>a&lt;b</code>", "<b>bold</b>", "<i>it</i>", '<a href="#eq-97">a link</a>',
                 '<a id="eq-97"></a>\n<h3>(97) Thing</h3>', "<pre><code>x &lt; y  &amp;  z</code></pre>",
                 "<table><tr><th>a</th><th>b</th></tr><tr><td><code>c</code></td><td>d</td></tr></table>",
                 "<ul><li>one two</li><li>three</li></ul>", "<ol><li>first</li><li>second</li></ol>", "<hr>"):
        assert part in html, part


def test_the_equation_page_converts_whole(tmp_path):
    """Every anchor of common/EQUATIONS.md is an id of equations.html, and no markdown is left over."""
    with open(sidebyside.EQUATIONS, encoding="utf-8") as f:
        md = f.read()
    out = sidebyside.write_equations(str(tmp_path), str(tmp_path))  # no common/ under tmp_path: the repo's page
    tree = Tree((tmp_path / "equations.html").read_text())
    ids = {n.attrs["id"] for tag in ("a", "h1") for n in tree.root.find_all(tag) if "id" in n.attrs}
    assert out and set(re.findall(r'<a id="([^"]+)"></a>', md)) <= ids
    assert len(list(tree.root.find_all("pre"))) == md.count("```") // 2
    text = tree.root.text()
    assert "**" not in text and "](#" not in text and "<a id" not in text
    hrefs = [a.attrs["href"] for a in tree.root.find_all("a") if "href" in a.attrs]
    assert [h for h in hrefs if h.startswith("#") and h[1:] not in ids] == []


def test_identical_files_say_no_differences(root, tmp_path):
    tree = render(root, tmp_path / "same.html", "grpo.py", "grpo.py")
    assert "No differences" in tree.root.text()
    assert not list(tree.root.find_all("tr", "hunk"))
    rows = code_rows(tree)
    assert all(r[2] and "same" in r[0][2] and "same" in r[1][2] for r in rows) and len(rows) == len(LEFT)


def test_all_writes_index_and_existing_pairs_and_skips_missing(root, tmp_path, capsys):
    out = tmp_path / "pages"
    sidebyside.main(["--all", "--root", str(root), "-o", str(out)])
    assert sorted(os.listdir(out)) == ["equations.html", "grpo-dapo.html", "grpo-gspo.html", "index.html"]
    printed = capsys.readouterr().out
    assert printed.count("skipped") == len(sidebyside.PAIRS) - 2 and "dr_grpo.py not found" in printed
    index = Tree((out / "index.html").read_text())
    links = {a.attrs["href"]: a.text() for a in index.root.find_all("a") if "equations" not in a.attrs["href"]}
    assert links == {"grpo-dapo.html": "grpo.py \u2192 dapo.py", "grpo-gspo.html": "grpo.py \u2192 gspo.py"}
    eq_links = {a.attrs["href"] for a in index.root.find_all("a") if "equations" in a.attrs["href"]}
    assert eq_links == {"equations.html", "equations.html#eq-90", "equations.html#eq-96", "equations.html#eq-101",
                        "equations.html#eq-102"}
    counts = [[td.text() for td in tr.find_all("td", "c")] for tr in index.root.find_all("tr")][1:]
    assert counts[0] == ["5", "4", "1", "2"]  # grpo -> dapo: hunks, changed, added, removed
    assert counts[1] == ["1", "0", "0", "1"]  # grpo -> gspo: the last line removed


def test_all_without_any_pair_is_an_error(tmp_path):
    with pytest.raises(SystemExit) as e:
        sidebyside.main(["--all", "--root", str(tmp_path), "-o", str(tmp_path / "out")])
    assert "no page written" in str(e.value.code)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["grpo.py", "nope.py"], "cannot read"),
    (["grpo.py"], "give two files"),
    ([], "give two files"),
    (["grpo.py", "dapo.py", "--all"], "not both"),
    (["grpo.py", "dapo.py", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_input_is_one_clear_error_line(root, tmp_path, args, message):
    with pytest.raises(SystemExit) as e:
        sidebyside.main(args + ["--root", str(root), "-o", str(tmp_path / "x.html")])
    text = e.value.code  # a string: Python prints it to stderr and exits with status 1
    assert isinstance(text, str) and message in text and "\n" not in text and text.startswith("sidebyside: error:")
    assert not (tmp_path / "x.html").exists()


def test_command_line_from_another_folder(root, tmp_path):
    """The real CLI: file names resolve against the root, and a missing file is one line, no traceback."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=repo)
    cmd = [sys.executable, "-m", "common.tools.sidebyside", "--root", str(root)]
    ok = subprocess.run(cmd + ["grpo.py", "dapo.py", "-o", "p.html"], cwd=tmp_path, env=env, capture_output=True,
                        text=True)
    assert ok.returncode == 0 and (tmp_path / "p.html").exists(), ok.stderr
    bad = subprocess.run(cmd + ["grpo.py", "missing.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "missing.py" in bad.stderr
    assert "Traceback" not in bad.stderr
