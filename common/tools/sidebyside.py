"""Side-by-side diff pages: put two sibling files next to each other and let the diff be the lesson.

Usage (from any folder; file names are relative to the repository root):

    python -m common.tools.sidebyside grpo.py dapo.py -o dapo.html   # one page
    python -m common.tools.sidebyside --all -o /tmp/sidebyside       # every pair of the diff guide + index.html

Each page is one self-contained HTML file (inline CSS and a few lines of JS, no network):
the two files in two aligned columns with line numbers, changed lines highlighted
(left: replaced/removed, right: replaced/added, changed words marked darker), long unchanged
runs folded into a "N unchanged lines" row that opens on click, and every changed hunk labelled
with the equation(s) its comments cite ("# eq. (96): ..." gives the badge "eq. 96"). Each badge links
to its entry in equations.html, the repository's equation page (common/EQUATIONS.md made into HTML),
which is written next to the pages.

Standard library only: difflib finds the changes, html escapes the code, argparse reads the CLI.
"""
import argparse
import difflib
import html
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository

# The diff guide: the learning path through the classic files, then each group method against GRPO.
PAIRS = [
    ("vpg.py", "a2c.py"), ("a2c.py", "ppo.py"), ("ppo.py", "trpo.py"),
    ("grpo.py", "dr_grpo.py"), ("grpo.py", "dapo.py"), ("grpo.py", "gspo.py"), ("grpo.py", "sapo.py"),
]

CONTEXT = 3   # unchanged lines kept visible on each side of a hunk
MIN_FOLD = 4  # fold only if at least this many lines would be hidden (folding 1-2 lines saves nothing)
EQUATIONS = os.path.join(ROOT, "common", "EQUATIONS.md")  # the equation page the labels link to
EQUATIONS_PAGE = "equations.html"                          # its HTML copy, written next to the diff pages

# "eq. (96)", "eq. 90-91", "eq. (117)-(119)", "eq. 80/81", "eqs. 90, 91"; \b keeps "freq. 5" out, and the
# lookahead keeps the "2" of "eq. (120), 2(x)" out of the list.
EQ_RE = re.compile(r"\beqs?\.?\s*(\(?\d+\)?(?:\s*[-\u2013/,]\s*\(?\d+\)?(?![\w(]|\.\d))*)", re.IGNORECASE)
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


# Which comment speaks for a line. A comment that opens a paragraph or a block (after a blank line, at the
# top, or under a line ending in ":", like "# 5. E epochs ... (eq. 96-97)") speaks for everything below it,
# down to the blank line that ends the paragraph or the line indented less that ends the block. Any other
# comment speaks for the one statement right below it (continuation lines and body included), not for the
# statements after that: "# ... the sum is eq. (102)." above `loss.backward()` says nothing about the clip
# fraction computed two statements further down. An inline comment or a docstring speaks for its own line.
CONTINUES = re.compile(r"[)\]}]|(?:else|elif|except|finally)\b")  # a line that continues the statement above
DEF_RE = re.compile(r"\s*(?:(?:async\s+)?(?:def|class)\s+(\w+)|(\w+)\s*(?::[^=]*)?\s=\s)")  # def f / x = / x: T =
WORD_RE = re.compile(r"[A-Za-z_]\w*")
DOCSTRING = ('"""', "'''", 'r"""')


def comment_scopes(lines):
    """For each line, (citations of the comment over its statement, citations of its paragraph's heading)."""
    out, heads, stmt, last, prev = [], [], None, None, ""
    for line in lines:
        text, indent = line.strip(), len(line) - len(line.lstrip())
        if not text:
            heads, stmt = [], None  # a blank line ends the paragraph: comments above it are about other code
        else:
            heads = [h for h in heads if indent >= h[0]]  # a line indented less closes the blocks above it
            if text.startswith("#"):
                if prev.strip().startswith("#") and last is not None:  # one comment over several lines
                    last[1].extend(citations(text))
                elif not prev.strip() or prev.rstrip().endswith(":"):
                    last, stmt = [indent, citations(text)], None
                    heads.append(last)
                else:
                    last = stmt = [indent, citations(text), False]
            elif stmt is not None:
                if indent < stmt[0] or (stmt[2] and indent == stmt[0] and not CONTINUES.match(text)):
                    stmt = None  # the next statement begins: the comment was about the one before
                else:
                    stmt[2] = True
        heading = next((h[1] for h in reversed(heads) if h[1]), [])
        out.append((list(stmt[1]) if stmt else [], list(heading)))
        prev = line
    return out


