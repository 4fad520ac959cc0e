CREATE TABLE IF NOT EXISTS schema_migrations ON CLUSTER `tracedash` (name String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/all/{database}/schema_migrations', '{replica}', applied_at) ORDER BY name;

