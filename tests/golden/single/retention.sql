DELETE FROM spans WHERE project_id = {project_id:UInt64} AND start_time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM span_logs WHERE project_id = {project_id:UInt64} AND time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM resource_samples WHERE project_id = {project_id:UInt64} AND time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM engine_samples WHERE project_id = {project_id:UInt64} AND time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM scores WHERE project_id = {project_id:UInt64} AND time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM traces WHERE project_id = {project_id:UInt64} AND start_time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM traces_by_start WHERE project_id = {project_id:UInt64} AND start_time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM span_key_values WHERE project_id = {project_id:UInt64} AND start_time < fromUnixTimestamp64Nano({cutoff:Int64}, 'UTC');

DELETE FROM rollup_minute WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM rollup_hour WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM rollup_6h WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM rollup_day WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM rollup_hour_all WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM rollup_6h_all WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM rollup_day_all WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM resource_minute WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

DELETE FROM resource_hour WHERE project_id = {project_id:UInt64} AND bucket < toDateTime(intDiv({cutoff:Int64}, 1000000000), 'UTC');

