#!/usr/bin/env python3
"""One training step's kernels from bench/ncu_kernels.sh's CSV: time a kernel, launches, share (stdlib only).

    python3 bench/ncu_summary.py NCU.csv [--step K] [--list]

The CSV is Nsight Compute's raw page (`--csv --page raw`) with gpu__time_duration.sum. Steps are told
apart by the optimizer: a step ends with its last AdamW kernel (a run of adamw kernels), so step K
(default: the last whole one) is the kernels after the (K-1)-th run of AdamW kernels up to the end of the
K-th. Kernel names are shortened (no `void`, namespaces, template arguments or parameters). --list
prints the step's kernels in launch order too. Exits 1 when the file holds no kernel durations.
"""
import argparse
import collections
import csv
import re
import sys


def short(name):
    name = re.sub(r'^void ', '', name)
    name = re.sub(r'shardlm::(<unnamed>::)?', '', name)
    return re.split(r'[<(]', name)[0][:90]


def read(path):
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own messages start with ==
    out = []
    for row in csv.DictReader(lines):
        try:
            ns = float(row['gpu__time_duration.sum'].replace(',', ''))
        except (KeyError, ValueError):
            continue  # the units row
        out.append((short(row['Kernel Name']), ns / 1e6))
    return out


def optimizer_runs(kernels):
    runs = []
    for i, (name, _) in enumerate(kernels):
        if 'adamw' not in name.lower():
            continue
        if runs and i - runs[-1][1] <= 3:  # the update's kernels, a few apart at most
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return runs


def step_kernels(kernels, k=0):
    """(label, first index, kernels) of step k (1-based; 0: the last whole one) of a run's kernels."""
    runs = optimizer_runs(kernels)
    k = k or len(runs)
    if not runs or k > len(runs):
        return 'every kernel (no whole step found)', 0, kernels
    lo = runs[k - 2][1] + 1 if k >= 2 else 0
    hi = runs[k - 1][1] + 1
    return 'step %d of %d' % (k, len(runs)), lo, kernels[lo:hi]


def by_kernel(step):
    """[(name, launches, ms)], the most time first."""
    agg = collections.defaultdict(lambda: [0, 0.0])
    for name, ms in step:
        agg[name][0] += 1
        agg[name][1] += ms
    return sorted(((name, n, ms) for name, (n, ms) in agg.items()), key=lambda row: -row[2])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('csv')
    ap.add_argument('--step', type=int, default=0, help='1-based step; 0: the last whole one')
    ap.add_argument('--list', action='store_true')
    a = ap.parse_args()
    kernels = read(a.csv)
    if not kernels:
        print('ncu_summary.py: no kernel durations in ' + a.csv, file=sys.stderr)
        return 1
    label, lo, step = step_kernels(kernels, a.step)
    total = sum(ms for _, ms in step)
    print('%s: %d kernels, %.2f ms of kernel time' % (label, len(step), total))
    print('| kernel | launches | ms | share |')
    print('| --- | ---: | ---: | ---: |')
    for name, n, ms in by_kernel(step):
        print('| %s | %d | %.3f | %.1f%% |' % (name, n, ms, 100 * ms / total))
    if a.list:
        for i, (name, ms) in enumerate(step):
            print('%5d %9.3f  %s' % (lo + i, ms, name))
    return 0


if __name__ == '__main__':
    sys.exit(main())
