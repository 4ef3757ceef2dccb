"""The package's shape, read from its source (nothing is imported or run):

* no function of the package takes more than 7 parameters (the constructors of operators, sensors
  and triggers aside: Airflow's convention is keyword arguments mirrored as attributes, and a
  trigger is rebuilt by the triggerer from the keyword arguments its ``serialize()`` gives): a
  job's context lives on a run object whose steps are methods with a few arguments (docs/layout.md);
* no module is longer than 600 lines;
* nothing in the core below CDC imports ``core.cdc`` (positions and versions are the core's own,
  core/positions.py): only the Sync view's data (core/overview.py) looks at pipelines;
* the package's modules do not import each other in a circle (imports inside functions and
  ``importlib.import_module("…")`` count too);
* no module takes a private name (``_name``) from another module of the package;
* the parts of a pipeline run that are handed the run (DDL, verification, cascades) use only their
  view of it (spark/cdc_run.py);
* every function that writes rows into a table (``insert_arrow(``, ``ArrowInserts(``, ``INSERT INTO``,
  ``REPLACE``/``DROP``/``ATTACH PARTITION``, ``EXCHANGE TABLES``, ``RENAME TABLE``, ``ALTER TABLE …
  UPDATE|DELETE``, ``DELETE FROM``) is listed in :data:`WRITERS`, each as a writer to a copy that
  owes its history an event (issue 61: docs/design/history-tables.md §1, its row there), one that
  writes it, or not a writer to a copy (and why): a writer added later without being listed fails.

Each test names every offender at once. None is allowed: the last known ones were fixed by
issue 49, so a new one is fixed where it appears rather than listed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = "airflow_sync_provider"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
MAX_PARAMETERS = 7
MAX_LINES = 600
# Airflow's convention: an operator's, sensor's or trigger's constructor takes every parameter by keyword
WIDE_ALLOWED = ("operators/", "sensors/", "triggers/")
# outside core/cdc/, the modules that may look at pipelines: the Sync view's data (its pages; a copy's shape)
CDC_READERS = {"airflow_sync_provider.core.overview", "airflow_sync_provider.core.shape"}
# the modules handed a pipeline run, and the view of it each may use (spark/cdc_run.py)
RUN_VIEWS = {"spark/cdc_ddl.py": "DdlRun", "spark/cdc_verify.py": "VerifiedRun",
             "spark/cdc_cascades.py": "CascadingRun"}

# Every function of the package that writes rows into a table, by the statements it writes (what
# _row_writers finds), and what it is to a copy's history (issue 61; docs/design/history-tables.md:
# §1's table, "#n" its rows, and §3's structure test). OWES: it writes a copy and its history does
# not hear of it yet (a job asked for one refuses it, core/content/shaping.refuse_history, and a
# pipeline stops before such a write into a copy that keeps one: core/clickhouse/history.refuse_unwritten);
# WRITES: it writes the history too (a slice moves an entry here when its path writes history);
# NOT_A_COPY: it writes the ledger, MySQL, a working, staging, scratch or change-set table, or the
# history itself. A new writer is listed here in the same commit, its history decided.
OWES, WRITES, NOT_A_COPY = "owes history", "writes history", "not a copy"
WRITERS = {
    # CDC (§1 #1-#6, #8, #9, #11, #15, #18)
    # the copies' lanes and the history lane beside them (spark/cdc_history.py); #3's XA commits, which
    # reach it too, are refused for a copy with a history (core/cdc/binlog/reader._no_history) until slice 3
    "spark/cdc_stream.py:_write_lane": (WRITES, ("insert_arrow",), "#1, #3: binlog row changes, in-memory XA commits"),
    "core/cdc/staging.py:XaStaging.commit": (OWES, ("INSERT INTO",), "#2: a staged XA commit"),
    "spark/cdc_cascades.py:Cascading._write": (OWES, ("insert_arrow",), "#4: a foreign-key cascade"),
    "core/clickhouse/repairs.py:tombstone_older": (OWES, ("INSERT INTO",),
                                                   "#5 TRUNCATE, #9 snapshot deletes, #15 a slice repair's deletes"),
    "core/clickhouse/multisets.py:empty": (OWES, ("INSERT INTO",), "#5: TRUNCATE of a keyless copy"),
    "spark/cdc_ddl.py:follow_alter": (OWES, ("ALTER TABLE … UPDATE",), "#6: a merged copy's schema change"),
    "spark/cdc_bootstrap.py:BootstrapCopy.inserts": (OWES, ("ArrowInserts",),
                                                     "#8: a bootstrap's or re-copy's snapshot"),
    "spark/cdc_bootstrap.py:_drop_older": (OWES, ("DELETE FROM",), "#9: snapshot deletes of keys the source lost"),
    "core/clickhouse/multisets.py:drop_before": (OWES, ("DELETE FROM",), "#11: none for rows (the snapshot is the "
                                                                         "new baseline)"),
    "spark/cdc_slices.py:repair": (WRITES, ("ArrowInserts",), "#15: the rolling verification's slice repair "
                                                              "(a copy with a history: through a table beside it)"),
    "spark/cdc_group.py:_sources_removed": (OWES, ("DELETE FROM",), "#18: a source left the group"),
    # loads, repairs, diffs (§1 #10, #12-#14, #16, #17)
    # slice 4: a load's or a re-import's publish writes the history first (full_load._history_first)
    "core/clickhouse/publishing.py:_swap_in": (OWES, ("EXCHANGE TABLES", "RENAME TABLE"),
                                               "#10 a re-copy swapped in (a rekey rebases the history; still owed), "
                                               "#13 a load (its history first: spark/full_load.py:_history_first)"),
    "spark/full_load.py:FullLoadCopy.inserts": (WRITES, ("ArrowInserts",), "#12: a load's working table, "
                                                "history first: spark/full_load.py:_history_first when #13 publishes"),
    "spark/full_load.py:FullLoadCopy.clear": (WRITES, ("DELETE FROM",), "#12: a load's working table, "
                                              "history first: spark/full_load.py:_history_first when #13 publishes"),
    "core/clickhouse/publishing.py:copy_parts": (WRITES, ("INSERT INTO",), "#13 a load's shadow copy, #14 a repair, "
                                                 "#15 a slice repair (spark/cdc_slices.repair writes the history); "
                                                 "history first: spark/full_load.py:_history_first"),
    "core/clickhouse/publishing.py:publish_partitions": (WRITES, ("DROP PARTITION", "REPLACE PARTITION"),
                                                         "#13: a load by partitions; "
                                                         "history first: spark/full_load.py:_history_first"),
    "core/clickhouse/publishing.py:mark_kept": (WRITES, ("INSERT INTO",), "#13, #14: kept deletes of vanished keys; "
                                                "history first: spark/full_load.py:_history_first"),
    "core/clickhouse/repairs.py:publish_repair": (WRITES, ("DELETE FROM",), "#14: a repair of a full load's shards; "
                                                  "history first: spark/full_load.py:_history_first"),
    "core/clickhouse/multisets.py:Beside.write_differences": (OWES, ("INSERT INTO",),
                                                              "#16: a keyless copy's repair or diff"),
    "spark/diff_multiset.py:run_multiset_diff": (OWES, ("INSERT INTO",), "#16: a keyless diff (its change set)"),
    "spark/diff_shard.py:_write": (WRITES, ("insert_arrow",), "#17: a diff's changes applied (and its change set)"),
    # not copies
    "core/clickhouse/history.py:HistoryTable.insert": (NOT_A_COPY, ("insert_arrow",), "the history itself"),
    "core/clickhouse/history.py:HistoryTable.insert_select_sql": (NOT_A_COPY, ("INSERT INTO",), "the history itself"),
    "core/clickhouse/inserts.py:ArrowInserts._put": (NOT_A_COPY, ("INSERT INTO",),
                                                     "the streamed insert itself: who makes one is listed"),
    "core/clickhouse/multisets.py:Beside.fill": (NOT_A_COPY, ("ArrowInserts",), "a scratch table beside the copy"),
    "core/clickhouse/ddl.py:drop_shard": (NOT_A_COPY, ("DROP PARTITION",), "a load's working table"),
    "spark/diff.py:_prepare_changes": (NOT_A_COPY, ("DROP PARTITION", "EXCHANGE TABLES", "INSERT INTO"),
                                       "the diff's change-set table"),
    "core/cdc/checkpoints.py:Checkpoints.ensure": (NOT_A_COPY, ("INSERT INTO",), "the ledger"),
    "core/cdc/checkpoints.py:Checkpoints.forget_tables": (NOT_A_COPY, ("DELETE FROM",), "the ledger"),
    "core/cdc/servers.py:ServerEpochs._claim": (NOT_A_COPY, ("INSERT INTO",), "the ledger"),
    "core/cdc/ddl.py:probe_column": (NOT_A_COPY, ("INSERT INTO",), "MySQL: a temporary table"),
    "core/positions.py:snapshot_position": (NOT_A_COPY, ("INSERT INTO",), "MySQL: the snapshot's fence"),
}
_STATEMENTS = re.compile(r"\b(INSERT\s+INTO|REPLACE\s+PARTITION|DROP\s+PARTITION|ATTACH\s+PARTITION|EXCHANGE\s+TABLES|"
                         r"RENAME\s+TABLE|DELETE\s+FROM|ALTER\s+TABLE\b[^;]*?\b(?:UPDATE|DELETE)\b)", re.IGNORECASE)
_WRITER_CALLS = ("insert_arrow", "ArrowInserts")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> int:
    args = node.args
    count = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) + bool(args.vararg) + bool(args.kwarg)
    first = (args.posonlyargs + args.args)[:1]
    if in_class and first and first[0].arg in ("self", "cls"):
        count -= 1
    return count


def _long_signatures() -> dict[str, int]:
    """``file:function`` (methods as ``Class.method``) → parameters, for every function of the
    package taking more than MAX_PARAMETERS (``self`` / ``cls`` not counted), the constructors of
    operators, sensors and triggers aside."""
    found = {}

    def visit(node, prefix: str, in_class: bool, path: Path):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", True, path)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                count = _parameters(child, in_class)
                constructor = child.name == "__init__" and _relative(path).startswith(WIDE_ALLOWED)
                if count > MAX_PARAMETERS and not constructor:
                    found[f"{_relative(path)}:{prefix}{child.name}"] = count
                visit(child, f"{prefix}{child.name}.", False, path)
            else:
                visit(child, prefix, in_class, path)

    for path in sorted(ROOT.rglob("*.py")):
        visit(_tree(path), "", False, path)
    return found


def _long_modules() -> dict[str, int]:
    return {_relative(path): n for path in sorted(ROOT.rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_LINES}


def _imports_up() -> set[str]:
    """``importer -> module`` for each module outside core/cdc/ that imports a core.cdc module."""
    cdc = f"{PACKAGE}.core.cdc"
    return {f"{name} -> {module}" for name in MODULES
            if name.startswith(f"{PACKAGE}.core") and not name.startswith(cdc) and name not in CDC_READERS
            for module in _imports(name) if module == cdc or module.startswith(cdc + ".")}


def _resolve(module: str, level: int, importer: str) -> str:
    if not level:
        return module
    package = importer.split(".")
    if not MODULES[importer].name == "__init__.py":
        package = package[:-1]
    base = package[:len(package) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _imports(name: str) -> dict[str, set[str]]:
    """The package modules ``name`` imports → the names it takes from each (``*`` for a module
    imported whole), at any depth of its code."""
    out: dict[str, set[str]] = {}

    def add(module: str, what: str):
        if module in MODULES and module != name:
            out.setdefault(module, set()).add(what)

    for node in ast.walk(_tree(MODULES[name])):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, "*")
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, name)
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:  # a submodule
                    add(f"{base}.{alias.name}", "*")
                else:
                    add(base, alias.name)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            add(node.args[0].value, "*")
    return out


def _circles() -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan), each sorted."""
    graph = {name: sorted(_imports(name)) for name in MODULES}
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def connect(node: str):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for name in graph:
        if name not in index:
            connect(name)
    return groups


