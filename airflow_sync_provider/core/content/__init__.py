"""What a copy holds: its columns' transforms (hash, mask, null, truncate, redact), a standing
row filter and what a delete at the source does to it (docs/content.md).

Each piece has one definition rendered twice: as the code that shapes rows (loads, bootstrap
chunks, binlog row images) and as MySQL SQL (the source side of every check), so a check
compares the shaped copy with the source shaped the same way.
"""


class ContentError(ValueError):
    retry_helps = False  # core/failures.py: the message names the table, column and setting to change
