"""The rooms the runnable group files share. Each group file imports this package before torch,
so that a Ctrl-C in the seconds torch takes to load ends as every early stop does: one line,
status 130 (from parse_args on, common/runs.py's signal handlers say it). A tool or the lab keeps
Python's own traceback: "nothing was trained" is the group files' to say."""

import os
import sys

GROUP_FILES = ("grpo.py", "dr_grpo.py", "dapo.py", "gspo.py", "sapo.py")


def _interrupted_while_loading(kind, value, traceback) -> None:
    if not issubclass(kind, KeyboardInterrupt):
        return sys.__excepthook__(kind, value, traceback)
    print("\nSIGINT: stopped before training began; nothing was trained or saved", file=sys.stderr, flush=True)
    # Python then exits as a Ctrl-C does, by SIGINT: status 130


if os.path.basename(sys.argv[0] if sys.argv else "") in GROUP_FILES:
    sys.excepthook = _interrupted_while_loading
