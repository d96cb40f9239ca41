"""common/EQUATIONS.md, the repo's own equation page, is complete: every equation number that the code, the
tests or the README cite has an entry there (an anchor `<a id="eq-N"></a>`), and the page stands on its own.
"""
import glob
import os
import re
from conftest import ROOT

PAGE = os.path.join(ROOT, "common", "EQUATIONS.md")

# "eq. (96)", "eq. 90-91", "Eq. (117)-(119)", "eq. 80/81", "eqs. 90, 91", "eq. (78), (79)"; \b keeps "freq."
# and "seq." out; "eq. (120), 2(x)" cites 120 only. A range cites every number in it.
EQ_RE = re.compile(r"\beqs?\.?\s*(\(?\d+\)?(?:\s*[-\u2013/,]\s*\(?\d+\)?(?![\w(]|\.\d))*)", re.IGNORECASE)
# README tables cite bare numbers: "| (37)-(42), (46) |".
TABLE_RE = re.compile(r"\(\d+\)(?:\s*[-\u2013]\s*\(\d+\))?(?:\s*,\s*\(\d+\)(?:\s*[-\u2013]\s*\(\d+\))?)*")
# A link to an entry of the page: "EQUATIONS.md#eq-96", "equations.html#eq-96".
LINK_RE = re.compile(r"#eq-(\d+)\b")
ANCHOR_RE = re.compile(r'<a id="eq-(\d+)"></a>')


def numbers(group):
    """'(90)-(91), 98' -> {90, 91, 98}: every number of every range."""
    found = set()
    for part in re.split(r"[,/]", re.sub(r"[()\s]", "", group).replace("\u2013", "-")):
        ends = [int(x) for x in part.split("-") if x]
        if ends:
            found.update(range(min(ends), max(ends) + 1))
    return found


def cited(text, table=False):
    found = set()
    for m in EQ_RE.finditer(text):
        found |= numbers(m.group(1))
    for m in LINK_RE.finditer(text):
        found.add(int(m.group(1)))
    if table:
        for line in text.splitlines():
            if line.lstrip().startswith("|"):
                for m in TABLE_RE.finditer(line):
                    found |= numbers(m.group(0))
    return found


def sources():
    """The files whose citations the page must resolve: the code, common/, the tests, the README and the pages."""
    files = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "common", "GUIDE.md")]
    files += sorted(glob.glob(os.path.join(ROOT, "common", "results", "*.md")))
    for pattern in ("*.py", "common/*.py", "tests/*.py"):
        files += sorted(glob.glob(os.path.join(ROOT, pattern)))
    return files


def citations_by_number():
    where = {}
    for path in sources():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for n in cited(text, table=path.endswith(".md")):
            where.setdefault(n, []).append(os.path.relpath(path, ROOT))
    return where


def read_page():
    with open(PAGE, encoding="utf-8") as f:
        return f.read()


def test_parsing_of_citations():
    assert cited("# eq. (96): token-level clipped surrogate") == {96}
    assert cited("eq. (90)-(91), Eq. 98 and eqs. 80/81; eq. (78), (79)") == {78, 79, 80, 81, 90, 91, 98}
    assert cited("freq. 5, seq. 3, the 2nd eq is here") == set()
    assert cited("eq. (120), 2(τ(r−1)/2) and eq. 97, 0.5") == {120, 97}
    assert cited("| `vpg.py` | REINFORCE | (37)-(39), (46) |", table=True) == {37, 38, 39, 46}
    assert cited("see [the clip](common/EQUATIONS.md#eq-78)") == {78}


def test_every_cited_equation_has_an_entry():
    where = citations_by_number()
    entries = {int(n) for n in ANCHOR_RE.findall(read_page())}
    missing = sorted(set(where) - entries)
    assert not missing, "common/EQUATIONS.md has no entry for: " + ", ".join(
        f"({n}) cited in {', '.join(sorted(set(where[n])))}" for n in missing)


def test_entries_are_unique_and_in_order():
    text = read_page()
    ids = re.findall(r'<a id="([^"]+)"></a>', text)
    assert len(ids) == len(set(ids)), "an anchor appears twice"
    eqs = [int(n) for n in ANCHOR_RE.findall(text)]
    assert eqs == sorted(eqs), "equation entries are not in numeric order"
    # Every link inside the page lands on an anchor of the page.
    for target in re.findall(r"\]\(#([^)]+)\)", text):
        assert target in ids, f"link to #{target} has no anchor"


def test_every_entry_names_its_source_and_formula():
    text = read_page()
    blocks = re.split(r'(?=<a id="eq-\d+"></a>)', text)[1:]
    for block in blocks:
        block = re.split(r'\n(?=<a id="sec-)', block)[0]  # a named section after the last entry is not part of it
        n = ANCHOR_RE.match(block).group(1)
        assert "```" in block, f"eq-{n}: no formula"
        assert re.search(r"\*\*Source", block), f"eq-{n}: no source"


def test_the_page_stands_on_its_own():
    text = read_page()
    # The words are spelt in pieces so that this file does not mention them either.
    for word in ("se" + "ed", "se" + "eds/", "DES" + "IGN"):
        assert word.lower() not in text.lower(), f"the page mentions {word!r}: readers do not have those notes"
