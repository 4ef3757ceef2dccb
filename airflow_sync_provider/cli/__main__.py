"""``python -m airflow_sync_provider.cli``: the same as ``airflow-sync``."""

import sys

from airflow_sync_provider.cli import main

sys.exit(main())
