"""Retired starts in ``traces_by_start``, so that readers take each trace's latest summary with
``FINAL`` instead of sorting the window's rows by version.

``traces_by_start`` is ordered by start, so a summary whose start moved (a longer root arrived
later, a root after its children) left its older row behind under the old start. Readers used to
pick each trace's newest row among those within an hour of their window (``ORDER BY version DESC
LIMIT 1 BY trace_id``: a sort of every row of the window; on 10 M spans 620 ms of a 30-day read).
From now on the summariser writes, under the old start, a row with no spans one version below the
summary that moved it (analytics.summarizer.starts_retire): it replaces the old row under FINAL,
and readers skip it (``span_count > 0``). This migration writes those rows for the summaries stored
before: every start of a trace but its latest summary's.

It reads the keys of the whole table once (one aggregation over every trace: on a very large store,
run it when the server has memory to spare)."""


def statements(ctx):
    return [
        "INSERT INTO traces_by_start (project_id, trace_id, start_time, version)"
        " SELECT project_id, trace_id, s, latest - 1 FROM ("
        " SELECT project_id, trace_id, argMax(start_time, version) AS latest_start, max(version) AS latest,"
        " groupUniqArray(start_time) AS starts FROM traces_by_start"
        " GROUP BY project_id, trace_id HAVING length(starts) > 1"
        ") ARRAY JOIN starts AS s WHERE s != latest_start"
    ]
