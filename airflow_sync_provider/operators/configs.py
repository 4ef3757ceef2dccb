"""The job operators' settings as config objects, documented once (docs/operators/configs.md).

As astronomer-cosmos groups a dbt run's settings (``ProjectConfig``, ``ExecutionConfig``,
``RenderConfig``), the operators take four groups of settings as objects, beside the plain
arguments they stand for (both forms keep working)::

    from airflow_sync_provider.operators import Content, Layout, Selection, SpeedLimits

    FullLoadOperator(task_id="load", selection=Selection(table="orders", target_database="copy"),
                     layout=Layout(order_by=["status"], partition_by="toYYYYMM(created_at)"),
                     content=Content(transform={"email": "hash"}, row_filter="tenant_id = 7"),
                     speed=SpeedLimits(channels=4, channel_byte=20 << 20))

Each object may also be given in its dict form (``speed={"channels": 4}``), and ``Layout.of`` /
``Content.of`` build (and check) one from it at once.

``selection=Selection(…)`` — the tables: ``table``, ``select``, ``tables``, ``columns``,
    ``exclude_columns``, ``source_database``, ``target_database``, ``target_table``; each field
    is documented on :class:`~airflow_sync_provider.core.selection.Selection`. Operators other than
    the full load take only ``select`` and ``tables``.

``layout=Layout(…)`` (or its dict form) — how the copies are laid out in ClickHouse
    (docs/layouts.md): ``order_by``, ``partition_by``, ``primary_key``, ``ttl``, ``settings``,
    ``engine``, ``cluster``, ``json``, ``geo``. A ``tables`` or ``select`` entry's own ``layout``
    goes over it. An existing copy keeps its layout unless reshaped (``airflow-sync reshape``,
    ``CdcApplyOperator(reshape=True)``); a job asking for another is refused, naming both.

``content=Content(…)`` (or the plain ``transform=``, ``row_filter=``, ``on_delete=``, ``history=``) —
    what the copies hold (docs/content.md):

    * ``transform``: column transforms, ``{"email": "hash", "phone": "mask(0,4)", "note": "null",
      "bio": "truncate(100)", "name": "redact('***')"}``; a ``tables`` / ``select`` entry's own
      ``transform`` goes over it (by column). ``hash`` needs ``hash_salt_conn_id`` or
      ``hash_salt_env``;
    * ``row_filter``: the rows the copies hold, a MySQL condition (``"tenant_id = 7"``); loads read
      only those, CDC decides on each row image as MySQL would;
    * ``on_delete``: ``"keep"``: a row deleted at the source stays in the copy, marked in
      ``_deleted_at_source`` (default ``"delete"``);
    * ``history``: ``True`` or ``{"partition_by": …, "retention_days": …, "snapshots": …}``: every
      version of every row in ``<table>_history`` (issue 61, docs/design/history-tables.md). Written
      by full loads, re-imports and the diff's apply so far; a job whose path writes none yet
      refuses the table, naming it.

``speed=SpeedLimits(…)`` (or the plain ``channels=``, ``byte_speed=``, ``record_speed=``,
    ``channel_byte_speed=``, ``channel_record_speed=``) — how fast the source is read, as DataX
    limits it:

    * ``channels``: shards read at once (source connections, Spark tasks on a cluster); unset
      (None): the operator's default, or, when a global limit is set, global ÷ per-channel limit;
    * ``byte`` / ``record``: global limits, bytes/s and records/s (the full load only), each
      needing its per-channel limit;
    * ``channel_byte`` / ``channel_record``: per-channel limits (the full load and the CDC
      bootstrap); the snapshot diff takes ``channels`` alone.

An object stands for its whole group: it is unpacked into the plain arguments when the operator
is built, so the job's spec is the same either way and ``template_fields`` render the values
(an object's strings may be Jinja templates too). A plain argument of the group given beside its
object with another value is refused (``ValueError`` naming the task and both arguments), as is a
field the operator does not take; the values themselves are checked where the plain arguments
are, when the job's spec is built.
"""

from __future__ import annotations

import inspect

from airflow_sync_provider.core.clickhouse.layout import Layout
from airflow_sync_provider.core.content.shaping import Content, HistorySettings
from airflow_sync_provider.core.selection import Selection, TableSelection
from airflow_sync_provider.core.source.planning import SpeedLimits

