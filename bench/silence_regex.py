"""What a silence's hostile pattern costs per match: fleetlens's matcher (RE2, alerts.silences.Matcher)
beside Python's re, the engine silences used before, on the same patterns and labels in the same run.

For each catastrophic pattern of issue 37, one fullmatch against a label of n a's and a "!" (which none
of them matches, the worst case for a backtracking engine), n growing: CPU seconds per match, the best of
`--repeat`. Python's re is measured up to n = 26 and only while one match stays under `--budget-s`, since
it grows by up to 4x for every 2 more characters; RE2 is measured at every n, up to 1,000.

    .venv/bin/python bench/silence_regex.py [--repeat 3] [--budget-s 2]
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable

from alerts.silences import Matcher

PATTERNS = ("(a+)+$", "(a|aa)+b", "(.*a){20}")
LENGTHS = (16, 18, 20, 22, 24, 26, 1000)
PYTHON_MAX_LENGTH = 26  # past it, a backtracking match may not end in a bench's time


def cpu_s(match: Callable[[str], object], label: str, repeat: int) -> float:
    """The least CPU time of `repeat` calls of `match(label)`."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        match(label)
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=2.0, help="stop measuring Python's re past this")
    args = parser.parse_args()
    print(f"{'pattern':<12} {'n':>5} {'RE2 (fleetlens) s':>18} {'Python re s':>12}")
    for pattern in PATTERNS:
        matcher = Matcher("node", "=~", pattern)
        python = re.compile(pattern)
        python_done = False
        for n in LENGTHS:
            label = "a" * n + "!"
            ours = cpu_s(lambda value, m=matcher: m.matches({"node": value}), label, args.repeat)
            theirs = "skipped"
            if not python_done and n <= PYTHON_MAX_LENGTH:
                seconds = cpu_s(python.fullmatch, label, 1 if n > 20 else args.repeat)
                theirs, python_done = f"{seconds:.6f}", seconds > args.budget_s
            print(f"{pattern:<12} {n:>5} {ours:>18.6f} {theirs:>12}")


if __name__ == "__main__":
    main()
