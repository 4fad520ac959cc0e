DELETE FROM spans_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND start_time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM span_logs_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM resource_samples_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM engine_samples_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM scores_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM traces_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND start_time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM traces_by_start_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND start_time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM span_key_values_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND start_time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM rollup_minute_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM rollup_hour_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM rollup_6h_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM rollup_day_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM rollup_hour_all_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM rollup_6h_all_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM rollup_day_all_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM resource_minute_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM resource_hour_local ON CLUSTER `tracedash` WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

