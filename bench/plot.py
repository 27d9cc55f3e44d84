#!/usr/bin/env python3
"""Draws `moekit bench --json` results as one PNG per preset: the forward's median time against
the token count (log-log), beside the machine's floors for the same work (the bytes that must
move over the measured copy bandwidth, the flops over the measured GEMM rate, and the graph
launch floor) and, where given, bench/torch_moe.py's times for the same rows.

Usage: plot.py BENCH_JSON [BENCH_JSON ...] [--torch TORCH_JSON ...] [--out DIR] [--grid PNG]
Writes DIR/<preset>.png (DIR defaults to the current folder), and with --grid every preset in
one PNG, and prints each path."""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402


def load_bench(paths):
    """Rows by preset, and the first file's floors, GPU and commit (for the title)."""
    by_preset, floors, label = {}, None, ""
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        if "rows" not in data or "floors" not in data:
            sys.exit(f"plot.py: {path} is not a `moekit bench --json` file (no 'rows' or 'floors')")
        if floors is None:
            floors = data["floors"]
            label = " ".join(str(data[k]) for k in ("gpu", "commit", "date") if k in data)
        for row in data["rows"]:
            by_preset.setdefault(row["preset"], {})[int(row["tokens"])] = row
    return by_preset, floors, label


def load_torch(paths):
    by_preset = {}
    for path in paths:
        with open(path) as f:
            rows = json.load(f)
        if not isinstance(rows, list):
            sys.exit(f"plot.py: {path} is not a bench/torch_moe.py --json-out file (not a list)")
        for row in rows:
            by_preset.setdefault(row["preset"], {})[int(row["tokens"])] = row
    return by_preset


def draw_preset(ax, preset, rows, torch_rows, floors, title):
    tokens = sorted(rows)
    # The bench's bytes floor is the read stream (older files: the copy rate); its FLOP floor the
    # GEMM rate of the rows' weight format (older files: BF16 only).
    stream = floors.get("read_bytes_per_s", floors["copy_bytes_per_s"])
    fp8 = rows[tokens[0]].get("gemm_floor") == "FP8"
    gemm = floors["fp8_gemm_flops_per_s"] if fp8 else floors["gemm_flops_per_s"]
    moekit = [rows[t]["median_us"] for t in tokens]
    ax.plot(tokens, moekit, "o-", color="C0", lw=2, label="moekit (median)", zorder=5)
    ax.plot(tokens, [rows[t]["bytes"] / stream * 1e6 for t in tokens], "--", color="C2",
            label=f"bandwidth floor (bytes / {stream / 1e12:.2f} TB/s)")
    ax.plot(tokens, [rows[t]["flops"] / gemm * 1e6 for t in tokens], "--", color="C3",
            label=f"compute floor (flops / {gemm / 1e12:.0f} {'FP8' if fp8 else 'BF16'} TFLOP/s)")
    lowest = min(moekit)
    if "graph_launch_us" in floors:
        ax.axhline(floors["graph_launch_us"], color="0.6", ls=":", lw=1,
                   label=f"graph launch floor ({floors['graph_launch_us']:.1f} us)")
        lowest = min(lowest, floors["graph_launch_us"])
    common = [t for t in tokens if torch_rows and t in torch_rows]
    if common:
        fp8_torch = torch_rows[common[0]].get("weights_format", "bf16") != "bf16"
        ax.plot(common, [torch_rows[t]["grouped_us"] for t in common], "s-", color="C1",
                label="PyTorch torch._scaled_grouped_mm" if fp8_torch else "PyTorch torch._grouped_mm")
        looped = [t for t in common if torch_rows[t].get("loop_us") is not None]  # FP8: not timed
        if looped:
            ax.plot(looped, [torch_rows[t]["loop_us"] for t in looped], "^:", color="C4",
                    label="PyTorch loop over experts")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(tokens, [str(t) for t in tokens])
    ax.minorticks_off()
    ax.set_ylim(bottom=lowest / 2)  # the compute floor at one token is far below anything timed
    ax.set_xlabel("tokens per forward")
    ax.set_ylabel("time per forward (us)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)


def plot_preset(preset, rows, torch_rows, floors, label, out_dir):
    fig, ax = plt.subplots(figsize=(7, 4.8), dpi=110)
    draw_preset(ax, preset, rows, torch_rows, floors,
                f"{preset}, BF16" + (f" ({label})" if label else ""))
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path = os.path.join(out_dir, f"{preset}.png")
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_grid(by_preset, torch_rows, floors, label, path):
    """Every preset in one figure (two columns), one legend."""
    n = len(by_preset)
    cols = 2 if n > 1 else 1
    nrows = (n + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 4.2 * nrows + 0.8), dpi=100,
                             squeeze=False)
    for ax, (preset, rows) in zip(axes.flat, by_preset.items()):
        draw_preset(ax, preset, rows, torch_rows.get(preset), floors, preset)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=9)
    fig.suptitle("moekit forward, BF16" + (f": {label}" if label else ""), fontsize=12)
    fig.tight_layout(rect=(0, 0.6 / (4.2 * nrows + 0.8), 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", nargs="+", help="`moekit bench --json` files")
    ap.add_argument("--torch", nargs="*", default=[], help="bench/torch_moe.py --json-out files")
    ap.add_argument("--out", default=".", help="folder for the PNGs")
    ap.add_argument("--grid", help="also every preset in one PNG at this path")
    a = ap.parse_args()
    by_preset, floors, label = load_bench(a.bench)
    if not by_preset:
        sys.exit("plot.py: the bench files hold no rows")
    torch_rows = load_torch(a.torch)
    os.makedirs(a.out, exist_ok=True)
    for preset, rows in by_preset.items():
        print(plot_preset(preset, rows, torch_rows.get(preset), floors, label, a.out))
    if a.grid:
        print(plot_grid(by_preset, torch_rows, floors, label, a.grid))


if __name__ == "__main__":
    main()
