"""The MySQL side: table schemas, the shard planner, the bulk reader."""
