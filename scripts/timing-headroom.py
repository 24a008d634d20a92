#!/usr/bin/env python3
"""Reads test output (`cargo test ... -- --nocapture`, one or more runs, on stdin or from the
files named) and prints, for each kind of wait, the worst time seen, in which test, the bound
and the headroom (bound / worst), least headroom first: the table in docs/testing.md
("Liveness bounds under load"). The lines it reads are the harness's
`timing: <test>: <what>: <took> of <bound>` (tests/tests/harness/timing.rs).

    python3 scripts/timing-headroom.py run1.log run2.log run3.log [--top N]
"""
import argparse
import fileinput
import re
import sys

LINE = re.compile(r"timing: (?P<test>[^ :]+(?:::[^ :]+)*): (?P<what>.+?): "
                  r"(?P<took>[0-9.]+(?:ns|µs|us|ms|s)) of (?P<bound>[0-9.]+(?:ns|µs|us|ms|s))")
UNIT = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def seconds(text):
    number = re.match(r"[0-9.]+", text).group(0)
    return float(number) * UNIT[text[len(number):]]


def headroom(bound, took):
    """bound / took, with one decimal below 10 (so 4.95 does not read as 5)."""
    ratio = bound / max(took, 1e-9)
    return f"{ratio:.1f}" if ratio < 10 else f"{ratio:.0f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="test logs (default: stdin)")
    parser.add_argument("--top", type=int, default=12, help="rows to print (default 12)")
    args = parser.parse_args()
    worst = {}
    for line in fileinput.input(args.files or ["-"], errors="replace"):
        for m in LINE.finditer(line):
            key = (m["what"], m["bound"])
            took = seconds(m["took"])
            count, old, where = worst.get(key, (0, -1.0, ""))
            if took > old:
                old, where = took, m["test"]
            worst[key] = (count + 1, old, where)
    if not worst:
        sys.exit("no `timing:` lines in the input: run the tests with -- --nocapture")
    rows = sorted(worst.items(), key=lambda kv: seconds(kv[0][1]) / max(kv[1][1], 1e-9))
    print("| Wait | Bound | Waits | Worst | In | Headroom |")
    print("|---|---|---|---|---|---|")
    for (what, bound), (count, took, test) in rows[: args.top]:
        print(f"| {what} | {bound} | {count} | {took:.3f} s | `{test}` | "
              f"{headroom(seconds(bound), took)}× |")


if __name__ == "__main__":
    main()
