#!/usr/bin/env bash
# Set up (if needed), make sure PostgreSQL runs on 127.0.0.1:5432, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test

if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  if [ -d /etc/postgresql ]; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n1)" main start || true
  else
    (apt-get update -qq && apt-get install -y -qq postgresql) >/dev/null
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n1)" main start || true
  fi
fi

set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
