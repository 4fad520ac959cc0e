ALTER TABLE spans_local ON CLUSTER `tracedash` MODIFY SETTING merge_selector_base = 20;

