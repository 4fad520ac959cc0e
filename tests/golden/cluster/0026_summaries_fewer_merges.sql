ALTER TABLE traces_local ON CLUSTER `tracedash` MODIFY SETTING merge_selector_base = 20;

ALTER TABLE traces_by_start_local ON CLUSTER `tracedash` MODIFY SETTING merge_selector_base = 20;

