"""The loopback benchmarks' JSON lines (loopback_lib.sh's run_job), grouped for their tables.

loopback_lib.sh's `report TAG` runs each benchmark's table code with `groups` (by_shape of its
jobs) and these helpers in scope.
"""
import json
import statistics


def by_shape(path, tag):
    """{(workers, tensor_bytes): {row[tag]: [rows]}}: each job shape's runs, by the setting `tag`."""
    groups = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                groups.setdefault((r["workers"], r["tensor_bytes"]), {}).setdefault(r[tag], []).append(r)
    return groups


def med(rows, key):
    """The median of `key` over `rows`."""
    return statistics.median(r[key] for r in rows)


def header(*columns):
    """Starts a Markdown table, after a blank line."""
    print()
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))


def row(*cells):
    print("| " + " | ".join(str(c) for c in cells) + " |")


def size(tensor_bytes):
    return f"{tensor_bytes / 1048576:.0f} MiB"
