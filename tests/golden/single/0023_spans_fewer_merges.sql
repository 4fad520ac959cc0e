ALTER TABLE spans MODIFY SETTING merge_selector_base = 20;

