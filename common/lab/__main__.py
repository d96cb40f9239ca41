"""`python -m common.lab <experiment>`: the lab's command line (common/lab/lab.py)."""
from common.lab.lab import main

main()
