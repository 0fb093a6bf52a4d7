"""The window rows ``peers.py``'s engines wrote, read into one shape, and how a peer's rows differ from ours.

Every engine's output becomes a pandas frame with the columns :data:`COLUMNS` (``items`` only for
the sketch workload): one row per (key, window start), times as epoch milliseconds. A peer's rows
are then compared with ours by (key, window start): counts exactly, sums to :data:`SUM_TOLERANCE`
(doubles added in another order differ in the last bits), distinct counts within the HLL sketch's
error (:data:`HLL_BOUND`), and session windows by one named rule (:func:`exact_gap_chains`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

COLUMNS = ["key", "start_ms", "end_ms", "n", "total"]
#: relative difference allowed between two engines' sums of the same doubles
SUM_TOLERANCE = 1e-9
#: relative error allowed between an HLL estimate at lgK 14 and the exact distinct count: three of
#: its relative standard errors, 1.04 / sqrt(2^14) (a window's few distinct items are counted exactly)
HLL_BOUND = 3 * 1.04 / 2 ** 7
#: the rule behind a session difference found by :func:`exact_gap_chains`
EXACT_GAP_RULE = ("ours joins two rows exactly the gap apart into one session (<=, as Spark's session_window and "
                  "Flink's SESSION), {peer} starts a new session there (it joins rows less than the gap apart)")


@dataclass
class Comparison:
    """A peer's rows against ours: matched rows, rows on one side only, values that differ."""

    ours: int
    peer: int
    matched: int = 0
    only_ours: int = 0
    only_peer: int = 0
    counts_differ: int = 0
    sums_differ: int = 0
    ends_differ: int = 0
    items_outside: int = 0
    items_max_rel_error: float = 0.0
    explained: list[str] = field(default_factory=list)  # rules that account for every difference left

    @property
    def equal(self) -> bool:
        return not (self.only_ours or self.only_peer or self.counts_differ or self.sums_differ or self.ends_differ
                    or self.items_outside)

    def verdict(self) -> str:
        if self.equal and not self.explained:
            return "equal" + (f" (distinct within HLL error, max {self.items_max_rel_error:.2%})"
                              if self.items_max_rel_error else "")
        if self.equal:
            return "equal but for: " + "; ".join(self.explained)
        parts = [f"{name} {value}" for name, value in (
            ("only ours", self.only_ours), ("only peer", self.only_peer), ("count differs", self.counts_differ),
            ("sum differs", self.sums_differ), ("end differs", self.ends_differ),
            ("distinct outside HLL error", self.items_outside)) if value]
        return "DIFFER: " + ", ".join(parts)


def ours_rows(target: Path) -> pd.DataFrame:
    """Our parquet target's current rows, rebuilt as emission.md says: per (window_start, key) the row
    with the largest (batch_id, _emit_seq), keys whose latest row is a retract dropped."""
    import pyarrow.dataset as ds

    table = ds.dataset(target, format="parquet", partitioning="hive").to_table()
    df = table.to_pandas()
    df = df.sort_values(["batch_id", "_emit_seq"]).drop_duplicates(["window_start", "key"], keep="last")
    df = df[df["_emit_kind"] != "retract"]
    out = pd.DataFrame({"key": df["key"].astype("int64"), "start_ms": _epoch_ms(df["window_start"]),
                        "end_ms": _epoch_ms(df["window_end"]), "n": df["n"].astype("int64"),
                        "total": df["total"].astype("float64")})
    if "items" in df:
        out["items"] = df["items"].astype("float64")
    return out.reset_index(drop=True)


def flink_rows(output: Path, distinct: bool) -> pd.DataFrame:
    """The CSV files Flink's filesystem sink wrote (no header; timestamps as SQL text)."""
    names = [*COLUMNS, *(["items"] if distinct else [])]
    files = [p for p in sorted(output.rglob("*")) if p.is_file() and not p.name.startswith(".")]
    if not files:
        return pd.DataFrame(columns=names)
    df = pd.concat([pd.read_csv(p, header=None, names=names) for p in files], ignore_index=True)
    for col in ("start_ms", "end_ms"):
        df[col] = _epoch_ms(pd.to_datetime(df[col], format="ISO8601"))  # whole seconds come without ".000"
    return df