def _folder_imports() -> dict[str, dict[str, set[str]]]:
    """core's folders (``core.<folder>``) → the other core folders their modules import → which
    of their modules do."""
    def folder(name: str) -> str | None:
        parts = name.split(".")
        inside = parts[:2] == [PACKAGE, "core"] and len(parts) >= 3 and (ROOT / "core" / parts[2]).is_dir()
        return ".".join(parts[:3]) if inside else None

    out: dict[str, dict[str, set[str]]] = {}
    for name in MODULES:
        mine = folder(name)
        for module in _imports(name):
            theirs = folder(module)
            if mine and theirs and theirs != mine:
                out.setdefault(mine, {}).setdefault(theirs, set()).add(f"{name} -> {module}")
    return out


def _private_imports() -> set[str]:
    """``importer -> module._name`` for every private name one package module takes from another
    (``from module import _name``, or ``module._name`` on a module imported whole)."""
    found = set()
    for name, path in MODULES.items():
        whole = {}  # local name → package module imported whole
        tree = _tree(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(node.module or "", node.level, name)
                for alias in node.names:
                    if f"{base}.{alias.name}" in MODULES:
                        whole[alias.asname or alias.name] = f"{base}.{alias.name}"
                    elif base in MODULES and base != name and alias.name.startswith("_") \
                            and not alias.name.startswith("__"):
                        found.add(f"{name} -> {base}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in MODULES:
                        whole[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in whole
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                found.add(f"{name} -> {whole[node.value.id]}.{node.attr}")
    return found


def _view_members(tree: ast.Module, name: str) -> set[str]:
    """The names a Protocol class of spark/cdc_run.py declares, its bases' included."""
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    node, out = classes[name], set()
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            out.add(item.target.id)
        elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(item.name)
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            out |= _view_members(tree, base.id)
    return out


def _run_uses_outside_views() -> set[str]:
    """``module: run.<name>`` for each name a run's part uses that its view does not declare
    (``run`` a variable or ``self.run``)."""
    views = _tree(ROOT / "spark" / "cdc_run.py")
    found = set()
    for module, view in RUN_VIEWS.items():
        allowed = _view_members(views, view)
        for node in ast.walk(_tree(ROOT / module)):
            if not isinstance(node, ast.Attribute):
                continue
            holder = node.value
            is_run = (isinstance(holder, ast.Name) and holder.id == "run") or (
                isinstance(holder, ast.Attribute) and holder.attr == "run" and isinstance(holder.value, ast.Name)
                and holder.value.id == "self")
            if is_run and node.attr not in allowed:
                found.add(f"{module}: run.{node.attr} (not in {view})")
    return found


def _text(node) -> str | None:
    """A string expression's text (an f-string's values as ``{}``, ``+`` of strings joined), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else " {} " for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        if left is not None or right is not None:
            return (left or " {} ") + (right or " {} ")
    return None


def _statement(match: re.Match) -> str:
    words = match.group(1).split()
    return f"ALTER TABLE … {words[-1].upper()}" if words[0].upper() == "ALTER" else " ".join(words[:2]).upper()


def _row_writers() -> dict[str, tuple[str, ...]]:
    """``file:function`` (methods as ``Class.method``; ``<module>`` at the top) → the row-writing
    statements (:data:`_STATEMENTS`, in its strings, docstrings aside) and calls (:data:`_WRITER_CALLS`)
    it holds, sorted, for every function of the package holding one (a nested function is its own)."""
    found: dict[str, set] = {}

    def visit(node, name: str, path: Path) -> None:  # the module, a class or a function
        body = getattr(node, "body", [])
        doc = body[0].value if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            else None
        for child in ast.iter_child_nodes(node):
            scan(child, name, path, doc)

    def scan(node, name: str, path: Path, doc) -> None:
        if node is doc:
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            visit(node, f"{name}.{node.name}" if name else node.name, path)
            return
        where = f"{_relative(path)}:{name or '<module>'}"
        text = _text(node)
        if text is not None:
            for match in _STATEMENTS.finditer(text):
                found.setdefault(where, set()).add(_statement(match))
            return
        if isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if called in _WRITER_CALLS:
                found.setdefault(where, set()).add(called)
        for child in ast.iter_child_nodes(node):
            scan(child, name, path, doc)

    for path in MODULES.values():
        visit(_tree(path), "", path)
    return {where: tuple(sorted(kinds)) for where, kinds in found.items()}


def _unlisted_writers() -> list[str]:
    """Row writers not in :data:`WRITERS` as they are (new ones, or new statements in a listed one),
    and entries that no longer write (a writer moved or gone: the list says where each one is)."""
    found = _row_writers()
    listed = {where: tuple(sorted(kinds)) for where, (_, kinds, _) in WRITERS.items()}
    return sorted([f"{where}: writes {kinds}, listed as {listed.get(where, 'nothing')}"
                   for where, kinds in found.items() if listed.get(where) != kinds]
                  + [f"{where}: listed, writes nothing" for where in listed if where not in found])


def test_the_parts_of_a_pipeline_run_use_only_their_view_of_it():
    """The DDL follower, the verifier and the cascades are handed the whole run but typed by a
    narrow view (spark/cdc_run.py): what they reach for outside it is named here."""
    found = _run_uses_outside_views()
    assert not found, "uses outside the run's views (add them to spark/cdc_run.py, or pass what is needed): " + \
        ", ".join(sorted(found))


def test_no_module_is_longer_than_six_hundred_lines():
    found = _long_modules()
    assert not found, ("modules over 600 lines (split them by concern): "
                       + ", ".join(f"{k} ({v})" for k, v in sorted(found.items())))


def test_nothing_below_cdc_imports_it():
    found = _imports_up()
    assert not found, "core modules below CDC that import it: " + ", ".join(sorted(found))


def test_no_function_takes_more_than_seven_parameters():
    found = _long_signatures()
    assert not found, ("functions taking more than 7 parameters (put the job's context on a run object): "
                       + ", ".join(f"{k} ({v})" for k, v in sorted(found.items())))


def test_the_package_modules_import_each_other_in_no_circle():
    circles = _circles()
    assert not circles, "modules that import each other in a circle:\n" + "\n".join(
        " <-> ".join(c) + ": " + "; ".join(f"{a} imports {', '.join(sorted(_imports(a)[b]))} from {b}"
                                           for a in c for b in sorted(_imports(a)) if b in c)
        for c in circles)


def test_the_core_folders_import_each_other_in_no_circle():
    """core/source (MySQL), core/clickhouse, core/cdc, core/content, core/verify: a folder's
    modules may use another folder's, never both ways round (core/source never imports the
    ClickHouse side; the ClickHouse side writes what the source describes)."""
    folders = _folder_imports()
    both = sorted(f"{a} <-> {b}" for a in folders for b in folders[a] if a < b and a in folders.get(b, {}))
    assert not both, "core folders that import each other: " + "; ".join(
        f"{pair}: " + ", ".join(sorted(folders[pair.split(' <-> ')[0]][pair.split(' <-> ')[1]]
                                       | folders[pair.split(' <-> ')[1]][pair.split(' <-> ')[0]])) for pair in both)


def test_the_clickhouse_client_is_its_own_module():
    """A module that needs a connection (the ledger, the guard, the checkpoints, …) imports the
    client alone: the client's module takes nothing of the package but the endpoint."""
    client = f"{PACKAGE}.core.clickhouse.client"
    assert set(_imports(client)) <= {f"{PACKAGE}.core.endpoints"}, _imports(client)
    for name in (f"{PACKAGE}.core.ledger", f"{PACKAGE}.core.guard"):
        taken = {m for m in _imports(name) if m.startswith(f"{PACKAGE}.core.clickhouse")}
        assert taken <= {client}, f"{name} imports {sorted(taken)}"


def test_no_module_takes_a_private_name_from_another():
    found = _private_imports()
    assert not found, "private names used across modules (make them public or move them): " + ", ".join(
        sorted(found))


def test_every_writer_of_rows_is_listed_with_what_it_owes_a_copys_history():
    """Plan §3's structure test: a new writer (or a new statement in a listed one) fails here until
    it is listed, its history decided; slice 2: the CDC lanes write it, every other writer to a copy owes it."""
    assert _unlisted_writers() == []
    assert {status for status, _, _ in WRITERS.values()} <= {OWES, WRITES, NOT_A_COPY}
    assert all(note for _, _, note in WRITERS.values())
    # the plan's §1 rows that write rows, each with its writer (#7 is schema only)
    rows = {int(n) for status, _, note in WRITERS.values() if status != NOT_A_COPY
            for n in re.findall(r"#(\d+)", note)}
    assert rows == set(range(1, 19)) - {7}
    # a writer that writes a history calls it (slice 2: the CDC stream's lanes), or its note names
    # the caller that writes it first (slice 4: "history first: file:function", which calls it)
    calls_history = {where for where in WRITERS if "history" in _source_of(where)}
    first = {w: re.search(r"history first: (\S+:\w+)", note) for w, (_, _, note) in WRITERS.items()}
    calls_history |= {w for w, found in first.items() if found and "history" in _source_of(found.group(1))}
    assert {w for w, (status, _, _) in WRITERS.items() if status == WRITES} <= calls_history


def _source_of(where: str) -> str:
    """The source of ``file:Class.function``."""
    file, name = where.split(":")
    node = _tree(ROOT / file)
    for part in name.split("."):
        node = next(c for c in ast.iter_child_nodes(node)
                    if isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and c.name == part)
    return ast.unparse(node)


def test_the_checks_find_what_they_look_for(tmp_path, monkeypatch):
    """Mutation check: a planted long signature, circle and private import are each reported."""
    fake = tmp_path / PACKAGE
    (fake / "spark").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "spark" / "__init__.py").write_text("")
    (fake / "spark" / "a.py").write_text("from airflow_sync_provider.spark.b import _hidden\n"
                                         "def wide(a, b, c, d, e, f, g, h):\n    pass\n"
                                         "class K:\n    def ok(self, a, b, c, d, e, f, g):\n        pass\n")
    (fake / "spark" / "b.py").write_text("def _hidden():\n"
                                         "    import importlib\n"
                                         "    importlib.import_module('airflow_sync_provider.spark.a')\n")
    for folder, other in (("x", "y"), ("y", "x")):  # two core folders, each importing the other (no module circle)
        (fake / "core" / folder).mkdir(parents=True)
        (fake / "core" / folder / "__init__.py").write_text("")
        (fake / "core" / folder / "uses.py").write_text(f"from airflow_sync_provider.core.{other} import used\n")
        (fake / "core" / folder / "used.py").write_text("")
    (fake / "core" / "__init__.py").write_text("")
    (fake / "spark" / "cdc_run.py").write_text("class _Common:\n    spec: object\n"
                                                "class V(_Common):\n    def log(self, text): ...\n")
    (fake / "spark" / "v.py").write_text("class U:\n    def go(self):\n        self.run.log(self.run.spec)\n"
                                         "        return self.run.ch\n"
                                         "def f(run):\n    return run.state\n")
    monkeypatch.setitem(globals(), "RUN_VIEWS", {"spark/v.py": "V"})
    monkeypatch.setitem(globals(), "ROOT", fake)
    monkeypatch.setitem(globals(), "MODULES", _modules())
    assert set(_folder_imports()) == {f"{PACKAGE}.core.x", f"{PACKAGE}.core.y"}
    assert _long_signatures() == {"spark/a.py:wide": 8}
    assert _circles() == [["airflow_sync_provider.spark.a", "airflow_sync_provider.spark.b"]]
    assert _private_imports() == {"airflow_sync_provider.spark.a -> airflow_sync_provider.spark.b._hidden"}
    assert _run_uses_outside_views() == {"spark/v.py: run.ch (not in V)", "spark/v.py: run.state (not in V)"}
    (fake / "spark" / "w.py").write_text(
        'class Copy:\n    def put(self, ch, t):\n        """INSERT INTO nothing: a docstring."""\n'
        '        ch.insert_arrow(t, None)\n'
        '        ch.command(f"ALTER TABLE {t} " + "DELETE WHERE 1")\n'
        'def scratch(ch):\n    # INSERT INTO a comment\n    return ArrowInserts(ch)\n'
        'def plain(ch):\n    return "ALTER TABLE t ADD COLUMN c Int8"\n'
        'def outer(ch):\n    if ch:\n        def inner():\n            return "DELETE FROM t"\n')
    monkeypatch.setitem(globals(), "MODULES", _modules())
    assert _row_writers() == {"spark/w.py:Copy.put": ("ALTER TABLE … DELETE", "insert_arrow"),
                              "spark/w.py:scratch": ("ArrowInserts",), "spark/w.py:outer.inner": ("DELETE FROM",)}
    monkeypatch.setitem(globals(), "WRITERS", {"spark/w.py:scratch": (OWES, ("ArrowInserts",), "#8"),
                                               "spark/w.py:gone": (OWES, ("DELETE FROM",), "#9")})
    assert _unlisted_writers() == ["spark/w.py:Copy.put: writes ('ALTER TABLE … DELETE', 'insert_arrow'), listed as "
                                   "nothing", "spark/w.py:gone: listed, writes nothing",
                                   "spark/w.py:outer.inner: writes ('DELETE FROM',), listed as nothing"]
