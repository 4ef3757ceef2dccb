"""Reader processes: how many a bounded catch-up uses (spark/cdc_stream.reader_count), where they come from."""

from __future__ import annotations

import os

import pytest

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import CdcApplySpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark import cdc_stream

SPEC = dict(sources=one_server(MySQLEndpoint("127.0.0.1", 3306, "u", "p")),
            target=ClickHouseEndpoint("127.0.0.1", 8123), pipeline="p")


def test_by_default_one_reader_per_core_of_the_driver_within_its_cgroup_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(cdc_stream, "CPU_MAX", tmp_path / "none")  # no cgroup v2 quota file
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)))
    assert cdc_stream.reader_count(CdcApplySpec(**SPEC)) == 6
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert cdc_stream.reader_count(CdcApplySpec(**SPEC)) == cdc_stream.MAX_READERS
    quota = tmp_path / "cpu.max"
    monkeypatch.setattr(cdc_stream, "CPU_MAX", quota)
    for text, cores in (("150000 100000", 2), ("max 100000", 8), ("50000 100000", 1), ("garbage", 8)):
        quota.write_text(text + "\n")
        assert cdc_stream.reader_count(CdcApplySpec(**SPEC)) == cores, text


def test_an_explicit_number_of_readers_is_kept_and_a_negative_one_refused(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert cdc_stream.reader_count(CdcApplySpec(**SPEC, readers=1)) == 1
    assert cdc_stream.reader_count(CdcApplySpec(**SPEC, readers=12)) == 12
    with pytest.raises(ValueError, match=r"readers >= 1 \(0: from the driver's cores\)"):
        CdcApplySpec(**SPEC, readers=-1)


def _parents(out):
    import multiprocessing

    out.put((os.getppid(), multiprocessing.parent_process().pid))


def test_reader_processes_are_forks_of_a_fork_server_and_watch_the_driver():
    """Readers are forked from one server that imported the decoder once (spawned, each imported
    it itself: ≈1.5 CPU-s, 9.5 s until a group's first change on 2 cores). Their parent is that
    server; the driver whose death must stop them (_hand_over) is still this process."""
    context = cdc_stream.reader_processes()
    assert context.get_start_method() == "forkserver"
    out = context.Queue()
    proc = context.Process(target=_parents, args=(out,), daemon=True)
    proc.start()
    parent, driver = out.get(timeout=120)
    proc.join(30)
    assert driver == os.getpid() and parent != os.getpid()
