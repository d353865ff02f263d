#!/usr/bin/env python3
"""bench/ncu_summary.py on a synthetic Nsight Compute CSV whose answer is known (python3 stdlib only; ctest's
ncu_summary test runs it from the source tree): ncu's own messages and the units row skipped, durations with
thousands separators, template arguments and namespaces cut from the names, steps told apart by the AdamW runs."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import ncu_summary as ns  # noqa: E402

failures = []


def expect(name, got, want):
    if got != want:
        failures.append(f"{name}: got {got!r}, want {want!r}")


GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
NORM = "void shardlm::<unnamed>::rmsnorm_forward_kernel<__nv_bfloat16, 8>(const T1 *, float)"
ADAM = "void shardlm::<unnamed>::adamw_kernel<float>(float *, unsigned long)"
# (name, ns): step 1 = norm, gemm, adam, adam; step 2 = norm, gemm, gemm, adam, (unrelated), adam, adam
launches = [(NORM, 20000), (GEMM, 1000000), (ADAM, 4000000), (ADAM, 2500),
            (NORM, 21000), (GEMM, 1200000), (GEMM, 1300000), (ADAM, 3000000), (NORM, 1000), (ADAM, 2000000),
            (ADAM, 2600)]


def write_csv(path):
    with open(path, "w") as f:
        f.write("==PROF== Connected to process 674\n")
        f.write('"ID","Kernel Name","Stream","gpu__time_duration.sum"\n')
        f.write('"","","","ns"\n')
        for i, (name, dur) in enumerate(launches):
            f.write('"%d","%s","13","%s"\n' % (i, name, format(dur, ",")))
        f.write("==PROF== Disconnected from process 674\n")


with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "ncu.csv")
    write_csv(path)
    kernels = ns.read(path)
    expect("kernels read", len(kernels), len(launches))
    expect("short names", sorted({n for n, _ in kernels}), sorted({"rmsnorm_forward_kernel", GEMM, "adamw_kernel"}))
    expect("thousands separators", kernels[1][1], 1.0)
    expect("optimizer runs", ns.optimizer_runs(kernels), [[2, 3], [7, 10]])
    label, lo, step = ns.step_kernels(kernels)
    expect("last step label", label, "step 2 of 2")
    expect("last step start", lo, 4)
    expect("last step length", len(step), 7)
    expect("by kernel", [(n, c, round(ms, 4)) for n, c, ms in ns.by_kernel(step)],
           [("adamw_kernel", 3, 5.0026), (GEMM, 2, 2.5), ("rmsnorm_forward_kernel", 2, 0.022)])
    label, lo, step = ns.step_kernels(kernels, 1)
    expect("first step", (label, lo, len(step)), ("step 1 of 2", 0, 4))
    expect("no optimizer", ns.step_kernels(kernels[:2])[0], "every kernel (no whole step found)")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ncu_summary.py"), path],
                         capture_output=True, text=True)
    expect("exit status", out.returncode, 0)
    expect("headline", out.stdout.splitlines()[0], "step 2 of 2: 7 kernels, 7.52 ms of kernel time")
    empty = os.path.join(tmp, "empty.csv")
    with open(empty, "w") as f:
        f.write("==ERROR== the profiler could not read the GPU\n")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ncu_summary.py"), empty],
                         capture_output=True, text=True)
    expect("exit status without kernels", out.returncode, 1)

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("ncu_summary: ok")
