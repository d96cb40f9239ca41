"""Side-by-side diff pages: put two sibling files next to each other and let the diff be the lesson.

Usage (from any folder; file names are relative to the repository root):

    python -m common.sidebyside grpo.py dapo.py -o dapo.html   # one page
    python -m common.sidebyside --all -o /tmp/sidebyside       # every pair of the diff guide + index.html

Each page is one self-contained HTML file (inline CSS and a few lines of JS, no network):
the two files in two aligned columns with line numbers, changed lines highlighted
(left: replaced/removed, right: replaced/added, changed words marked darker), long unchanged
runs folded into a "N unchanged lines" row that opens on click, and every changed hunk labelled
with the seed equation(s) its comments cite ("# eq. (96): ..." gives the badge "eq. 96").

Standard library only: difflib finds the changes, html escapes the code, argparse reads the CLI.
"""
import argparse
import difflib
import html
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder above common/

# The diff guide: the learning path through the classic files, then each group method against GRPO.
PAIRS = [
    ("vpg.py", "a2c.py"), ("a2c.py", "ppo.py"), ("ppo.py", "trpo.py"),
    ("grpo.py", "dr_grpo.py"), ("grpo.py", "dapo.py"), ("grpo.py", "gspo.py"), ("grpo.py", "sapo.py"),
]

CONTEXT = 3   # unchanged lines kept visible on each side of a hunk
MIN_FOLD = 4  # fold only if at least this many lines would be hidden (folding 1-2 lines saves nothing)
LOOKBACK = 8  # how far above a hunk to look for a comment that cites an equation

# "eq. (96)", "eq. 90-91", "eq. (117)-(119)", "eq. 80/81", "eqs. 90, 91"; \b keeps "freq. 5" out.
EQ_RE = re.compile(r"\beqs?\.?\s*(\(?\d+\)?(?:\s*[-\u2013/,]\s*\(?\d+\)?)*)", re.IGNORECASE)
# Intra-line diffs work on words, spaces and single symbols: "clip_eps" changes as one unit.
TOKEN_RE = re.compile(r"\w+|\s+|[^\w\s]")


# ---------------------------------------------------------------- equation citations

def citations(text):
    """Equation labels cited in text, normalised: 'eq. (117)-(119)' -> 'eq. 117-119'."""
    labels = []
    for m in EQ_RE.finditer(text):
        nums = re.sub(r"[()\s]", "", m.group(1)).replace("\u2013", "-").replace(",", ", ")
        labels.append("eq. " + nums)
    return labels


def cited_above(lines, start):
    """Citations of the nearest citing line above lines[start], within the same paragraph."""
    for k in range(start - 1, max(start - 1 - LOOKBACK, -1), -1):
        if not lines[k].strip():  # a blank line ends the paragraph: comments beyond it are about other code
            break
        if citations(lines[k]):
            return citations(lines[k])
    return []


def hunk_labels(a, b, i1, i2, j1, j2):
    """Equations a hunk touches: cited on its changed lines, else just above it (either side)."""
    found = [c for line in a[i1:i2] + b[j1:j2] for c in citations(line)]
    if not found:
        found = cited_above(a, i1) + cited_above(b, j1)
    return list(dict.fromkeys(found))  # de-duplicate, keep order


# ---------------------------------------------------------------- rendering pieces

def esc(text):
    return html.escape(text, quote=False)


def mark(tag, text):
    """Wrap text in <tag>, leaving its outer spaces unmarked: the eye should land on the words."""
    core = text.strip()
    if not core:
        return text
    start = text.index(core)
    return f"{text[:start]}<{tag}>{core}</{tag}>{text[start + len(core):]}"