def definitions(lines, scopes):
    """Name -> the equations cited where it is defined: on the defining line, in the docstring right below
    it (an Args field's), or in the comment over it."""
    defs = {}
    for k, line in enumerate(lines):
        m = DEF_RE.match(line)
        if not m:
            continue
        cites = citations(line) + scopes[k][0]
        if k + 1 < len(lines) and lines[k + 1].strip().startswith(DOCSTRING):
            cites += citations(lines[k + 1])
        defs.setdefault(m.group(1) or m.group(2), []).extend(cites)
    return defs


def changed_names(old, new):
    """The names an edit of one line swaps: those only in the old line, and those only in the new one
    ('args.clip_eps' -> 'args.clip_eps_high' gives ['clip_eps'], ['clip_eps_high'])."""
    a, b = WORD_RE.findall(old), WORD_RE.findall(new)
    return [w for w in dict.fromkeys(a) if w not in b], [w for w in dict.fromkeys(b) if w not in a]


def hunk_labels(a, b, notes_a, notes_b, hunk, pairs):
    """Equations a hunk touches, from the first of these that cites any (either side):
    1. its changed lines themselves;
    2. the comment over the statement it changes;
    3. the definitions of the names its edited lines swap (`args.clip_eps_high` -> the Args field's docstring);
    4. the heading comment of its paragraph.
    notes_a/notes_b: (comment_scopes, definitions) of each file; hunk: (i1, i2, j1, j2); pairs: from align()."""
    i1, i2, j1, j2 = hunk
    (scopes_a, defs_a), (scopes_b, defs_b) = notes_a, notes_b
    scopes = scopes_a[i1:i2] + scopes_b[j1:j2]
    named = []
    for i, j in pairs:
        if i is not None and j is not None:
            gone, new = changed_names(a[i], b[j])
            named += [c for w in gone for c in defs_a.get(w, [])] + [c for w in new for c in defs_b.get(w, [])]
    for found in (
        [c for line in a[i1:i2] + b[j1:j2] for c in citations(line)],
        [c for over, _ in scopes for c in over],
        named,
        [c for _, heading in scopes for c in heading],
    ):
        if found:
            return list(dict.fromkeys(found))  # de-duplicate, keep order
    return []


def eq_href(label):
    """'eq. 90-91' -> 'equations.html#eq-90': a label links to the entry of its first equation."""
    return f"{EQUATIONS_PAGE}#eq-{re.search(r'[0-9]+', label)[0]}"


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
    def ink(text):
        return len("".join(text.split()))
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
    scopes_a, scopes_b = comment_scopes(a), comment_scopes(b)
    notes_a, notes_b = (scopes_a, definitions(a, scopes_a)), (scopes_b, definitions(b, scopes_b))
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
        pairs = align(a, b, i1, i2, j1, j2)
        labels = hunk_labels(a, b, notes_a, notes_b, (i1, i2, j1, j2), pairs)
        hunks.append(labels)
        badges = "".join(f'<a href="{eq_href(x)}" title="the equation page"><span class="eq">{esc(x)}</span></a>'
                         for x in labels) or '<span class="noeq">no equation cited</span>'
        out.append(f'<tr class="hunk" id="h{len(hunks)}"><td colspan="4">{badges}</td></tr>')
        for i, j in pairs:
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
button{font:12px system-ui,sans-serif;padding:2px 8px;border:1px solid #d0d7de;border-radius:4px;background:#fff;
  cursor:pointer}
