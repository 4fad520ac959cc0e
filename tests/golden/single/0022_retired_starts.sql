INSERT INTO traces_by_start (project_id, trace_id, start_time, version) SELECT project_id, trace_id, s, latest - 1 FROM ( SELECT project_id, trace_id, argMax(start_time, version) AS latest_start, max(version) AS latest, groupUniqArray(start_time) AS starts FROM traces_by_start GROUP BY project_id, trace_id HAVING length(starts) > 1) ARRAY JOIN starts AS s WHERE s != latest_start;

