#!/usr/bin/env python3
"""Where a kernel's warps stall, by SASS line: reads ncu's source page as CSV
(`ncu --section SourceCounters --page source --print-source sass --csv ...`) and prints the lines
with the most warp-stall samples, as a share of all samples. Samples count every warp: in a
warp-specialized kernel the producer and scheduler warps' waits are part of the total.
Usage: ncu_top_stalls.py SOURCE_CSV [LINES]"""
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    lines = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with open(sys.argv[1]) as f:
        rows = list(csv.reader(line for line in f if not line.startswith("==")))
    for i, row in enumerate(rows):
        if "Warp Stall Sampling (All Samples)" in row:
            header, body = row, rows[i + 1:]
            break
    else:
        sys.exit("no 'Warp Stall Sampling (All Samples)' column in " + sys.argv[1])
    samples = header.index("Warp Stall Sampling (All Samples)")
    source = header.index("Source") if "Source" in header else 1
    body = [r for r in body if len(r) > samples]
    total = sum(number(r[samples]) for r in body) or 1.0
    print("%d samples over %d SASS lines" % (total, len(body)))
    for r in sorted(body, key=lambda r: -number(r[samples]))[:lines]:
        print("%6.2f%%  %s  %s" % (100 * number(r[samples]) / total, r[0][-6:], r[source].strip()[:90]))


if __name__ == "__main__":
    main()