def inline_diff(old, new):
    """Both lines as HTML with the changed words wrapped in <del> (left) and <ins> (right)."""
    a, b = TOKEN_RE.findall(old), TOKEN_RE.findall(new)
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    # Share of visible characters the two lines have in common (spaces would make any two lines look alike).
    ink = lambda text: len("".join(text.split()))
    kept = sum(ink("".join(a[i1:i2])) for op, i1, i2, _, _ in ops if op == "equal")
    if 2 * kept < 0.5 * (ink(old) + ink(new)):  # mostly rewritten: marking nearly every word is noise
        return esc(old), esc(new)
    left, right = [], []
    for op, i1, i2, j1, j2 in ops:
        old_part, new_part = esc("".join(a[i1:i2])), esc("".join(b[j1:j2]))
        if op == "equal":
            left.append(old_part)
            right.append(new_part)
        else:
            left.append(mark("del", old_part))
            right.append(mark("ins", new_part))
    return "".join(left), "".join(right)


def row(ln, left, lcls, rn, right, rcls):
    """One table row: line number and code of each side; a missing side is an empty hatched cell."""
    def cells(n, code, cls):
        if n is None:
            return '<td class="num"></td><td class="code empty"></td>'
        indent = len(code) - len(code.lstrip(" "))  # a wrapped line continues 4 columns right of its own indent
        style = f' style="--i:{indent + 4}ch"' if indent else ""
        return f'<td class="num">{n}</td><td class="code {cls}"{style}>{code}</td>'
    return f"<tr>{cells(ln, left, lcls)}{cells(rn, right, rcls)}</tr>"


def equal_rows(a, b, i1, j1, n):
    return [row(i1 + k + 1, esc(a[i1 + k]), "same", j1 + k + 1, esc(b[j1 + k]), "same") for k in range(n)]


def fold(a, b, i1, j1, n):
    """A closed <tbody> holding n unchanged lines behind a clickable 'n unchanged lines' row."""
    toggle = (f'<tr class="toggle" onclick="this.parentNode.classList.toggle(\'open\')"><td colspan="4">'
              f'<span class="count">{n} unchanged lines</span> '
              f'<span class="where">{i1 + 1}\u2013{i1 + n} \u2194 {j1 + 1}\u2013{j1 + n}</span></td></tr>')
    hidden = "".join(equal_rows(a, b, i1, j1, n))
    # Closing and reopening the surrounding <tbody> lets one class ("open") show the whole run.
    return f'</tbody><tbody class="fold" data-lines="{n}">{toggle}{hidden}</tbody><tbody>'


# ---------------------------------------------------------------- the diff itself

def align(a, b, i1, i2, j1, j2):
    """Pair the lines of a changed block a[i1:i2] / b[j1:j2] so that each line faces its new version.

    The most similar pair is fixed first, then the parts above and below it are paired the same way
    (as difflib.Differ does); lines with nothing alike face each other row by row. Returns a list of
    (i, j) with None where a line has no partner: a pure removal (j None) or addition (i None).
    """
    best, bi, bj = 0.6, None, None  # below 0.6 two lines are different code, not an edit of one another
    if (i2 - i1) * (j2 - j1) <= 400:  # keep the search cheap on a large rewrite
        for i in range(i1, i2):
            for j in range(j1, j2):
                sm = difflib.SequenceMatcher(None, a[i], b[j], autojunk=False)
                if sm.quick_ratio() > best and sm.ratio() > best:
                    best, bi, bj = sm.ratio(), i, j
    if bi is None:
        n = max(i2 - i1, j2 - j1)
        return [(i1 + k if i1 + k < i2 else None, j1 + k if j1 + k < j2 else None) for k in range(n)]
    return align(a, b, i1, bi, j1, bj) + [(bi, bj)] + align(a, b, bi + 1, i2, bj + 1, j2)


