"""Run by torchrun (2 processes) from test_group_distributed.py: one group file's main block in a fresh process, as
`torchrun --nproc_per_node 2 grpo.py ...` runs it; then each process writes what is left when the block returns: the
time, and the gloo worker threads still alive (one that outlives the script can abort it during interpreter
finalisation: common/processes.py, finish). Not a test file."""

import json
import os
import runpy
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

if __name__ == "__main__":
    out, name, *flags = sys.argv[1:]
    sys.argv = [f"{name}.py", *flags]
    runpy.run_path(os.path.join(ROOT, f"{name}.py"), run_name="__main__")
    returned = time.time()
    threads = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                threads.append(f.read().strip())
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    with open(os.path.join(out, f"exit_rank{os.environ['RANK']}.json"), "w") as f:
        json.dump({"returned": returned, "gloo_threads": sum(t.startswith(("pt_gloo", "gloo")) for t in threads)}, f)
