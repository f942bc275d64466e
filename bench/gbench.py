"""Google Benchmark's JSON as bench/compare, bench/side_by_side and bench/interleave read it:
one key per case, and time units in milliseconds. Standard library only."""
import re

# The attributes Google Benchmark appends to a case's name ("/iterations:3", "/min_time:...",
# "/repeats:...", "/real_time", ...): a case keeps its key when they change.
VALUED = ("iterations", "min_time", "min_warmup_time", "repeats", "threads")  # "/name:value"
FLAGS = ("real_time", "process_time", "manual_time")  # "/name"
ATTRIBUTE = re.compile(rf"^({'|'.join(VALUED)}):|^({'|'.join(FLAGS)})$")
TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def case_key(run_name):
    return "/".join(part for part in run_name.split("/") if not ATTRIBUTE.match(part))


def exact_filter(key):
    """A --benchmark_filter for the case with this key alone: its name, then an attribute or the
    end (gpt_step, not gpt_step/compiled)."""
    return "^" + re.escape(key) + f"(/({'|'.join(VALUED + FLAGS)})|$)"


def times_ms(benchmarks, field="real_time"):
    """{case: [ms per repetition]} from Google Benchmark's iteration rows; aggregates (_median, ...)
    and runs that reported an error (their times mean nothing) are skipped. field: "real_time" or
    "cpu_time"."""
    times = {}
    for row in benchmarks:
        if row.get("run_type", "iteration") != "iteration" or row.get("error_occurred"):
            continue
        times.setdefault(case_key(row.get("run_name", row["name"])), []).append(
            row[field] * TO_MS[row.get("time_unit", "ns")])
    return times