def side_by_side(a, b):
    """Table body HTML for lines a (left) and b (right), the change counts and each hunk's labels."""
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    out, hunks = [], []
    stats = {"changed": 0, "added": 0, "removed": 0}
    for k, (op, i1, i2, j1, j2) in enumerate(ops):
        if op == "equal":
            n = i2 - i1
            head = CONTEXT if k > 0 else 0             # context after the previous hunk
            tail = CONTEXT if k < len(ops) - 1 else 0  # context before the next hunk
            if n - head - tail >= MIN_FOLD:
                out += equal_rows(a, b, i1, j1, head)
                out.append(fold(a, b, i1 + head, j1 + head, n - head - tail))
                out += equal_rows(a, b, i2 - tail, j2 - tail, tail)
            else:
                out += equal_rows(a, b, i1, j1, n)
            continue
        labels = hunk_labels(a, b, i1, i2, j1, j2)
        hunks.append(labels)
        badges = "".join(f'<span class="eq">{esc(x)}</span>' for x in labels) or '<span class="noeq">no equation cited</span>'
        out.append(f'<tr class="hunk" id="h{len(hunks)}"><td colspan="4">{badges}</td></tr>')
        for i, j in align(a, b, i1, i2, j1, j2):
            if i is not None and j is not None and a[i] == b[j]:  # e.g. blank lines difflib left inside a block
                out += equal_rows(a, b, i, j, 1)
            elif i is not None and j is not None:
                stats["changed"] += 1
                left, right = inline_diff(a[i], b[j])
                out.append(row(i + 1, left, "chg", j + 1, right, "chg"))
            elif i is not None:
                stats["removed"] += 1
                out.append(row(i + 1, esc(a[i]), "del", None, "", ""))
            else:
                stats["added"] += 1
                out.append(row(None, "", "", j + 1, esc(b[j]), "add"))
    return "<tbody>" + "\n".join(out) + "</tbody>", stats, hunks


# ---------------------------------------------------------------- pages

STYLE = """
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1f2328;background:#fff}
header{position:sticky;top:0;z-index:2;background:#f6f8fa;border-bottom:1px solid #d0d7de;padding:10px 16px 0}
h1{font-size:18px;margin:0 0 4px}
h1 .arrow{color:#8c959f;margin:0 .4em}
.meta{display:flex;flex-wrap:wrap;gap:6px 18px;align-items:center;margin-bottom:8px;color:#57606a}
.stats b{color:#1f2328}
.key{display:inline-block;padding:0 6px;border-radius:3px;font:12px/18px ui-monospace,monospace}
button{font:12px system-ui,sans-serif;padding:2px 8px;border:1px solid #d0d7de;border-radius:4px;background:#fff;cursor:pointer}
.files{display:grid;grid-template-columns:1fr 1fr;font:600 13px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.files div{padding:4px 8px;border-top:1px solid #d0d7de}
.files div+div{border-left:1px solid #d0d7de}
table{width:100%;border-collapse:collapse;table-layout:fixed;font:12.5px/1.5 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
col.n{width:3.4em}
td{vertical-align:top;padding:0 8px}
td.num{text-align:right;color:#8c959f;user-select:none;border-right:1px solid #eaeef2}
td.num+td.code+td.num{border-left:1px solid #d0d7de}
/* long lines wrap with a hanging indent, so a continuation never looks like a new, less-indented line */
td.code{white-space:pre-wrap;overflow-wrap:anywhere;tab-size:4;padding-left:calc(6px + var(--i,4ch));text-indent:calc(0px - var(--i,4ch))}
.del,.chg:nth-child(2){background:#ffebe9}
.add,.chg:nth-child(4){background:#e6ffec}
del{background:#ffb3ad;text-decoration:none;border-radius:2px}
ins{background:#8ee6a3;text-decoration:none;border-radius:2px}
.empty{background:repeating-linear-gradient(135deg,#f6f8fa 0 6px,#eef1f4 6px 12px)}
tr.hunk{scroll-margin-top:170px}
tr.hunk td{padding:6px 8px 2px;border-top:1px solid #d0d7de;background:#fff}
tbody:first-child tr.hunk:first-child td{border-top:0}
.eq,.noeq{display:inline-block;margin-right:6px;padding:0 8px;border-radius:10px;font:600 12px/20px system-ui,sans-serif}
.eq{background:#ddf4ff;color:#0550ae;border:1px solid #b6e3ff}
.noeq{color:#8c959f;border:1px solid #d0d7de;font-weight:400}
a .eq:hover{background:#b6e3ff}
tr.toggle td{cursor:pointer;background:#f1f8ff;color:#0969da;font:12px/24px system-ui,sans-serif;padding-left:4.4em;
  border-top:1px solid #d8e6f5;border-bottom:1px solid #d8e6f5}
tr.toggle td:hover{background:#ddf4ff}
tr.toggle .count::before{content:"\\25B8  "}
tbody.open tr.toggle .count::before{content:"\\25BE  "}
tr.toggle .where{color:#8c959f;margin-left:8px}
tbody.fold:not(.open) tr:not(.toggle){display:none}
.nodiff{margin:16px;padding:12px 16px;background:#dafbe1;border:1px solid #aceebb;border-radius:6px}
@media print{header{position:static}tbody.fold tr:not(.toggle){display:table-row}tr.toggle{display:none}}
main{max-width:900px;margin:24px auto;padding:0 16px}
main table{font:14px/1.6 system-ui,sans-serif;table-layout:auto}
main td:first-child{white-space:nowrap;font-family:ui-monospace,monospace}
main td,main th{padding:6px 10px;border-bottom:1px solid #eaeef2;text-align:left}
main td.c,main th.c{font-variant-numeric:tabular-nums;text-align:right}
main th{color:#57606a;font-weight:600}
"""

