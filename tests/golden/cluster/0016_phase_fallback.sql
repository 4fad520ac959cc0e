ALTER TABLE spans_local ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `phase_fallback` UInt8 AFTER phase;

ALTER TABLE spans ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `phase_fallback` UInt8 AFTER phase;

