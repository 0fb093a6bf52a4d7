"""One Pathway run of a ``peers.py`` workload, inside the Pathway virtual environment.

Pathway reads the events as one CSV file in event-time order (``mode = "static"``: the file is read
to its end, then the run ends) and groups them with ``windowby`` per key. Each window is written
once, when the event time seen passes its end by the lateness (``exactly_once_behavior(shift)``,
what ours and Flink do with a watermark ``max event time - lateness``); rows later than that are
dropped; the end of the input writes the windows still open. Times are epoch milliseconds (the
``ts`` text parsed, less the epoch, in whole milliseconds), so windows start at multiples of their length
from the epoch as ours do. A session's ``end_ms`` is its last row + the gap, as ours and Flink
state it (Pathway's own window end is the last row). Only the standard library and Pathway are
imported here: this file runs in the peer's interpreter, not ours.

Prints ``PEER ready`` once the graph is built and ``PEER done {json}`` at the end.
"""

from __future__ import annotations

import datetime
import json
import time

from runner_args import runner_args

EPOCH = datetime.datetime(1970, 1, 1)


def main() -> None:
    args = runner_args("one CSV file with a header line", "the CSV file to write")

    t0 = time.perf_counter()
    import pathway as pw

    class Events(pw.Schema):
        key: int
        amount: float
        item: str
        ts: str

    events = pw.io.csv.read(args.input, schema=Events, mode="static")
    events = events.select(pw.this.key, pw.this.amount, pw.this.item,
                           t=(pw.this.ts.dt.strptime("%Y-%m-%d %H:%M:%S.%f") - EPOCH).dt.milliseconds())
    duration_ms, gap_ms = args.duration_s * 1000, args.gap_s * 1000
    window = {"plain": pw.temporal.tumbling(duration=duration_ms),
              "sketch": pw.temporal.tumbling(duration=duration_ms),
              "hop": pw.temporal.sliding(hop=args.hop_s * 1000, duration=duration_ms),
              "session": pw.temporal.session(max_gap=gap_ms)}[args.workload]
    aggregates = {"n": pw.reducers.count(), "total": pw.reducers.sum(pw.this.amount)}
    if args.workload == "sketch":
        # exact: count_distinct_approximate (HLL) accepts append-only input only, and windowby's
        # output is not (it panics: "worker panic: assertion failed: *diff > 0")
        aggregates["items"] = pw.reducers.count_distinct(pw.this.item)
    windows = events.windowby(pw.this.t, window=window, instance=pw.this.key,
                              behavior=pw.temporal.exactly_once_behavior(shift=args.lateness_ms)).reduce(
        key=pw.this._pw_instance, start_ms=pw.this._pw_window_start,
        end_ms=pw.this._pw_window_end + (gap_ms if args.workload == "session" else 0), **aggregates)
    pw.io.csv.write(windows, args.output)
    print("PEER ready", flush=True)
    ready_s = time.perf_counter() - t0
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    print("PEER done " + json.dumps({
        "ready_s": ready_s, "run_s": time.perf_counter() - t0 - ready_s,
        "distinct": "exact count_distinct" if args.workload == "sketch" else ""}), flush=True)


if __name__ == "__main__":
    main()
