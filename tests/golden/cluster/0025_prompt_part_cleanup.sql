ALTER TABLE spans_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE span_logs_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE resource_samples_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE engine_samples_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE scores_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE traces_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE traces_by_start_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_minute_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_hour_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_day_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_hour_all_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_day_all_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_6h_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_6h_all_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_dirty_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE task_watermarks_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE resource_minute_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE resource_hour_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE dim_keys_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE span_key_values_local ON CLUSTER `tracedash` MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

