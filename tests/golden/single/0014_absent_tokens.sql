ALTER TABLE spans MODIFY COLUMN `input_tokens` Nullable(UInt32) CODEC(ZSTD(1)), MODIFY COLUMN `output_tokens` Nullable(UInt32) CODEC(ZSTD(1));

