"""The job spec as it travels and is kept: its dict form, a spec an earlier release stored read
back in today's types, the public form (secrets masked) for logs, XCom and the ledger, the
private 0600 file a job reads it from, and the re-import built from a stored spec.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import tempfile

from airflow_sync_provider.core.clickhouse.layout import Layout
from airflow_sync_provider.core.content.shaping import Content
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import (
    CdcApplySpec,
    CdcBootstrapSpec,
    FullLoadSpec,
    ReconcileSpec,
    SnapshotDiffSpec,
)
from airflow_sync_provider.core.source.group import one_server

# what public_dict masks: passwords and the private keys of client certificates (core/endpoints.py)
_SECRET_KEYS = {"password", "ssl_key", "client_cert_key", "hash_salt"}
_CERTIFICATE_KEYS = {"ssl_ca", "ssl_cert", "ca_cert", "client_cert"}

SPEC_TYPES = {cls.__dataclass_fields__["job"].default: cls
              for cls in (FullLoadSpec, ReconcileSpec, CdcApplySpec, CdcBootstrapSpec, SnapshotDiffSpec)}


def spec_to_dict(spec) -> dict:
    """``dataclasses.asdict``, with a layout and content settings in the dict form they are given
    and read in (None for the mirror's): the spec's JSON, stored and sent to the job."""
    return _plain(spec)


def _plain(value):
    if isinstance(value, (Layout, Content)):
        return value.to_dict() or None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return copy.deepcopy(value)


# fields of specs an earlier release wrote (the ledger keeps specs): dropped when read back
_RETIRED = ("ledger_wait_seconds",)


def _upgrade(data: dict) -> dict:
    """A spec as an earlier release wrote it (the ledger keeps specs): its one ``source``, its
    ``select`` / ``tables`` / ``parallel_tables`` and its ``merge_into`` / ``placement`` /
    ``on_shard_removed`` in today's ``sources``, ``tableset`` and ``merge``."""
    data = {k: v for k, v in data.items() if k not in _RETIRED}
    if "source" in data:
        source = data.pop("source")
        if source and not data.get("sources"):
            data["sources"] = [{"name": "", "endpoint": source}]
    if {"select", "tables", "parallel_tables"} & set(data):
        data["tableset"] = {"select": data.pop("select", None), "tables": data.pop("tables", []),
                            "parallel": data.pop("parallel_tables", 2)}
    if "merge_into" in data:
        into, options = data.pop("merge_into"), {k: data.pop(k) for k in ("placement", "on_shard_removed") if k in data}
        if into and not data.get("merge"):
            data["merge"] = {"into": into, **options}
    return data


def spec_from_dict(data: dict):
    data = _upgrade(data)
    cls = SPEC_TYPES.get(data.pop("job", None))
    if cls is None:
        raise ValueError(f"unknown job in spec; expected one of {sorted(SPEC_TYPES)}")
    data["target"] = ClickHouseEndpoint(**data["target"])
    return cls(**data)  # sources and merge are typed by the spec itself (JobSpec.check_sources)


def reimport_spec(stored: dict, source: MySQLEndpoint, target: ClickHouseEndpoint, salt: str = "") -> FullLoadSpec:
    """The full load that re-imports a load's failed or mismatched shards, from the spec the
    ledger kept (without secrets: the endpoints, and the salt of hash transforms, are given again)."""
    stored = {k: v for k, v in _upgrade(stored).items()
              if k not in ("result_path", "sources", "target", "source_shape", "hash_salt")}
    return dataclasses.replace(spec_from_dict(stored | {"sources": one_server(source), "hash_salt": salt,
                                                        "target": dataclasses.asdict(target)}), reimport="failed")


def reimport_group_spec(stored: dict, sources: list, target: ClickHouseEndpoint, load_key: str,
                        tables: list[str]) -> FullLoadSpec:
    """The group load that re-imports a merged copy's failed or mismatched shards (its members'
    ``tables``), from one member's stored spec and the group's sources given again."""
    merge = {"into": f"{stored['target_database']}.{stored['target_table']}"}
    stored = {k: v for k, v in _upgrade(stored).items()
              if k not in ("result_path", "sources", "target", "source_shape", "member", "source_database",
                           "source_table", "target_database", "target_table", "columns", "exclude_columns",
                           "split_column", "merge")}
    return spec_from_dict(stored | {"target": dataclasses.asdict(target), "source_database": "",
                                    "source_table": "", "target_database": "", "target_table": "",
                                    "sources": list(sources), "load_key": load_key,
                                    "merge": merge, "tableset": {"tables": sorted(set(tables))}, "reimport": "failed"})


def _pem_summary(text: str) -> str:
    """A certificate (bundle) in a line: public, but a provider's CA bundle runs to 100+ KB."""
    return f"<PEM: {text.count('-----BEGIN ')} block(s), sha256 {hashlib.sha256(text.encode()).hexdigest()[:16]}>"


def public_dict(spec) -> dict:
    """The spec with every secret replaced by '***' and certificates by a one-line summary (for
    logs, XCom and the ledger)."""

    def scrub(obj):
        if isinstance(obj, dict):
            return {k: ("***" if k in _SECRET_KEYS and v else _pem_summary(v) if k in _CERTIFICATE_KEYS and v
                        and v != "certifi" else scrub(v)) for k, v in obj.items()}
        if isinstance(obj, list):  # a group's sources
            return [scrub(v) for v in obj]
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
