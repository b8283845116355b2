"""The loopback benchmarks' JSON lines (loopback_lib.sh's run_job), grouped for their tables.

Shared by auth_cost.sh, key_rotation_cost.sh and encoding.sh, which import it with bench/ on
PYTHONPATH.
"""
import json


def by_shape(path, tag):
    """{(workers, tensor_bytes): {row[tag]: [rows]}}: each job shape's runs, by the setting `tag`."""
    groups = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                groups.setdefault((r["workers"], r["tensor_bytes"]), {}).setdefault(r[tag], []).append(r)
    return groups
