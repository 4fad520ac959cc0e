ALTER TABLE spans_local ON CLUSTER `tracedash` MODIFY COLUMN `input_tokens` Nullable(UInt32) CODEC(ZSTD(1)), MODIFY COLUMN `output_tokens` Nullable(UInt32) CODEC(ZSTD(1));

ALTER TABLE spans ON CLUSTER `tracedash` MODIFY COLUMN `input_tokens` Nullable(UInt32) CODEC(ZSTD(1)), MODIFY COLUMN `output_tokens` Nullable(UInt32) CODEC(ZSTD(1));

