#!/usr/bin/env python3
"""Every message quoted in a heading of docs/troubleshooting.md ("### `text`") still appears in the
code, so the page cannot drift from what users see.

    check_troubleshooting.py REPO_ROOT
"""
import pathlib
import re
import sys

SOURCES = ("client", "server", "common")


def main():
    root = pathlib.Path(sys.argv[1])
    quoted = re.findall(r"^### `([^`]+)`", (root / "docs/troubleshooting.md").read_text(), re.MULTILINE)
    if not quoted:
        sys.exit("docs/troubleshooting.md quotes no message")
    code = "\n".join(p.read_text(errors="replace") for d in SOURCES for p in (root / d).rglob("*")
                     if p.suffix in (".cc", ".h", ".py") and p.is_file())
    missing = [q for q in quoted if q not in code]
    for q in missing:
        print(f"docs/troubleshooting.md quotes `{q}`, which no longer appears in {', '.join(SOURCES)}")
    print(f"{len(quoted) - len(missing)} of {len(quoted)} quoted messages found")
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()
