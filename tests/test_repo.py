"""Repository-level promises: CI runs exactly the README's test command."""

import os
import re
from conftest import ROOT



def test_ci_runs_the_readme_test_command():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    readme = open(os.path.join(ROOT, "README.md")).read()
    (command,) = re.findall(r"^python -m pytest.*$", ci, flags=re.M)
    assert command in readme, f"README.md must show the test command CI runs: {command}"


ALGORITHM_PAPERS = {"vpg.py": "Williams 1992", "a2c.py": "1602.01783", "trpo.py": "1502.05477", "ppo.py": "1707.06347",
                    "grpo.py": "2402.03300", "dr_grpo.py": "2503.20783", "dapo.py": "2503.14476", "gspo.py": "2507.18071",
                    "sapo.py": "2511.20347"}


def test_every_algorithm_file_names_its_paper_in_its_docstring():
    import ast

    for name, paper in ALGORITHM_PAPERS.items():
        docstring = ast.get_docstring(ast.parse(open(os.path.join(ROOT, name)).read()))
        assert paper in docstring.split("\n\n")[0] + docstring.split("\n\n")[1], f"{name} should name {paper} at the top"


def test_nothing_cites_documents_the_repo_does_not_ship():
    # Built at run time, so that this file does not match itself.
    pattern = re.compile("|".join(["seeds" + "/", r"\b[Ss]eed 0\d\d", "DE" + "SIGN", "seed" + "'s", r"\bseed" + " eq"]))
    files = [os.path.join(dirpath, f) for dirpath, _, names in os.walk(ROOT) for f in names
             if f.endswith((".py", ".md")) and not any(part in dirpath for part in (".git", "runs", "__pycache__", ".venv"))]
    hits = [f"{os.path.relpath(f, ROOT)}:{i}" for f in files for i, line in enumerate(open(f, encoding="utf-8"), 1) if pattern.search(line)]
    assert not hits, f"cite the paper or common/EQUATIONS.md instead: {hits}"
