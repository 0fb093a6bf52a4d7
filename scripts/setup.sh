#!/usr/bin/env bash
# Prepare a fresh machine: check Java 17, create .venv, install the package with its pinned deps.
# Idempotent: a second run only re-checks. Usage: scripts/setup.sh [--test]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v java >/dev/null 2>&1; then
  echo "error: Java 17 is required by PySpark 4.3 but 'java' is not on PATH." >&2
  echo "       install it, e.g.: apt-get install -y openjdk-17-jre-headless" >&2
  exit 3
fi
java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
if [ "${java_major:-0}" -lt 17 ]; then
  echo "error: Java 17+ is required by PySpark 4.3; found major version '${java_major:-unknown}'." >&2
  exit 3
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
extras="."
# the tests drive a real Airflow too, so --test installs the airflow extra as well
if [ "${1:-}" = "--test" ]; then extras=".[test,airflow]"; fi
stamp=".venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)-${1:-run}"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e "$extras"
  touch "$stamp"
fi
if [ "${1:-}" = "--test" ]; then
  # The test JVMs' shared class archive (tests/jvm_options.py; ~30 s once per venv and JVM, kept in
  # ~/.cache/ematix-dagster-tests). Without it the tests still run, each driver loading Spark's classes itself.
  .venv/bin/python -m tests.jvm_options || echo "note: no class archive; the test JVMs load Spark's classes themselves" >&2
fi
