ALTER TABLE spans ADD COLUMN IF NOT EXISTS `phase_fallback` UInt8 AFTER phase;

