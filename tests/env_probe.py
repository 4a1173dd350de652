"""`python -m tests.env_probe CODE [SECONDS]`: prints what a started process sees (its argv, working
directory and launcher variables) as one JSON line, sleeps SECONDS, exits CODE. For tests/test_forkserver.py."""
import json
import os
import sys
import time

if __name__ == "__main__":
    seen = {"argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid(), "pgid": os.getpgid(0),
            "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT", "OMP_NUM_THREADS")}}
    print(json.dumps(seen), flush=True)
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
    sys.exit(int(sys.argv[1]))