__all__ = ["Content", "Layout", "Selection", "SpeedLimits", "TableSelection", "layout_argument", "unpack"]

# SpeedLimits' fields → the operators' plain arguments
SPEED_ARGUMENTS = {"channels": "channels", "byte": "byte_speed", "record": "record_speed",
                   "channel_byte": "channel_byte_speed", "channel_record": "channel_record_speed"}
TYPES = {"selection": Selection, "speed": SpeedLimits, "content": Content}


def _plain(value):
    """A value in the plain arguments' form: tuples as lists, (name, value) pairs as a dict."""
    if isinstance(value, (tuple, list)):
        if value and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in value):
            return {k: v for k, v in value}
        return list(value)
    return value


def layout_argument(task, layout):
    """``layout=`` as the operator keeps it: a :class:`Layout` as its dict form (the options that
    differ from the mirror's; None for the mirror's), a dict (or None) as given."""
    if layout is None or isinstance(layout, dict):
        return layout
    if not isinstance(layout, Layout):
        raise ValueError(f"task {task.task_id}: layout= takes a Layout(…) or its dict form, not {layout!r}")
    return layout.to_dict() or None


def _content_arguments(content: Content) -> dict:
    history = content.history.to_dict() if isinstance(content.history, HistorySettings) else content.history
    return {"transform": _plain(content.transform) or None, "row_filter": content.row_filter or None,
            "on_delete": None if content.on_delete in (None, "", "delete") else content.on_delete,
            "history": history or None}


def _arguments(config) -> dict:
    """The plain arguments a config object stands for."""
    if isinstance(config, Selection):
        return config.arguments()
    if isinstance(config, SpeedLimits):
        return {SPEED_ARGUMENTS[field]: getattr(config, field) for field in SPEED_ARGUMENTS}
    return _content_arguments(config)


def _config(task, argument: str, value):
    """The object given as ``argument=``: itself, or built from its dict form."""
    kind = TYPES[argument]
    if isinstance(value, dict):
        try:
            return kind(**value)
        except TypeError as exc:
            raise ValueError(f"task {task.task_id}: {argument}={value!r}: {exc}; give {kind.__name__}(…)") from None
    if not isinstance(value, kind):
        raise ValueError(f"task {task.task_id}: {argument}= takes a {kind.__name__}(…) or its dict form, "
                         f"not {value!r}")
    return value


def _normal(name: str, value):
    """A plain value compared: empty is unset, the default delete rule and no history are unset, tuples
    are lists."""
    value = _plain(value)
    if value in (None, "", [], {}) or value is False or (name == "on_delete" and value == "delete"):
        return None
    return value


def _defaults(cls) -> dict:
    """The constructor arguments' defaults of ``cls`` and its bases (a subclass's over its bases':
    a DAG author's subclass taking ``**kwargs`` keeps the operator's)."""
    defaults: dict = {}
    for base in reversed(cls.__mro__):
        if "__init__" in vars(base):
            try:
                parameters = inspect.signature(base.__init__).parameters.values()
            except (TypeError, ValueError):
                continue
            defaults |= {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    return defaults


def unpack(task, objects: dict, plain: dict) -> dict:
    """``plain`` (the operator's plain arguments of the objects' settings, by name) with each config
    object of ``objects`` (``{"selection": …, "speed": …, "content": …}``, None: not given)
    unpacked over them. ``task``: the operator; its class's signature gives the defaults: a plain
    argument left at its default yields to the object, one given with another value than the
    object's is refused, naming the task and both arguments, as is a setting the operator does not
    take."""
    defaults = _defaults(type(task))
    out = dict(plain)
    for argument, given in objects.items():
        if given is None:
            continue
        config = _config(task, argument, given)
        for name, value in _arguments(config).items():
            if name not in plain:
                if _normal(name, value) is not None:
                    raise ValueError(f"task {task.task_id}: {type(task).__name__} takes no {name} (given in "
                                     f"{argument}={config!r})")
                continue
            if name == "channels" and value is None:  # unset: the operator's default (or derived from limits)
                value = defaults[name]
            if _normal(name, plain[name]) not in (_normal(name, defaults[name]), _normal(name, value)):
                raise ValueError(f"task {task.task_id}: {name}={plain[name]!r} and {argument}= disagree (its {name}: "
                                 f"{value!r}); give {name} in one of them")
            out[name] = value
    return out
