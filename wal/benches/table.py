#!/usr/bin/env python3
"""Prints the markdown tables of wal/BENCH.md from the last criterion run
(target/criterion/*/new/estimates.json, median point estimates)."""
import json, decimal
import os, sys
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "target", "criterion")
payloads = [("64B", 64), ("1KiB", 1024), ("64KiB", 65536)]
batches = [1, 64]
def med(group, label, batch):
    d = json.load(open(f"{root}/{group}/{label}/batch{batch}/new/estimates.json"))
    b = json.load(open(f"{root}/{group}/{label}/batch{batch}/new/benchmark.json"))
    t = b["throughput"]["ElementsAndBytes"]
    return d["median"]["point_estimate"], t["elements"], t["bytes"]
def sig(x):
    d = decimal.Decimal(repr(x))
    q = d.quantize(decimal.Decimal(1).scaleb(d.adjusted() - 2), rounding=decimal.ROUND_HALF_EVEN)
    s = format(q, "f")
    if "." not in s:
        s = f"{int(s):,}"
    return s
def dur(ns):
    for unit, f in (("ms", 1e6), ("µs", 1e3), ("ns", 1)):
        if ns >= f:
            return f"{sig(ns / f)} {unit}"
out = []
for mode, base, bname in (("memory", "memcpy_baseline", "memcpy into mmap"), ("fsync", "pwrite_fdatasync_baseline", "pwrite + fdatasync")):
    out.append(f"### `{mode}` vs {bname} (`{base}`)\n")
    out.append(f"| payload | batch | ringraft median / batch | ringraft records/s | ringraft MB/s | baseline median / batch | baseline records/s | baseline MB/s | ringraft ÷ baseline (time per record) |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, size in payloads:
        for batch in batches:
            r, re, rb = med(mode, label, batch)
            b, be, bb = med(base, label, batch)
            assert re == be == batch and rb == bb == size * batch
            rr = batch / (r * 1e-9); br = batch / (b * 1e-9)
            out.append(f"| {label} | {batch} | {dur(r)} | {sig(rr)} | {sig(rr*size/1e6)} | {dur(b)} | {sig(br)} | {sig(br*size/1e6)} | {sig(r/b)} |")
    out.append("")
print("\n".join(out))
