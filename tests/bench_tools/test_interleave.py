#!/usr/bin/env python3
"""bench/interleave against fake benchmark binaries whose times are known.

    test_interleave.py PATH_TO_bench/interleave

Each fake writes Google Benchmark's JSON: its own speed times a drift that changes every round
(as a shared host's load does), plus an aggregate row with a wrong value that must be ignored.
Pairing within rounds must give the exact speed ratio despite the drift; a failing binary must
stop the tool with its name.
"""
import os
import pathlib
import subprocess
import sys
import tempfile

FAKE = r'''#!{python}
import json, pathlib, sys
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
counter = pathlib.Path({counter!r})
calls = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(calls + 1))
if {fail}:
    sys.exit("fake bench: broken on purpose")
drift = 1 + calls // 2  # the same for both binaries of a round (two calls), another each round
rows = []
for rep in range(int(args["benchmark_repetitions"])):
    spike = {spike} if rep == 0 else 1  # another tenant slowing the first repetition of every call
    rows.append({{"name": "case_a/real_time", "run_type": "iteration", "time_unit": "ms",
                 "real_time": {speed} * drift * spike, "cpu_time": {speed} * drift * spike * 0.5}})
rows.append({{"name": "case_a/real_time_median", "run_type": "aggregate", "time_unit": "ms",
             "real_time": 1e9, "cpu_time": 1e9}})
with open(args["benchmark_out"], "w") as f:
    json.dump({{"benchmarks": rows}}, f)
'''


def fake(directory, name, speed, counter, fail=False, spike=1):
    path = pathlib.Path(directory) / name
    path.write_text(FAKE.format(python=sys.executable, counter=str(counter), speed=speed, fail=fail, spike=spike))
    path.chmod(0o755)
    return str(path)


def run(interleave, *args):
    return subprocess.run([sys.executable, interleave, *args], capture_output=True, text=True)


def check(condition, message, result):
    if not condition:
        sys.exit(f"FAILED: {message}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}")


def main():
    interleave = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        counter = pathlib.Path(tmp) / "calls"
        old = fake(tmp, "old_bench", 2.0, counter)
        new = fake(tmp, "new_bench", 1.0, counter)

        r = run(interleave, old, new, "--filter", "case", "--rounds", "3", "--repetitions", "2")
        check(r.returncode == 0, "a clean run exits 0", r)
        row = [line for line in r.stdout.splitlines() if line.startswith("| `")]
        check(len(row) == 1, "one row, for case_a: none for the aggregate", r)
        # Rounds drift by 1x, 2x, 3x: base median 2 ms x 2 = 4 ms; every paired ratio exactly 0.5.
        check(row[0] == "| `case_a` | 4 | 0.500 [0.50..0.50], fastest 0.500 |", f"row is {row[0]!r}", r)

        # The new binary's first repetition is 3x slow in every call: the median of its two
        # repetitions (1 and 3 ms x drift) equals the old one's, while its fastest run is still half.
        counter.unlink()
        spiky = fake(tmp, "spiky_bench", 1.0, counter, spike=3)
        r = run(interleave, old, spiky, "--filter", "case", "--rounds", "3", "--repetitions", "2")
        check(r.returncode == 0 and "| `case_a` | 4 | 1.000 [1.00..1.00], fastest 0.500 |" in r.stdout,
              "the fastest runs' ratio sees past a slowed repetition", r)

        counter.unlink()
        r = run(interleave, old, new, "--filter", "case", "--rounds", "1", "--clock", "cpu")
        check(r.returncode == 0 and "| `case_a` | 1 | 0.500" in r.stdout, "--clock cpu takes cpu_time", r)

        broken = fake(tmp, "broken_bench", 1.0, counter, fail=True)
        r = run(interleave, old, broken, "--filter", "case", "--rounds", "1")
        check(r.returncode != 0 and "broken_bench failed" in r.stderr, "a failing binary is named", r)

        r = run(interleave, old, "--filter", "case")
        check(r.returncode != 0 and "at least two binaries" in r.stderr, "one binary is refused", r)
        r = run(interleave, old, new, "--filter", "case", "--rounds", "0")
        check(r.returncode != 0 and "must be positive" in r.stderr, "--rounds 0 is refused", r)
    print("bench/interleave: all checks passed")


if __name__ == "__main__":
    main()
