"""A parent table's row events, read for the cascades they cause (core/cdc/cascades.py).

A table some followed table references through an acting foreign key (core/cdc/foreign_keys.py)
is a *parent*: each of its row events that deletes a row or changes the referenced columns is a
:class:`~airflow_sync_provider.core.cdc.cascades.Trigger`. Whether the parent is followed or not,
its events are decoded by a route of its own (:attr:`ParentWatch.route`) that holds only the
referenced columns and is keyed by them, so the decoder's update path (core/cdc/rowimage.py)
reads an old image only as far as those columns and makes a tombstone exactly when they changed.
A followed parent whose copy's route already decodes its events that way (its key holds the
referenced columns, no row filter drops events) lends its own row changes instead: nothing is
decoded twice, and its updates that leave the key alone cost one look at a flag.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from airflow_sync_provider.core.cdc.binlog.routes import KEPT_FROM, TableRoute
from airflow_sync_provider.core.cdc.cascades import Trigger
from airflow_sync_provider.core.cdc.tables import PipelineTable
from airflow_sync_provider.core.source.schema import TableSchema


@dataclass
class ParentWatch:
    """One parent table: ``columns``, the referenced columns its triggers carry (in the plan's
    order); ``route``, the decoding route keyed by them; ``lends``, whether the followed route's
    row changes can be read instead (for events the followed route does not skip)."""

    name: str
    columns: tuple[str, ...]
    route: TableRoute
    lends: bool = False

    @classmethod
    def of(cls, schema: TableSchema, columns: tuple[str, ...], followed: TableRoute | None) -> ParentWatch:
        """``schema``: the parent's as the binlog has it now (the followed route's, when it is followed)."""
        by_name = {c.name: c for c in schema.columns}
        missing = [c for c in columns if c not in by_name]
        if missing:
            raise KeyError(f"table {schema.qualified} has no column(s) {missing} that its foreign keys reference")
        own = dataclasses.replace(schema, columns=tuple(by_name[c] for c in columns), primary_key=tuple(columns),
                                  indexes=())
        route = TableRoute(own, "", "", PipelineTable(schema.database, schema.table, columns=list(columns)))
        lends = (followed is not None and followed.row_filter is None and not followed.virtual
                 and set(columns) <= set(followed.key))
        return cls(schema.qualified, tuple(columns), route, lends)

    def places(self, route: TableRoute) -> list[int]:
        return [route.names.index(c) for c in self.columns]


def triggers_of(items: list, at: list[int], parent: str, committed: int) -> list[Trigger]:
    """The triggers among a rows event's changes as the reader makes them (route, lane, row,
    version, flag): an old image (a tombstone, or a kept delete's commit time) followed by a live
    row of the same version is an update of the key; an old image alone, a delete. ``at``: where
    the referenced columns are in a row."""
    found, old = [], None
    for item in items:
        flag = item[4]
        if flag is True or (flag is not False and flag >= KEPT_FROM):  # an old image
            if old is not None:
                found.append(Trigger(parent, old[0], old[1], None, committed))
            old = (item[3], tuple(item[2][i] for i in at))
        elif old is not None:
            new = tuple(item[2][i] for i in at)
            if item[3] != old[0]:
                found.append(Trigger(parent, old[0], old[1], None, committed))
            elif new != old[1]:
                found.append(Trigger(parent, old[0], old[1], new, committed))
            old = None
    if old is not None:
        found.append(Trigger(parent, old[0], old[1], None, committed))
    return found
