"""Run by tests/sandbox/test_run_tied.py as ``python -m tests.sandbox.warm_probe CODE OUT [SLEEP]``: writes
whether it started warm (its parent's marker module already imported) and its pid to OUT, sleeps
SLEEP seconds, exits with CODE."""
import os
import sys
import time

code, out = int(sys.argv[1]), sys.argv[2]
with open(out, "w") as f:
    f.write(f"{'warm' if 'tests.sandbox.warm_marker' in sys.modules else 'fresh'} {os.getpid()}\n")
time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0)
print("probe done", flush=True)
sys.exit(code)
