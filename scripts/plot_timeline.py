#!/usr/bin/env python3
"""Draws dlcp timelines (client option timeline, DLCP_TIMELINE) as a PNG, for those who would
rather look than load Perfetto: one row per op name and rank, a bar from each op's enqueue to its
result, ticks at its first and last push, a dot at its STOP and a cross at each NACK or repair.

    plot_timeline.py OUT.png TRACE.json [TRACE.json ...] [--last-ms 500]

--last-ms keeps only the end of the traces (the steps of a running job, not its start-up).
Prints one JSON line: ops drawn, and the median op time per name.
"""
import argparse
import json
import statistics
import sys


def load(path):
    with open(path) as f:
        text = f.read().rstrip()
    if not text.endswith("]"):  # cut short (the worker died): the array format allows it
        text = text.rstrip(",") + "]"
    return json.loads(text)


def ops_of(events):
    """{(pid, id): {"name", "begin", "end", "marks": [(name, ts)]}} from async b/n/e events."""
    ops = {}
    for e in events:
        if e.get("cat") != "op":
            continue
        op = ops.setdefault((e["pid"], e["id"]), {"name": e["name"], "begin": None, "end": None, "marks": []})
        if e["ph"] == "b":
            op["begin"], op["name"] = e["ts"], e["name"]
        elif e["ph"] == "e":
            op["end"] = e["ts"]
            op["error"] = e.get("args", {}).get("error")
        else:
            op["marks"].append((e["name"], e["ts"]))
    return {k: v for k, v in ops.items() if v["begin"] is not None and v["end"] is not None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--last-ms", type=float, default=0)
    a = ap.parse_args()
    ops = {}
    for path in a.traces:
        ops.update(ops_of(load(path)))
    if not ops:
        sys.exit("no complete op in " + ", ".join(a.traces))
    end = max(o["end"] for o in ops.values())
    start = min(o["begin"] for o in ops.values())
    if a.last_ms > 0:
        start = max(start, end - a.last_ms * 1000)
        ops = {k: o for k, o in ops.items() if o["end"] >= start}
    rows = sorted({(pid, o["name"]) for (pid, _), o in ops.items()}, key=lambda r: (r[1], r[0]))
    row_of = {r: i for i, r in enumerate(rows)}

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.3 * len(rows)))
    ms = lambda ts: (ts - start) / 1000.0  # noqa: E731
    marker = {"first push": ("|", "tab:green"), "last push": ("|", "tab:blue"), "stop": ("o", "black"),
              "nack": ("x", "tab:red"), "repairs": ("x", "tab:red"), "result request": ("+", "tab:orange")}
    for (pid, _), o in ops.items():
        y = row_of[(pid, o["name"])]
        color = "tab:red" if o.get("error") else "tab:gray"
        ax.barh(y, ms(o["end"]) - ms(max(o["begin"], start)), left=ms(max(o["begin"], start)), height=0.6,
                color=color, alpha=0.5)
        for name, ts in o["marks"]:
            if ts >= start and name in marker:
                m, c = marker[name]
                ax.plot(ms(ts), y, m, color=c, markersize=7)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {pid}: {name}" for pid, name in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title("dlcp ops: enqueue to result; | first / last push, o STOP, x NACK or repair, + result request")
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    by_name = {}
    for o in ops.values():
        by_name.setdefault(o["name"], []).append((o["end"] - o["begin"]) / 1000.0)
    print(json.dumps({"ops": len(ops), "rows": len(rows),
                      "median_ms": {n: round(statistics.median(v), 3) for n, v in sorted(by_name.items())}}))


if __name__ == "__main__":
    main()