def pathway_rows(path: Path) -> pd.DataFrame:
    """The CSV Pathway's writer made: an update stream (``time``, ``diff``); the rows whose inserts
    outnumber their deletes are the result."""
    df = pd.read_csv(path)
    cols = [c for c in df.columns if c not in ("time", "diff")]
    net = df.groupby(cols, as_index=False, dropna=False)["diff"].sum()
    return net[net["diff"] > 0].drop(columns="diff").reset_index(drop=True)


def _epoch_ms(values: pd.Series) -> pd.Series:
    values = pd.to_datetime(values)
    if values.dt.tz is not None:
        values = values.dt.tz_convert("UTC").dt.tz_localize(None)
    return (values - pd.Timestamp(0)) // pd.Timedelta(milliseconds=1)


def compare(ours: pd.DataFrame, peer: pd.DataFrame, peer_name: str, session_gap_ms: int | None = None,
            compare_ends: bool = True) -> Comparison:
    """``peer``'s rows against ``ours`` by (key, start_ms); with ``session_gap_ms``, rows on one side
    only are tested against :func:`exact_gap_chains`."""
    result = Comparison(ours=len(ours), peer=len(peer))
    both = ours.merge(peer, on=["key", "start_ms"], how="outer", suffixes=("", "_peer"), indicator=True)
    matched = both[both["_merge"] == "both"]
    result.matched = len(matched)
    result.counts_differ = int((matched["n"] != matched["n_peer"]).sum())
    scale = matched["total"].abs().clip(lower=1.0)
    result.sums_differ = int(((matched["total"] - matched["total_peer"]).abs() > SUM_TOLERANCE * scale).sum())
    if compare_ends:
        result.ends_differ = int((matched["end_ms"] != matched["end_ms_peer"]).sum())
    if "items" in ours and "items_peer" in matched:
        rel = (matched["items"] - matched["items_peer"]).abs() / matched["items_peer"].clip(lower=1)
        result.items_max_rel_error = float(rel.max()) if len(rel) else 0.0
        result.items_outside = int((rel > HLL_BOUND).sum())
    only_ours = both[both["_merge"] == "left_only"]
    result.only_ours, result.only_peer = len(only_ours), int((both["_merge"] == "right_only").sum())
    if session_gap_ms is not None and not result.equal:
        differing = matched[(matched["n"] != matched["n_peer"]) | (matched["end_ms"] != matched["end_ms_peer"])]
        chains = exact_gap_chains(ours, peer, pd.concat([differing[COLUMNS], only_ours[COLUMNS]]), session_gap_ms)
        if chains is not None:
            result.explained.append(f"{chains} session(s): " + EXACT_GAP_RULE.format(peer=peer_name))
            result.only_ours = result.only_peer = result.counts_differ = result.sums_differ = result.ends_differ = 0
    return result


def exact_gap_chains(ours: pd.DataFrame, peer: pd.DataFrame, split: pd.DataFrame, gap_ms: int) -> int | None:
    """How many of our sessions the peer split where two rows lie exactly ``gap_ms`` apart, or None
    when that does not account for every difference.

    A session ends ``gap_ms`` after its last row, so where ours joins two rows exactly ``gap_ms``
    apart, the peer's two sessions touch: the next starts where the previous ends. Each of our
    sessions in ``split`` (those the peer has not, or has with another count or end) must be such a
    chain of the key's peer sessions from the same start to the same end, with the same count and
    sum; the peer's sessions that ours has not must all be links of those chains.
    """
    by_key = {k: g.sort_values("start_ms") for k, g in peer.groupby("key")}
    links: set[tuple[int, int]] = set()
    for row in split.itertuples():
        sessions = by_key.get(row.key)
        if sessions is None:
            return None
        chain = sessions[(sessions["start_ms"] >= row.start_ms) & (sessions["start_ms"] < row.end_ms)]
        starts, ends = chain["start_ms"].to_numpy(), chain["end_ms"].to_numpy()
        if (len(chain) < 2 or starts[0] != row.start_ms or ends[-1] != row.end_ms or (starts[1:] != ends[:-1]).any()
                or int(chain["n"].sum()) != row.n
                or abs(chain["total"].sum() - row.total) > SUM_TOLERANCE * max(1.0, abs(row.total))):
            return None
        links.update((row.key, int(s)) for s in starts[1:])
    ours_keys = set(zip(ours["key"], ours["start_ms"]))
    peer_only = {(int(k), int(s)) for k, s in zip(peer["key"], peer["start_ms"]) if (k, s) not in ours_keys}
    return len(split) if peer_only == links else None