.files{display:grid;grid-template-columns:1fr 1fr;font:600 13px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.files div{padding:4px 8px;border-top:1px solid #d0d7de}
.files div+div{border-left:1px solid #d0d7de}
table{width:100%;border-collapse:collapse;table-layout:fixed;
  font:12.5px/1.5 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
col.n{width:3.4em}
td{vertical-align:top;padding:0 8px}
td.num{text-align:right;color:#8c959f;user-select:none;border-right:1px solid #eaeef2}
td.num+td.code+td.num{border-left:1px solid #d0d7de}
/* long lines wrap with a hanging indent, so a continuation never looks like a new, less-indented line */
td.code{white-space:pre-wrap;overflow-wrap:anywhere;tab-size:4;padding-left:calc(6px + var(--i,4ch));
  text-indent:calc(0px - var(--i,4ch))}
.del,.chg:nth-child(2){background:#ffebe9}
.add,.chg:nth-child(4){background:#e6ffec}
del{background:#ffb3ad;text-decoration:none;border-radius:2px}
ins{background:#8ee6a3;text-decoration:none;border-radius:2px}
.empty{background:repeating-linear-gradient(135deg,#f6f8fa 0 6px,#eef1f4 6px 12px)}
tr.hunk{scroll-margin-top:170px}
tr.hunk td{padding:6px 8px 2px;border-top:1px solid #d0d7de;background:#fff}
tbody:first-child tr.hunk:first-child td{border-top:0}
.eq,.noeq{display:inline-block;margin-right:6px;padding:0 8px;border-radius:10px;
  font:600 12px/20px system-ui,sans-serif}
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
    buttons = ('<span><button onclick="folds(true)">expand all</button> '
               '<button onclick="folds(false)">collapse all</button></span>')
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
    print(f"wrote {out} ({len(hunks)} hunks: {stats['changed']} changed, {stats['added']} added, "
          f"{stats['removed']} removed)")
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
        # In equation order, each linked to its entry: a table of contents.
        eqs = "".join(f'<a href="{eq_href(x)}"><span class="eq">{esc(x)}</span></a>' for x in touched)
        rows.append(f'<tr><td><a href="{name}">{esc(left)} \u2192 {esc(right)}</a></td><td class="c">{len(hunks)}</td>'
                    f'<td class="c">{stats["changed"]}</td><td class="c">{stats["added"]}</td>'
                    f'<td class="c">{stats["removed"]}</td><td>{eqs}</td></tr>')
    if rows:
        table = ("<table><tr><th>pair</th><th class=c>hunks</th><th class=c>changed</th><th class=c>added</th>"
                 "<th class=c>removed</th><th>equations touched</th></tr>" + "\n".join(rows) + "</table>")
        body = (f"<main><h1>Side-by-side diffs</h1><p>Each page puts two sibling files next to each other; "
                f"the changes are the algorithm. Each equation label links to its entry on "
                f'<a href="{EQUATIONS_PAGE}">the equation page</a>.</p>{table}</main>')
        write(os.path.join(out_dir, "index.html"), page("Side-by-side diffs", body))
        print(f"wrote {os.path.join(out_dir, 'index.html')}")
        write_equations(out_dir, root)
    return len(rows)


# ---------------------------------------------------------------- the equation page

EQ_STYLE = """
main.doc{line-height:1.55}
main.doc h1{font-size:26px}main.doc h2{margin-top:36px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
main.doc h3{margin:28px 0 6px;font-size:16px}
main.doc pre{background:#f6f8fa;border:1px solid #eaeef2;border-radius:6px;padding:8px 12px;overflow-x:auto;
  font:13px/1.5 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
main.doc code{font:13px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#f6f8fa;padding:0 3px;
  border-radius:3px}
main.doc pre code{background:none;padding:0}
main.doc a{color:#0969da}
a[id]:target+h2,a[id]:target+h3,a[id]:target+a[id]+h2{background:#fff8c5}
"""
ANCHOR_LINE = re.compile(r'<a id="[\w-]+"></a>')
LIST_ITEM = re.compile(r"(\s*)(-|\d+\.)\s+(.*)")


def md_inline(text):
    """`code`, **bold**, *italic*, [text](link) and <a id="..."></a> anchors; everything else escaped."""
    out = []
    for k, part in enumerate(re.split(r"`([^`]*)`", text)):
        if k % 2:
            out.append(f"<code>{esc(part)}</code>")
            continue
        part = re.sub(r'&lt;a id="([\w-]+)"&gt;&lt;/a&gt;', r'<a id="\1"></a>', esc(part))
        part = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", part)
        part = re.sub(r"\*(\S(?:.*?\S)?)\*", r"<i>\1</i>", part)
        out.append(re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', part))
    return "".join(out)


def markdown_html(text):
    """HTML for the markdown the equation page uses: headings, paragraphs, ``` blocks, tables, lists,
    rules and raw anchor lines. Not a general markdown converter, and it needs none."""
    lines, out, para, k = text.splitlines(), [], [], 0
    def flush():
        if para:
            out.append(f"<p>{md_inline(' '.join(para))}</p>")
            para.clear()
    while k < len(lines):
        line, k = lines[k], k + 1
        heading = re.match(r"(#{1,6})\s+(.*)", line)
        item = LIST_ITEM.match(line)
        if line.startswith("```"):
            flush()
            code = []
            while k < len(lines) and not lines[k].startswith("```"):
                code.append(lines[k])
                k += 1
            k += 1  # the closing fence
            out.append(f"<pre><code>{esc(chr(10).join(code))}</code></pre>")
        elif not line.strip():
            flush()
        elif ANCHOR_LINE.fullmatch(line.strip()):
            flush()
            out.append(line.strip())
        elif heading:
            flush()
            n = len(heading.group(1))
            out.append(f"<h{n}>{md_inline(heading.group(2))}</h{n}>")
        elif line.strip() == "---":
            flush()
            out.append("<hr>")
        elif line.startswith("|"):
            flush()
            rows = [line]
            while k < len(lines) and lines[k].startswith("|"):
                rows.append(lines[k])
                k += 1
            rows = [r for r in rows if not re.fullmatch(r"[|\s:-]+", r)]  # drop the |---|---| line
            cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
            head = "".join(f"<th>{md_inline(c)}</th>" for c in cells[0])
            body = "".join("<tr>" + "".join(f"<td>{md_inline(c)}</td>" for c in r) + "</tr>" for r in cells[1:])
            out.append(f"<table><tr>{head}</tr>{body}</table>")
        elif item and not para:
            tag = "ul" if item.group(2) == "-" else "ol"
            items = [item.group(3)]
            while k < len(lines) and lines[k].strip() and (LIST_ITEM.match(lines[k]) or lines[k].startswith(" ")):
                more = LIST_ITEM.match(lines[k])
                if more and not lines[k].startswith(" "):
                    items.append(more.group(3))  # the next item
                else:
                    items[-1] += " " + lines[k].strip()  # an item's continuation line
                k += 1
            out.append(f"<{tag}>" + "".join(f"<li>{md_inline(x)}</li>" for x in items) + f"</{tag}>")
        else:
            para.append(line.strip())
    flush()
    return "\n".join(out)


def write_equations(out_dir, root=ROOT):
    """Write the equation page as equations.html in out_dir, where the labels of the diff pages point."""
    source = os.path.join(root, "common", "EQUATIONS.md")
    source = source if os.path.isfile(source) else EQUATIONS
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        print(f"skipped {EQUATIONS_PAGE}: {source} not found (the equation labels will not resolve)")
        return None
    title = re.search(r"^#\s+(.*)", text, re.MULTILINE)
    body = f'<style>{EQ_STYLE}</style><main class="doc">{markdown_html(text)}</main>'
    out = os.path.join(out_dir, EQUATIONS_PAGE)
    write(out, page(title.group(1) if title else "Equations", body))
    print(f"wrote {out}")
    return out


# ---------------------------------------------------------------- command line

def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m common.tools.sidebyside", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", help="two files, relative to the repository root (e.g. grpo.py dapo.py)")
    parser.add_argument("--all", action="store_true", help="every pair of the diff guide, plus index.html")
    parser.add_argument("-o", "--output",
                        help="page to write (a folder with --all); default: sidebyside/ in the repository")
    parser.add_argument("--root", default=ROOT,
                        help="folder the file names are relative to (default: the repository root)")
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
    out = args.output or os.path.join(args.root, "sidebyside",
                                      page_name(os.path.basename(left), os.path.basename(right)))
    if os.path.isdir(out):  # -o some/folder: put the page inside it
        out = os.path.join(out, page_name(os.path.basename(left), os.path.basename(right)))
    write_pair(left, right, out, args.root)
    write_equations(os.path.dirname(os.path.abspath(out)), args.root)


if __name__ == "__main__":
    main()
