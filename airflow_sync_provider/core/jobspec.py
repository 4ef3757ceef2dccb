"""The job spec: one typed object the operator writes and the Spark job reads.

It carries passwords, so it travels as a 0600 file (never on argv); ``public_dict`` is the
form that may be logged or pushed to XCom.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass, field

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.planning import DEFAULT_SPLIT_FACTOR, STRATEGIES, SpeedLimits

_SECRET_KEYS = {"password"}


@dataclass
class FullLoadSpec:
    """Copy one MySQL table into a ClickHouse table (published atomically)."""

    source: MySQLEndpoint
    target: ClickHouseEndpoint
    source_database: str
    source_table: str
    target_database: str
    target_table: str
    channels: int | None = 2
    batch_rows: int = 65536
    split_column: str | None = None
    split_factor: int = DEFAULT_SPLIT_FACTOR
    strategy: str = "balanced"
    # DataX flow control: global and per-channel bytes/s and records/s (None = unlimited)
    byte_speed: int | None = None
    record_speed: int | None = None
    channel_byte_speed: int | None = None
    channel_record_speed: int | None = None
    result_path: str = ""
    job: str = field(default="full_load", init=False)

    def __post_init__(self):
        self.speed().channel_count()  # a bad speed/channel configuration fails before submitting
        if self.batch_rows < 1:
            raise ValueError(f"batch_rows must be >= 1, got {self.batch_rows} (table {self.source_table})")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")

    def speed(self) -> SpeedLimits:
        return SpeedLimits(channels=self.channels, byte=self.byte_speed, record=self.record_speed,
                           channel_byte=self.channel_byte_speed, channel_record=self.channel_record_speed)


SPEC_TYPES = {cls.__dataclass_fields__["job"].default: cls for cls in (FullLoadSpec,)}
_ENDPOINTS = {"source": MySQLEndpoint, "target": ClickHouseEndpoint}


def spec_to_dict(spec) -> dict:
    return dataclasses.asdict(spec)


def spec_from_dict(data: dict):
    data = dict(data)
    cls = SPEC_TYPES.get(data.pop("job", None))
    if cls is None:
        raise ValueError(f"unknown job in spec; expected one of {sorted(SPEC_TYPES)}")
    for key, endpoint in _ENDPOINTS.items():
        if key in data:
            data[key] = endpoint(**data[key])
    return cls(**data)


def public_dict(spec) -> dict:
    """The spec with every secret replaced by '***' (for logs and XCom)."""

    def scrub(obj):
        if isinstance(obj, dict):
            return {k: ("***" if k in _SECRET_KEYS and v else scrub(v)) for k, v in obj.items()}
        return obj

    return scrub(spec_to_dict(spec))


def write_private_json(path: str, data: dict) -> None:
    """Write JSON readable by the owner only (0600 from creation; atomic rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")  # mkstemp creates with 0600
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def write_spec(spec, path: str) -> None:
    write_private_json(path, spec_to_dict(spec))


def read_spec(path: str):
    with open(path) as fh:
        return spec_from_dict(json.load(fh))
