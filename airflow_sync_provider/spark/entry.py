"""What every spark_jobs/<job>.py script does: read the spec, run, write the result."""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from airflow_sync_provider.core.jobspec import read_spec, write_private_json
from airflow_sync_provider.spark.session import build_session


def run_job(job_function, argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True, help="path of the 0600 job-spec JSON file")
    args = parser.parse_args(argv)
    spec = read_spec(args.spec)
    name = getattr(spec, 'source_table', '') or getattr(spec, 'load_key', '') or getattr(spec, 'pipeline', '')
    spark = build_session(f"airflow-sync {spec.job} {name}")
    try:
        result = {"status": "success", **job_function(spec, spark)}
    except Exception as exc:
        # The operator raises this text, so the task log shows the job's own error.
        if spec.result_path:
            write_private_json(spec.result_path, {"status": "failed", "error": f"{type(exc).__name__}: {exc}"})
        traceback.print_exc()
        spark.stop()
        sys.exit(1)
    if spec.result_path:
        write_private_json(spec.result_path, result)
    print("airflow-sync result: " + json.dumps(result, default=str)[:2000], flush=True)
    spark.stop()
