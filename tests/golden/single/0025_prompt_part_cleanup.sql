ALTER TABLE spans MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE span_logs MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE resource_samples MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE engine_samples MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE scores MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE traces MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE traces_by_start MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_minute MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_hour MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_day MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_hour_all MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_day_all MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_6h MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_6h_all MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE rollup_dirty MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE task_watermarks MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE resource_minute MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE resource_hour MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE dim_keys MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE span_key_values MODIFY SETTING cleanup_delay_period = 5, max_cleanup_delay_period = 10;

