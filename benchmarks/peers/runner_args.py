"""The command line every peer runner takes from ``peers.py``: one parser, so the three runners
cannot drift apart. Standard library only: each runner imports it from its own directory, in its
own peer's interpreter."""

from __future__ import annotations

import argparse

WORKLOADS = ("plain", "sketch", "hop", "session")


def runner_args(input_help: str, output_help: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=WORKLOADS, required=True)
    ap.add_argument("--input", required=True, help=input_help)
    ap.add_argument("--output", required=True, help=output_help)
    ap.add_argument("--lateness-ms", type=int, required=True)
    ap.add_argument("--duration-s", type=int, default=60)
    ap.add_argument("--hop-s", type=int, default=30)
    ap.add_argument("--gap-s", type=int, default=30)
    return ap.parse_args()
