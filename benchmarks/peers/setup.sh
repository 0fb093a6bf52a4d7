#!/usr/bin/env bash
# Builds one peer's virtual environment for benchmarks/peers.py from its pinned requirements:
#   benchmarks/peers/setup.sh flink     -> benchmarks/peers/.venv-flink   (needs Java 11+ on PATH or JAVA_HOME)
#   benchmarks/peers/setup.sh pathway   -> benchmarks/peers/.venv-pathway
# PYTHON picks the interpreter (default python3; the pins were made on 3.11). The environments are
# the peers' alone: neither peer is a dependency of ematix-dagster.
set -euo pipefail
peer="${1:-}"
case "$peer" in
  flink|pathway) ;;
  *) echo "usage: $0 flink|pathway" >&2; exit 2 ;;
esac
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv-$peer"
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r "$here/requirements-$peer.txt"
case "$peer" in
  flink) "$venv/bin/python" -c "import pyflink.table; print('pyflink', __import__('importlib.metadata').metadata.version('apache-flink'))" ;;
  pathway) "$venv/bin/python" -c "import pathway; print('pathway', pathway.__version__)" ;;
esac
echo "built $venv"
