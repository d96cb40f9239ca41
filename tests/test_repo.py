"""Repository-level promises: CI runs exactly the README's test command."""

import ast
import os
import re

from conftest import CLASSIC, GROUP, ROOT


def test_ci_runs_the_readme_test_command():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    readme = open(os.path.join(ROOT, "README.md")).read()
    (command,) = re.findall(r"^python -m pytest.*$", ci, flags=re.M)
    assert command in readme, f"README.md must show the test command CI runs: {command}"


ALGORITHM_PAPERS = {"vpg.py": "Williams 1992", "a2c.py": "1602.01783", "trpo.py": "1502.05477", "ppo.py": "1707.06347",
                    "grpo.py": "2402.03300", "dr_grpo.py": "2503.20783", "dapo.py": "2503.14476",
                    "gspo.py": "2507.18071", "sapo.py": "2511.20347"}


def test_every_algorithm_file_names_its_paper_in_its_docstring():
    for name, paper in ALGORITHM_PAPERS.items():
        docstring = ast.get_docstring(ast.parse(open(os.path.join(ROOT, name)).read()))
        assert paper in docstring.split("\n\n")[0] + docstring.split("\n\n")[1], (
            f"{name} should name {paper} at the top")


def test_nothing_cites_documents_the_repo_does_not_ship():
    # Built at run time, so that this file does not match itself.
    pattern = re.compile("|".join(["seeds" + "/", r"\b[Ss]eed 0\d\d", "DE" + "SIGN", "seed" + "'s", r"\bseed" + " eq"]))
    files = [os.path.join(dirpath, f) for dirpath, _, names in os.walk(ROOT) for f in names
             if f.endswith((".py", ".md"))
             and not any(part in dirpath for part in (".git", "runs", "__pycache__", ".venv"))]
    hits = [f"{os.path.relpath(f, ROOT)}:{i}" for f in files for i, line in enumerate(open(f, encoding="utf-8"), 1)
            if pattern.search(line)]
    assert not hits, f"cite the paper or common/EQUATIONS.md instead: {hits}"


def imported_modules(path: str) -> set[str]:
    """The modules a file imports (at any depth: lazy imports inside functions count)."""
    names = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {f"{node.module}.{alias.name}" for alias in node.names}  # `from common import runs`: common.runs
    return names


RUNTIME = ["common.tasks", "common.processes", "common.sampling", "common.decoding", "common.perf",
           "common.policy", "common.memory", "common.checkpoints", "common.runs"]


def module_files(module: str) -> list[str]:
    """The file of a module, or every file of a package (common.tasks: a task a file)."""
    path = os.path.join(ROOT, *module.split("."))
    if os.path.isdir(path):
        return sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".py"))
    return [path + ".py"]


def test_imports_run_one_way_algorithm_files_to_runtime_modules_and_tools_to_algorithm_files():
    algorithms = set(GROUP + CLASSIC)
    for name in algorithms:  # an algorithm file imports the runtime modules of common/ and nothing else of the repo
        repo_imports = {m for m in imported_modules(os.path.join(ROOT, f"{name}.py"))
                        if m.split(".")[0] in algorithms | {"common"}}
        outside = {m for m in repo_imports if not any(m == r or m.startswith(r + ".") for r in RUNTIME)}
        outside -= {"common"}  # the package itself: its __init__ only says how an early Ctrl-C prints
        assert not outside, f"{name}.py imports {outside}: an algorithm file imports only {', '.join(RUNTIME)}"
    for dirpath, _, files in os.walk(os.path.join(ROOT, "common")):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            up = {m for m in imported_modules(path) if m.split(".")[0] in algorithms}
            tool = os.path.relpath(path, ROOT).startswith(("common/tools", "common/lab"))
            assert tool or not up, f"{os.path.relpath(path, ROOT)} imports the algorithm file(s) {up}: only tools may"


def test_the_runtime_modules_import_only_the_ones_below_them():
    # RUNTIME lists them bottom up: each may import those before it, none after it, nor a tool, the lab or a model
    for position, module in enumerate(RUNTIME):
        for path in module_files(module):  # a package's files may import each other
            repo = {m for m in imported_modules(path) if m.startswith("common")}
            above = {m for m in repo if not any(m == r or m.startswith(r + ".") for r in RUNTIME[:position + 1])}
            assert not above, f"{module} imports {above}: a runtime module imports only those listed before it"


