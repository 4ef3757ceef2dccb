from __future__ import annotations


def build_session(app_name: str):
    """The session spark-submit configured (master, conf); nothing is hard-coded here."""
    from pyspark.sql import SparkSession

    return SparkSession.builder.appName(app_name).getOrCreate()
