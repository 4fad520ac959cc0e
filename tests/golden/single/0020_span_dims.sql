ALTER TABLE spans ADD COLUMN IF NOT EXISTS `dims` Map(LowCardinality(String), String) DEFAULT mapUpdate(mapFilter((k, v) -> v != '' AND length(v) <= 256, resource_attributes), mapFilter((k, v) -> v != '' AND length(v) <= 256, attributes)) CODEC(ZSTD(1));

