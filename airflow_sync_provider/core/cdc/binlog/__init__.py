"""The binlog, read as versioned target rows (python-mysql-replication underneath), by concern:

* ``library.py`` — what this package changes in python-mysql-replication 1.0.17: decoding
  corrections (lax dates, negative TIME fractions, MySQL's own charsets) and MariaDB's
  compressed events decoded by the library's own classes; applied once, when this package is
  first imported;
* ``gate.py`` — no event passes unread: :class:`~.gate.CheckedBinLogStream` looks at every event
  the server sends and stops on what could carry a followed table's changes and is not read;
* ``routes.py`` — :class:`~.routes.TableRoute`: one followed table's row changes as Arrow rows
  for its copy, with versions and tombstones;
* ``batches.py`` — what a read hands on: :class:`~.batches.Batch` (complete transactions, or a
  piece of a large one), :class:`~.batches.MidTransaction` (a cut inside one), parked XA rows;
* ``reader.py`` — :class:`~.reader.BinlogReader`: a resumable stream of batches, cut only at
  transaction boundaries (or into pieces), XA transactions parked until their commit;
* ``backlog.py`` — splitting a backlog between reader processes (SHOW BINLOG EVENTS);
* ``preflight.py`` — refusing, with what to do, a source that cannot feed CDC.

The reader resumes at a checkpoint by file and offset (``resume_stream=True``) on MySQL and
MariaDB alike: with ``is_mariadb=True`` the library ignores both unless given a GTID, and file and
offset are what versions are made of anyway.
"""

from airflow_sync_provider.core.cdc.binlog import library  # noqa: F401 - the corrections, for every reader
