"""Run a cluster's generated DDL on chdb, in a process of its own (chdb opens one data directory per
process), and use the resulting local + Distributed layout.

    python tests/support/cluster_layout.py PLAN.json DATA_DIR

PLAN.json: ``{"config": XML, "statements": [...], "inserts": {table: SQL with {settings}},
"tables": [...], "deletes": [...]}``. chdb is started with ``config`` (a cluster of one shard on this process, so the
Distributed tables run locally; no Keeper, hence the caller turns the Replicated engines into their
plain ones and drops ``ON CLUSTER``, which only a server's DDL worker runs). Everything else is the
generated DDL as it ships: the Distributed tables ``AS <name>_local``, every ALTER of the local and the
Distributed tables, the views over local tables, the backfills through the Distributed tables.

Then each table gets one row through its Distributed table, sent twice with the same
insert_deduplication_token (``distributed_foreground_insert = 1``, as the server backend does on a
cluster), and the retention DELETEs run on the local tables. Prints one JSON line:
``{"error": null | text, "counts": {table: rows through <table>}, "local": {table: rows in <table>_local},
"after_delete": {table: rows}}``.
"""

from __future__ import annotations

import json
import os
import sys


def main(plan_path: str, data_dir: str) -> int:
    import chdb

    plan = json.loads(open(plan_path).read())
    config = os.path.join(data_dir, "config.xml")
    with open(config, "w") as f:
        f.write(plan["config"])
    connection = chdb.connect(f"file:{os.path.join(data_dir, 'store')}?config-file={config}")
    cursor = connection.cursor()

    def run(sql: str):
        cursor.execute(sql)
        return cursor.fetchall()

    out = {"error": None, "counts": {}, "local": {}, "after_delete": {}}
    statement = ""
    try:
        run("CREATE DATABASE IF NOT EXISTS tracedash")
        run("USE tracedash")
        for statement in plan["statements"]:
            run(statement)
        for table, insert in plan["inserts"].items():
            statement = insert.format(settings="SETTINGS distributed_foreground_insert = 1, insert_deduplicate = 1, "
                                               f"insert_deduplication_token = 'batch-{table}'")
            run(statement)
            run(statement)  # a replayed batch
        for table in plan["tables"]:
            statement = f"SELECT count() FROM {table}"
            out["counts"][table] = run(statement)[0][0]
            statement = f"SELECT count() FROM {table}_local"
            out["local"][table] = run(statement)[0][0]
        for statement in plan["deletes"]:
            run(statement)
        for table in plan["tables"]:
            statement = f"SELECT count() FROM {table}"
            out["after_delete"][table] = run(statement)[0][0]
    except Exception as exc:  # reported to the test, with the statement that failed
        out["error"] = f"{exc}\n-- while running:\n{statement}"
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
