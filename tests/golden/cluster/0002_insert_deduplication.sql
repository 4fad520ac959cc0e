ALTER TABLE spans_local ON CLUSTER `tracedash` MODIFY SETTING replicated_deduplication_window = 10000, replicated_deduplication_window_seconds = 604800;

ALTER TABLE resource_samples_local ON CLUSTER `tracedash` MODIFY SETTING replicated_deduplication_window = 10000, replicated_deduplication_window_seconds = 604800;

