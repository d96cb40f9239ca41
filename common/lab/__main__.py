"""`python -m common.lab <experiment>`: the lab's command line (common/lab/lab.py; sharpen-or-teach: passk.py)."""
import sys

if sys.argv[1:2] == ["sharpen-or-teach"]:  # compares trained models: flags of its own
    from common.lab.passk import main

    main(sys.argv[2:])
else:
    from common.lab.lab import main

    main()