def group_names_from_common(path: str) -> set[str]:
    """The names a file takes from common/: `module.name` for each `from common import module`, and each
    `from common.module import name`."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    modules, names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "common":
            for alias in node.names:
                (modules if node.module == "common" else names).add(alias.asname or alias.name)
    return names | {f"{n.value.id}.{n.attr}" for n in ast.walk(tree)
                    if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in modules}


def test_the_group_files_take_few_names_from_common():
    # narrow doors: a reader of a group file meets at most 29 names of common/, each one a step it can name
    for name in GROUP:
        names = group_names_from_common(os.path.join(ROOT, f"{name}.py"))
        assert len(names) <= 29, f"{name}.py takes {len(names)} names from common/: {sorted(names)}"


def test_files_a_reader_takes_in_at_a_glance():
    # at most 10 % of the lines of a group file or a runtime module wider than 100 characters (the anchors:
    # 3-11 %), and every file of a runtime module under 500 lines
    for path in [os.path.join(ROOT, f"{name}.py") for name in GROUP] + [f for m in RUNTIME for f in module_files(m)]:
        lines = open(path, encoding="utf-8").read().splitlines()
        wide = [number for number, line in enumerate(lines, 1) if len(line) > 100]
        assert len(wide) <= len(lines) // 10, f"{path}: {len(wide)} of {len(lines)} lines over 100 characters"
        if os.path.relpath(path, ROOT).startswith("common"):
            assert len(lines) <= 500, f"{path} has {len(lines)} lines: split it by what it is about"


def test_the_folders_a_run_writes_are_ignored_by_git():
    """README: every script logs to runs/, --track's W&B keeps its files in ./wandb, sidebyside -o sidebyside/."""
    ignored = [line.strip() for line in open(os.path.join(ROOT, ".gitignore")) if line.strip()]
    for folder in ("runs", "wandb", "sidebyside"):
        assert {f"{folder}/", f"/{folder}/"} & set(ignored), f".gitignore must ignore {folder}/"


def field_docs(path):
    """The docstring under each annotated field of the file's classes: what --help prints for that flag."""
    docs = {}
    for node in ast.walk(ast.parse(open(os.path.join(ROOT, path)).read())):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for field, doc in zip(body, body[1:]):
            if isinstance(field, ast.AnnAssign) and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant):
                docs[field.target.id] = doc.value.value
    return docs


def test_the_help_of_each_scale_default_names_the_values_it_resolves_to():
    from common.policy import LORA_LEARNING_RATE, SCALE_DEFAULTS

    def spellings(value):
        if isinstance(value, float):
            return {f"{value:g}", f"{value:.0e}".replace("e-0", "e-")}
        return {str(value)}
    for name in GROUP:
        docs = {**field_docs("common/policy.py"), **field_docs(f"{name}.py")}
        for flag, (toy, real_gpu, real_cpu, _) in SCALE_DEFAULTS.items():
            for value in (toy, real_gpu, real_cpu):
                assert any(re.search(rf"(?<![\w.]){re.escape(s)}(?![\w.])", docs[flag]) for s in spellings(value)), (
                    f"{name} --{flag.replace('_', '-')}: its help {docs[flag]!r} does not say {value}")
        for value in LORA_LEARNING_RATE:  # with --lora-rank a real model's learning rate is LoRA's (GPU, CPU)
            assert any(re.search(rf"(?<![\w.]){re.escape(s)}(?![\w.])", docs["learning_rate"])
                       for s in spellings(value)), f"{name} --learning-rate: its help does not say {value}"


def test_the_help_of_resume_names_every_flag_a_resumed_run_may_change():
    from common.checkpoints import MAY_CHANGE_ON_RESUME

    help_text = field_docs("common/policy.py")["resume"]
    for key in MAY_CHANGE_ON_RESUME[1:]:
        flag = "--" + key.replace("_", "-")
        assert flag in help_text or "--" + key.split("_")[0] + "-*" in help_text, flag  # --eval-*: every --eval- flag