SCRIPT = """function folds(open){document.querySelectorAll('tbody.fold').forEach(t=>t.classList.toggle('open',open))}"""


def page(title, body):
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<title>{esc(title)}</title><style>{STYLE}</style><script>{SCRIPT}</script></head>\n'
            f"<body>\n{body}\n</body></html>\n")


def render_pair(left_name, right_name, a, b):
    """The whole HTML page for one pair, and its change counts and hunk labels."""
    body, stats, hunks = side_by_side(a, b)
    first_hunk = {}  # equation label -> first hunk that touches it, for the header links
    for n, labels in enumerate(hunks, 1):
        for label in labels:
            first_hunk.setdefault(label, n)
    touched = "".join(f'<a href="#h{n}"><span class="eq">{esc(x)}</span></a>' for x, n in first_hunk.items())
    counts = (f'<span class="stats"><b>{len(hunks)}</b> hunks: <b>{stats["changed"]}</b> lines changed, '
              f'<b>{stats["added"]}</b> added, <b>{stats["removed"]}</b> removed</span>')
    legend = ('<span><span class="key del">removed</span> <span class="key add">added</span> '
              '<span class="key chg" style="background:linear-gradient(90deg,#ffebe9 50%,#e6ffec 50%)">changed</span> '
              '<span class="key"><del>old</del> \u2192 <ins>new</ins> words</span></span>')
    buttons = '<span><button onclick="folds(true)">expand all</button> <button onclick="folds(false)">collapse all</button></span>'
    header = (f'<header><h1>{esc(left_name)}<span class="arrow">\u2192</span>{esc(right_name)}</h1>'
              f'<div class="meta">{counts}{legend}{buttons}</div>'
              + (f'<div class="meta">equations touched: {touched}</div>' if touched else "")
              + f'<div class="files"><div>{esc(left_name)} ({len(a)} lines)</div>'
              f'<div>{esc(right_name)} ({len(b)} lines)</div></div></header>')
    nodiff = "" if hunks else '<p class="nodiff">No differences: the two files are identical.</p>'
    table = f'<table><col class="n"><col><col class="n"><col>{body}</table>'
    return page(f"{left_name} \u2192 {right_name}", header + nodiff + table), stats, hunks


def read_lines(root, name):
    path = os.path.join(root, name)  # an absolute name stays as it is
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"sidebyside: error: cannot read {path}: {getattr(e, 'strerror', None) or e}")


