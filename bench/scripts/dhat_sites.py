#!/usr/bin/env python3
"""Groups a dhat profile's heap at its peak (t-gmax) by allocation site.

Usage: dhat_sites.py DHAT_JSON [RUNS] [FRAMES]

Each site is named by its first FRAMES (default 2) Rein frames; the bytes
and blocks are divided by RUNS (default 10 000, W2's runs). See
docs/performance.md, "Where W2's memory goes".
"""
import collections
import json
import re
import sys


def main():
    profile = json.load(open(sys.argv[1]))
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 10000
    depth = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    frames_table = profile["ftbl"]
    size = collections.Counter()
    blocks = collections.Counter()
    for site in profile["pps"]:
        if not site.get("gb"):
            continue
        frames = [frames_table[i] for i in site["fs"]]
        ours = [f for f in frames if ("rein" in f or "bench" in f) and "alloc::" not in f]
        name = " <- ".join(re.sub(r"^0x[0-9A-F]+: ", "", f)[:110] for f in ours[:depth])
        name = name or frames[min(1, len(frames) - 1)][:120]
        size[name] += site["gb"]
        blocks[name] += site.get("gbk", 0)
    total = sum(size.values())
    print(f"total {total} B, {total / runs:.0f} B/run")
    for name, bytes_ in size.most_common(40):
        print(f"{bytes_ / runs:8.0f} B {blocks[name] / runs:5.1f} blk  {name}")


if __name__ == "__main__":
    main()
