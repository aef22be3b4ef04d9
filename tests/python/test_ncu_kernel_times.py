"""scripts/ncu_kernel_times.py: Nsight Compute's CSV of profiled launches -> JSON lines (times, cycles, clock,
TFLOP/s of the causal prefill), short warm-up launches dropped, and a clear error on a file that is not ncu's CSV."""

import json
import os
import subprocess
import sys

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "ncu_kernel_times.py")
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def row(launch, name, value):
    return (f'"{launch}","7","prefill_bench","127.0.0.1","prefill_hopper_kernel(PrefillParams)","1","7","(384, 1, 1)",'
            f'"(132, 1, 1)","0","9.0","Command line profiler metrics","{name}","x","{value}"\n')


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def test_launches_become_json_lines(tmp_path):
    csv = tmp_path / "ncu.csv"
    csv.write_text("==PROF== Connected to process 7\n" + HEADER
                   + row(0, "gpu__time_duration.sum", "12,681,376") + row(0, "sm__cycles_elapsed.max", "21,650,306")
                   + row(0, "sm__cycles_elapsed.avg.per_second", "1,690,886,967.56")
                   + row(0, "dram__bytes_read.sum", "1,286,574,080")
                   + row(1, "gpu__time_duration.sum", "900,352"))  # a warm-up launch, below --min-ms
    r = run("--csv", str(csv), "--impl", "retroinfer", "--n", "32768", "--min-ms", "5")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    assert len(lines) == 1
    j = lines[0]
    assert j["impl"] == "retroinfer" and j["n"] == 32768 and j["launch"] == 0
    assert j["ms"] == 12.6814 and j["cycles"] == 21650306 and j["sm_ghz"] == 1.691 and j["dram_read_gb"] == 1.287
    # 4 * 128 * 32 * 32768 * 32769 / 2 FLOPs in 12.681376 ms
    assert abs(j["tflops"] - 693.6) < 0.1
    assert j["grid"] == "(132, 1, 1)"
    # Without --n (a product, say): every launch, no TFLOP/s.
    r = run("--csv", str(csv))
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    assert r.returncode == 0 and len(lines) == 2 and "tflops" not in lines[0] and lines[1]["ms"] == 0.9004


def test_not_ncu_csv_is_refused(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text('"a","b"\n"1","2"\n')
    r = run("--csv", str(bad), "--impl", "x", "--n", "1")
    assert r.returncode != 0 and "is not ncu's --csv output" in r.stderr
    empty = tmp_path / "empty.csv"
    empty.write_text("==PROF== nothing profiled\n")
    r = run("--csv", str(empty), "--impl", "x", "--n", "1")
    assert r.returncode != 0 and "no CSV rows" in r.stderr
