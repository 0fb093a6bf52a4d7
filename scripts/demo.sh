#!/usr/bin/env bash
# Set up (if needed) and run the demo pipeline on local Spark with the embedded defaults:
# sample click events are generated under demo/, windows are printed to the console.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m ematix_dagster.demo "$@"
