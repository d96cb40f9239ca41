"""Repository-level promises: CI runs exactly the README's test command."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ci_runs_the_readme_test_command():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    readme = open(os.path.join(ROOT, "README.md")).read()
    (command,) = re.findall(r"^python -m pytest.*$", ci, flags=re.M)
    assert command in readme, f"README.md must show the test command CI runs: {command}"
