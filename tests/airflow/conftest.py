"""``import airflow.sdk`` configures logging and creates ``$AIRFLOW_HOME/logs``: these tests point
``AIRFLOW_HOME`` at a directory of their own before anything imports Airflow."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="ematix-airflow-home-"))
