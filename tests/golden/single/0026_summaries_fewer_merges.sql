ALTER TABLE traces MODIFY SETTING merge_selector_base = 20;

ALTER TABLE traces_by_start MODIFY SETTING merge_selector_base = 20;

