ALTER TABLE spans_local ON CLUSTER `tracedash` ADD INDEX IF NOT EXISTS idx_attr_keys mapKeys(attributes) TYPE bloom_filter(0.01) GRANULARITY 1;

ALTER TABLE spans_local ON CLUSTER `tracedash` ADD INDEX IF NOT EXISTS idx_attr_values mapValues(attributes) TYPE bloom_filter(0.01) GRANULARITY 1;

ALTER TABLE spans_local ON CLUSTER `tracedash` MATERIALIZE INDEX idx_attr_keys;

ALTER TABLE spans_local ON CLUSTER `tracedash` MATERIALIZE INDEX idx_attr_values;

