"""One Flink SQL run of a ``peers.py`` workload, inside the Flink virtual environment.

PyFlink starts Flink's JVM (a local mini-cluster: job manager and one task manager in one process)
as a child of this process, so ``peers.py`` measures both as one process tree. The job is Flink
SQL with window table-valued functions over the generated CSV files: event time ``ts`` with a
watermark ``ts - lateness``, parallelism 1 and one bounded filesystem source, whose final watermark
closes every window; the windows' rows go to CSV files in ``--output``. Only the standard library
and PyFlink are imported here: this file runs in the peer's interpreter, not ours.

Prints ``PEER ready`` once the JVM and the catalog are up (what ``peers.py`` counts as the start)
and ``PEER done {json}`` at the end.
"""

from __future__ import annotations

import json
import time

from runner_args import runner_args

#: a workload's window table-valued function, by workload (the same windows as ours)
WINDOWS = {
    "plain": "TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '{duration_s}' SECOND)",
    "sketch": "TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '{duration_s}' SECOND)",
    "hop": "HOP(TABLE events, DESCRIPTOR(ts), INTERVAL '{hop_s}' SECOND, INTERVAL '{duration_s}' SECOND)",
    "session": "SESSION(TABLE events PARTITION BY `key`, DESCRIPTOR(ts), INTERVAL '{gap_s}' SECOND)",
}


def main() -> None:
    args = runner_args("a directory of headerless CSV files, or one such file", "a directory for the output CSV files")

    from pyflink.table import EnvironmentSettings, TableEnvironment

    t0 = time.perf_counter()
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    conf.set("parallelism.default", "1")
    conf.set("table.exec.resource.default-parallelism", "1")
    env.execute_sql(f"""
        CREATE TABLE events (`key` BIGINT, amount DOUBLE, item STRING, ts TIMESTAMP(3),
                             WATERMARK FOR ts AS ts - INTERVAL '{args.lateness_ms / 1000:.3f}' SECOND)
        WITH ('connector' = 'filesystem', 'path' = 'file://{args.input}', 'format' = 'csv')""")
    distinct = args.workload == "sketch"
    env.execute_sql(f"""
        CREATE TABLE windows (`key` BIGINT, window_start TIMESTAMP(3), window_end TIMESTAMP(3), n BIGINT,
                              total DOUBLE{', items BIGINT' if distinct else ''})
        WITH ('connector' = 'filesystem', 'path' = 'file://{args.output}', 'format' = 'csv')""")
    print("PEER ready", flush=True)
    ready_s = time.perf_counter() - t0
    window = WINDOWS[args.workload].format(duration_s=args.duration_s, hop_s=args.hop_s, gap_s=args.gap_s)
    env.execute_sql(f"""
        INSERT INTO windows
        SELECT `key`, window_start, window_end, COUNT(*), SUM(amount){', COUNT(DISTINCT item)' if distinct else ''}
        FROM TABLE({window})
        GROUP BY `key`, window_start, window_end""").wait()
    print("PEER done " + json.dumps({"ready_s": ready_s, "run_s": time.perf_counter() - t0 - ready_s,
                                     "distinct": "exact COUNT(DISTINCT)" if distinct else ""}), flush=True)


if __name__ == "__main__":
    main()
