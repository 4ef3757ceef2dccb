"""The ClickHouse side: table layout and publishing, shards evaluated on the target."""
