# Runs a Python script as __main__ and ends the process with os._exit the moment the script
# returns, skipping interpreter teardown. usage: python3 hold_exit.py SCRIPT ARGS...
#
# Why: the workloads write PyTorch's own figures (memory_stats, a snapshot) at their end, and a
# capture's figures are those of the last event it saw. A normal exit then frees what module
# teardown collects: on the H200, the AdamW state of GPT-2 (298 tensors, 996,722,688 bytes) was
# freed after the figures were written and before the process ended, and the capture, correctly,
# ended with those frees. Ending here makes "the end of the trace" and "the moment PyTorch was
# asked" the same moment, so the two can be compared to the byte. Not for `gpufrag run`'s
# Python hook, which takes its last snapshot in an atexit handler (os._exit runs none).
import os, runpy, sys

script = sys.argv[1]
sys.argv = sys.argv[1:]
code = 0
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
sys.stdout.flush(); sys.stderr.flush()
os._exit(code)
