"""Imported by the parent in tests/sandbox/test_run_tied.py: a command forked from it sees it imported."""
