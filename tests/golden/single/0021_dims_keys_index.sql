ALTER TABLE spans ADD INDEX IF NOT EXISTS idx_dims_keys dims.keys TYPE bloom_filter(0.01) GRANULARITY 1;

ALTER TABLE spans MATERIALIZE INDEX idx_dims_keys;

