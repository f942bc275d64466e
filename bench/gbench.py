"""Google Benchmark's JSON as bench/compare, bench/side_by_side and bench/interleave read it:
one key per case, and time units in milliseconds. Standard library only."""
import re

# The attributes Google Benchmark appends to a case's name ("/iterations:3", "/min_time:...",
# "/repeats:...", "/real_time", ...): a case keeps its key when they change.
ATTRIBUTE = re.compile(r"^(iterations|min_time|min_warmup_time|repeats|threads):|^(real_time|process_time|manual_time)$")
TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def case_key(run_name):
    return "/".join(part for part in run_name.split("/") if not ATTRIBUTE.match(part))
