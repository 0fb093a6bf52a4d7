"""Payload decoding of message sources (ematix_dagster.spark.sources.payloads) and their keys.

Kafka has no broker here: its decoding runs on a DataFrame with Kafka's own schema, as the Kafka
reader would hand it over. Redis decoding runs against a real server in tests/e2e/test_redis_stream.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
import tomli_w

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spark.sources.readers import kafka_columns, redis_options, with_engine_columns
from ematix_dagster.spark.sources.redis_source import RedisStreamReader
from ematix_dagster.spec import load_pipeline_str

KAFKA_SCHEMA = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
                "timestampType INT")
UTC = dt.timezone.utc


def spec_with(source: dict):
    doc = {"pipeline_name": "p", "sources": [{"name": "events", **source}],
           "transform": {"window": {"kind": "tumbling", "duration_ms": 60_000, "group_by": ["k"],
                                    "max_groups_per_window": 10, "aggregations": [{"agg": "count", "as": "n"}]}},
           "target": {"kind": "console"}, "run": {"checkpoint_location": "/tmp/unused-cp"},
           "state_store": {"kind": "in_memory"}}
    return load_pipeline_str(tomli_w.dumps(doc))


KAFKA = {"kind": "kafka", "bootstrap_servers": "127.0.0.1:9092", "topic": "t"}


def test_kafka_json_values_decode_with_a_payload_event_time(spark):
    spec = spec_with({**KAFKA, "format": "json", "schema": "k STRING, v BIGINT, at TIMESTAMP",
                      "event_time_column": "at"})
    broker_ts = dt.datetime(2024, 5, 1, tzinfo=UTC)
    values = [b'{"k": "a", "v": 1, "at": "2024-01-01T00:00:10Z"}', b"{not json", b'{"k": "b", "v": "x"}', None]
    df = spark.createDataFrame([(b"key", v, "t", 0, i, broker_ts, 0) for i, v in enumerate(values)], KAFKA_SCHEMA)
    rows = with_engine_columns(kafka_columns(df, spec.sources[0], "sources[0]"), spec, 0).orderBy("offset").collect()
    assert [r._corrupt_record for r in rows] == [None, "{not json", '{"k": "b", "v": "x"}', ""]
    assert (rows[0].k, rows[0].v) == ("a", 1)
    assert rows[0]._event_ts == dt.datetime(2024, 1, 1, 0, 0, 10)  # the payload's time, not the broker's
    assert rows[0].key == "key" and rows[0].topic == "t"


def test_kafka_json_values_default_to_the_broker_time(spark):
    spec = spec_with({**KAFKA, "format": "json", "schema": "k STRING"})
    broker_ts = dt.datetime(2024, 5, 1, 12, 0)
    df = spark.createDataFrame([(None, b'{"k": "a"}', "t", 0, 0, broker_ts, 0)], KAFKA_SCHEMA)
    (row,) = with_engine_columns(kafka_columns(df, spec.sources[0], "sources[0]"), spec, 0).collect()
    assert (row.k, row._event_ts, row._corrupt_record) == ("a", broker_ts, None)


@pytest.mark.parametrize("source,key,words", [
    ({**KAFKA, "format": "fields", "schema": "k STRING"}, "sources[0].format", '"json"'),
    ({**KAFKA, "schema": "k STRING"}, "sources[0].schema", "does not decode"),
    ({"kind": "redis_stream", "url": "redis://h/0", "streams": ["s"], "format": "json"}, "sources[0].schema",
     "required"),
    ({"kind": "redis_stream", "url": "redis://h/0", "streams": [], "format": "fields", "schema": "k STRING"},
     "sources[0].streams", "required"),
    ({"kind": "redis_stream", "url": "http://h", "streams": ["s"], "format": "fields", "schema": "k STRING"},
     "sources[0].url", "Redis URL"),
    ({"kind": "redis_stream", "url": "redis://h/0", "streams": ["s"], "format": "fields", "schema": "k STRING",
      "start": "yesterday"}, "sources[0].start", "entry id"),
    ({"kind": "redis_stream", "url": "redis://h/0", "streams": ["s"], "format": "fields", "schema": "k STRING",
      "on_trimmed": "ignore"}, "sources[0].on_trimmed", "skip"),
    ({"kind": "files", "format": "json", "path": "/tmp", "schema": "k STRING", "event_time_column": "k",
      "streams": ["s"]}, "sources[0].streams", "does not apply"),
])
def test_message_source_keys_are_checked(source, key, words):
    with pytest.raises(PipelineConfigError) as err:
        spec_with(source)
    assert err.value.key == key and words in str(err.value)


def test_redis_url_reaches_the_reader_as_written(monkeypatch):
    """``${NAME}`` in a Redis URL is expanded by the reader, so Spark's options never hold the password."""
    monkeypatch.setenv("REDIS_PASSWORD", "s3cret-value")
    spec = spec_with({"kind": "redis_stream", "url": "redis://:${REDIS_PASSWORD}@127.0.0.1:6379/0",
                      "streams": ["a", "b"], "format": "fields", "schema": "k STRING", "max_entries_per_trigger": 9})
    options = redis_options(spec.resolved().sources[0])
    assert options == {"url": "redis://:${REDIS_PASSWORD}@127.0.0.1:6379/0", "streams": '["a", "b"]',
                       "max_entries": "9"}


def test_the_redis_reader_fills_the_documented_defaults_and_takes_what_the_spec_sets():
    spec = spec_with({"kind": "redis_stream", "url": "redis://h/0", "streams": ["s"], "format": "fields",
                      "schema": "k STRING"})
    unset = RedisStreamReader(redis_options(spec.sources[0]))
    assert (unset.start, unset.skip_trimmed, unset.max_entries) == ("earliest", False, None)  # the contract's defaults
    source = dataclasses.replace(spec.sources[0], start="latest", on_trimmed="skip")
    given = RedisStreamReader(redis_options(source))
    assert (given.start, given.skip_trimmed) == ("latest", True)


def test_a_password_typed_into_a_redis_url_is_warned_about():
    from ematix_dagster.spec import spec_warnings

    spec = spec_with({"kind": "redis_stream", "url": "redis://:hunter2-typed@127.0.0.1:6379/0", "streams": ["s"],
                      "format": "fields", "schema": "k STRING"})
    (warning,) = spec_warnings(spec)
    assert warning.startswith("sources[0].url: the URL holds a password") and "hunter2-typed" not in warning
    assert 'url = "redis://:${REDIS_PASSWORD}@host:6379/0"' in warning and "postgresql" not in warning, warning


@pytest.mark.parametrize("source,line,position", [
    ({**KAFKA, "format": "json", "schema": "k STRING"}, '{"t":{"0":42,"1":7}}', {"t": {"0": 42, "1": 7}}),
    ({"kind": "rate", "rows_per_second": 5}, "12", 12),
])
def test_state_shows_kafka_and_rate_positions_from_the_committed_offsets(source, line, position):
    """A Kafka source's next offsets per topic and partition (made-up offsets: no broker here), the rate
    source's offset, as the last committed batch left them; nothing for a source that committed none."""
    from ematix_dagster.operations import positions
    from state_store.contract import PipelineRecord

    spec = spec_with(source)
    record = PipelineRecord("p", 1, last_batch_id=3, offsets={"events": line})
    assert positions(spec, record) == {"events": {"kind": source["kind"], "offsets": position}}
    assert positions(spec, None) == {"events": None}
