ALTER TABLE spans_local ON CLUSTER `tracedash` MODIFY COLUMN `status_message` String CODEC(ZSTD(1));

ALTER TABLE spans_local ON CLUSTER `tracedash` MODIFY COLUMN `attributes` Map(LowCardinality(String), String) CODEC(ZSTD(1));

ALTER TABLE spans_local ON CLUSTER `tracedash` MODIFY COLUMN `resource_attributes` Map(LowCardinality(String), String) CODEC(ZSTD(1));

ALTER TABLE spans_local ON CLUSTER `tracedash` MODIFY COLUMN `event_attributes` Array(Map(String, String)) CODEC(ZSTD(1));

