ALTER TABLE spans MODIFY COLUMN `status_message` String CODEC(ZSTD(1));

ALTER TABLE spans MODIFY COLUMN `attributes` Map(LowCardinality(String), String) CODEC(ZSTD(1));

ALTER TABLE spans MODIFY COLUMN `resource_attributes` Map(LowCardinality(String), String) CODEC(ZSTD(1));

ALTER TABLE spans MODIFY COLUMN `event_attributes` Array(Map(String, String)) CODEC(ZSTD(1));

