"""The Redis demo: its producer writes what ``pipelines/clicks_redis.toml`` reads, and the pipeline
validates on a machine without any environment variable set."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import redis

from ematix_dagster.cli import main
from tests.redis_server import stream_name

ROOT = Path(__file__).resolve().parent.parent


def test_producer_writes_json_clicks(redis_url):
    stream = stream_name("producer")
    proc = subprocess.run([sys.executable, "-m", "pipelines.redis_producer", "--url", redis_url, "--stream", stream,
                           "--events", "120", "--malformed", "2"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    entries = client.xrange(stream)
    assert len(entries) == 122 and "added 122 entries" in proc.stdout
    doc = json.loads(entries[0][1]["data"])
    assert set(doc) == {"user_id", "amount", "page", "ts"}
    assert entries[-1][1]["data"].startswith("not json")


def test_demo_pipeline_validates_without_environment(spark, capsys):
    assert main(["validate", str(ROOT / "pipelines" / "clicks_redis.toml")]) == 0
    assert "ok: pipeline clicks-redis" in capsys.readouterr().out
