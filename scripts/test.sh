#!/usr/bin/env bash
# Set up (if needed), lint and type check, make sure PostgreSQL runs on 127.0.0.1:5432, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test

# Lint and type check before the tests (configured in pyproject.toml); either failing fails the run.
.venv/bin/ruff check .
.venv/bin/python -m mypy

# The tests use a real PostgreSQL on 127.0.0.1:5432 (database "test", user postgres, trust auth).
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  if [ ! -d /etc/postgresql ]; then
    (apt-get update -qq && apt-get install -y -qq postgresql) >/dev/null
    # A fresh Debian cluster wants passwords on TCP; this throwaway test server trusts loopback.
    hba="/etc/postgresql/$(ls /etc/postgresql | sort -V | tail -n1)/main/pg_hba.conf"
    sed -i -E 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)\S+/\1trust/' "$hba"
  fi
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n1)" main start || true
  for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi

# The Dagster UI test drives Debian's headless Chromium through Debian's chromedriver.
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  (apt-get update -qq && apt-get install -y -qq chromium chromium-driver) >/dev/null
fi
# The redis_stream tests need redis-server (Debian's package): they use the machine's Redis on
# 127.0.0.1:6379 when it answers, else start their own on a free port (tests/redis_server.py).
if [ ! -x /usr/bin/redis-server ]; then
  (apt-get update -qq && apt-get install -y -qq redis-server) >/dev/null
fi

# Python writes its bytecode caches (gitignored __pycache__/): otherwise every pytest worker rewrites the
# asserts of every test module again (6 s each) and every child process compiles the package again.
unset PYTHONDONTWRITEBYTECODE

set +e
# Three workers on two cores: on two, each worker's tests kept its core busy only about 76% of the time
# (waiting on heartbeats, child processes, servers); a third fills those gaps (tests/README.md).
.venv/bin/python -m pytest -n 3 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
