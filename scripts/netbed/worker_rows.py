#!/usr/bin/env python3
"""The last JSON line each worker of a test-bed run printed, for the benchmark scripts.

    worker_rows.py BASE N LABEL

reads BASE.1 .. BASE.N (each worker's combined output) and prints one JSON array: each worker's
last line that is a JSON object, or null where there is none. For each such worker it writes
"LABEL worker I failed:" and the worker's last lines to stderr.
"""
import json
import sys


def main():
    base, n, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rows = []
    for i in range(1, n + 1):
        text = open(f"{base}.{i}").read().splitlines()
        objects = [line for line in text if line.startswith("{")]
        rows.append(json.loads(objects[-1]) if objects else None)
        if not objects:
            print(f"{label} worker {i} failed:", *text[-4:], sep="\n  ", file=sys.stderr)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