def write(path, text):
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise SystemExit(f"sidebyside: error: cannot write {path}: {e.strerror or e}")


def write_pair(left, right, out, root=ROOT):
    """Write the page for one pair to out; return its change counts and hunk labels."""
    text, stats, hunks = render_pair(left, right, read_lines(root, left), read_lines(root, right))
    write(out, text)
    print(f"wrote {out} ({len(hunks)} hunks: {stats['changed']} changed, {stats['added']} added, {stats['removed']} removed)")
    return stats, hunks


def page_name(left, right):
    return f"{os.path.splitext(left)[0]}-{os.path.splitext(right)[0]}.html"


def write_all(out_dir, root=ROOT):
    """One page per diff-guide pair whose two files exist, plus index.html; the number of pages written."""
    rows = []
    for left, right in PAIRS:
        missing = [f for f in (left, right) if not os.path.isfile(os.path.join(root, f))]
        if missing:
            print(f"skipped {left} -> {right}: {', '.join(missing)} not found")
            continue
        name = page_name(left, right)
        stats, hunks = write_pair(left, right, os.path.join(out_dir, name), root)
        touched = sorted(set(x for h in hunks for x in h), key=lambda x: (int(re.search(r"\d+", x)[0]), x))
        eqs = "".join(f'<span class="eq">{esc(x)}</span>' for x in touched)  # in equation order: a table of contents
        rows.append(f'<tr><td><a href="{name}">{esc(left)} \u2192 {esc(right)}</a></td><td class="c">{len(hunks)}</td>'
                    f'<td class="c">{stats["changed"]}</td><td class="c">{stats["added"]}</td>'
                    f'<td class="c">{stats["removed"]}</td><td>{eqs}</td></tr>')
    if rows:
        table = ("<table><tr><th>pair</th><th class=c>hunks</th><th class=c>changed</th><th class=c>added</th>"
                 "<th class=c>removed</th><th>equations touched</th></tr>" + "\n".join(rows) + "</table>")
        body = (f"<main><h1>Side-by-side diffs</h1><p>Each page puts two sibling files next to each other; "
                f"the changes are the algorithm.</p>{table}</main>")
        write(os.path.join(out_dir, "index.html"), page("Side-by-side diffs", body))
        print(f"wrote {os.path.join(out_dir, 'index.html')}")
    return len(rows)


# ---------------------------------------------------------------- command line

def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m common.sidebyside", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", help="two files, relative to the repository root (e.g. grpo.py dapo.py)")
    parser.add_argument("--all", action="store_true", help="every pair of the diff guide, plus index.html")
    parser.add_argument("-o", "--output", help="page to write (a folder with --all); default: sidebyside/ in the repository")
    parser.add_argument("--root", default=ROOT, help="folder the file names are relative to (default: the repository root)")
    # One clear line instead of argparse's usage block: a student sees what to fix at once.
    parser.error = lambda msg: sys.exit(f"sidebyside: error: {msg} (see --help)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.root):
        parser.error(f"--root {args.root} is not a folder")
    if args.all:
        if args.files:
            parser.error("give either two files or --all, not both")
        out_dir = args.output or os.path.join(args.root, "sidebyside")
        if os.path.isfile(out_dir):
            parser.error(f"-o {out_dir} is a file; --all writes a folder of pages")
        if write_all(out_dir, args.root) == 0:
            sys.exit("sidebyside: error: no page written: none of the diff-guide pairs exists under " + args.root)
        return
    if len(args.files) != 2:
        parser.error(f"give two files to compare, or --all (got {len(args.files)} file(s))")
    left, right = args.files
    out = args.output or os.path.join(args.root, "sidebyside", page_name(os.path.basename(left), os.path.basename(right)))
    if os.path.isdir(out):  # -o some/folder: put the page inside it
        out = os.path.join(out, page_name(os.path.basename(left), os.path.basename(right)))
    write_pair(left, right, out, args.root)


if __name__ == "__main__":
    main()
