#!/usr/bin/env python3
"""Tables and a plot from bench/netbed_tta.sh's JSON lines: per bed and system, the median and
range over trials of time to accuracy and of step time, Gloo's communication share, and the
speed-ups against DDP with Gloo.

    tta_report.py RESULTS.jsonl [--plot=PNG] [--setup=TEXT]
"""
import argparse
import json
import statistics

SYSTEMS = ("dlcp_bounded", "dlcp_reliable", "gloo_ddp", "compute_only")
COLORS = {"dlcp_bounded": "tab:blue", "dlcp_reliable": "tab:green", "gloo_ddp": "tab:red"}


def time_to(history, target):
    """Training seconds at which accuracy first reaches `target`, interpolated between the two
    measurements around it; None if it never does."""
    prev_t, prev_a = 0.0, 0.0
    for t, a in history:
        if a >= target:
            return prev_t + (t - prev_t) * (target - prev_a) / (a - prev_a) if a > prev_a else t
        prev_t, prev_a = t, a
    return None


def spread(values):
    """'median (min-max)'; '-' without values."""
    v = [x for x in values if x is not None]
    if not v:
        return "-", None
    m = statistics.median(v)
    return f"{m:.2f} ({min(v):.2f}-{max(v):.2f})", m


def target_and_runs(runs, bed):
    """The bed's target accuracy and its runs by system."""
    mine = [r for r in runs if r["bed"] == bed]
    by = {s: [r for r in mine if r["system"] == s] for s in SYSTEMS}
    finals = [r["history"][-1][1] for r in by["gloo_ddp"]]
    return (statistics.median(finals) - 0.5 if finals else float("nan")), by


def report(runs, bed):
    target, by = target_and_runs(runs, bed)
    step = {s: spread([1000 * r["train_s"] / r["steps"] for r in by[s]]) for s in SYSTEMS}
    tta = {s: spread([time_to(r["history"], target) for r in by[s]]) for s in SYSTEMS[:3]}
    print(f"\n### {bed} bed: target {target:.2f}% (DDP with Gloo's median final accuracy less 0.5)\n")
    print("| system | trials | time to target s, median (range) | step ms, median (range) | final accuracy % (median) "
          "| Gloo TTA / this TTA |")
    print("|---|---|---|---|---|---|")
    for s in SYSTEMS[:3]:
        final = statistics.median([r["history"][-1][1] for r in by[s]]) if by[s] else float("nan")
        ratio = tta["gloo_ddp"][1] / tta[s][1] if tta[s][1] and tta["gloo_ddp"][1] else float("nan")
        print(f"| {s} | {len(by[s])} | {tta[s][0]} | {step[s][0]} | {final:.2f} | {ratio:.2f} |")
    if step["compute_only"][1] and step["gloo_ddp"][1]:
        share = 1 - step["compute_only"][1] / step["gloo_ddp"][1]
        print(f"\ncompute only: {step['compute_only'][0]} ms a step; communication is {100 * share:.0f}% of a Gloo step "
              "(1 - compute-only step / Gloo step, medians)")


def plot(runs, beds, path, setup):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(beds), figsize=(6 * len(beds), 4.5), squeeze=False)
    for ax, bed in zip(axes[0], beds):
        target, by = target_and_runs(runs, bed)
        for s, color in COLORS.items():
            trials = by[s]
            if not trials:
                continue
            times = [r["train_s"] for r in trials]
            median_run = trials[sorted(range(len(trials)), key=lambda i: times[i])[len(trials) // 2]]
            for r in trials:
                t, a = zip(*r["history"])
                bold = r is median_run
                ax.plot(t, a, color=color, alpha=1.0 if bold else 0.25, linewidth=2 if bold else 1,
                        label=s if bold else None)
        ax.axhline(target, color="gray", linestyle=":", linewidth=1)
        ax.set_title(f"{bed} cross traffic")
        ax.set_xlabel("training time, s")
        ax.set_ylabel("test accuracy, %")
        ax.set_ylim(0, 100)
        ax.legend(loc="lower right")
    fig.suptitle(setup, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"\nplot: {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--plot", default="")
    ap.add_argument("--setup", default="")
    a = ap.parse_args()
    runs = [json.loads(line) for line in open(a.results) if line.startswith("{")]
    beds = list(dict.fromkeys(r["bed"] for r in runs))
    if a.setup:
        print(f"\n{a.setup}")
    for bed in beds:
        report(runs, bed)
    if a.plot and runs:
        plot(runs, beds, a.plot, a.setup)


if __name__ == "__main__":
    main()
